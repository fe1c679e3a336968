// Loading a module tree from a StateDictSource through a checkpoint-key mapping, and the transform
// step of kernel layouts.
//
// All checks (missing, unexpected, duplicate after mapping, shape) run before any tensor is copied,
// so a failed load leaves the tree as it was. Dtype conversion happens on the CPU before the move
// to the target device. A parameter declared with a `source` (a kernel layout's conversion, see
// hk/module.h) is assembled from those checkpoint keys: a rename loads the one tensor; a
// concatenation allocates the parameter once and writes each source into its slice; a transpose
// writes the source into the transposed view of the parameter — so the weights exist once, as
// in an unfused load. The key mapping applies first; source keys name mapped keys. On CUDA the
// weights (and biases) of sibling Linears — a module's SharedInput children — are stored as
// adjacent rows of one allocation (nn::forward_linears may then run them as one product).
#include <algorithm>
#include <map>
#include <set>

#include "hk/error.h"
#include "hk/module.h"
#include "hk/ops.h"

namespace hk::nn {

std::vector<std::string> TensorMapSource::keys() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : tensors_) out.push_back(k);
  return out;
}

const Tensor& TensorMapSource::at(const std::string& key) const {
  auto it = tensors_.find(key);
  if (it == tensors_.end()) throw NotFound("tensor '" + key + "' is not in " + description_);
  return it->second;
}

Shape TensorMapSource::shape(const std::string& key) const {
  return at(key).sizes();
}

DType TensorMapSource::dtype_of(const std::string& key) const {
  return at(key).dtype();
}

Tensor TensorMapSource::load(const std::string& key, Device device, std::optional<DType> dtype,
                             Stream stream) const {
  Tensor t = at(key);
  if (dtype && is_floating(t.dtype()) && *dtype != t.dtype()) {
    Tensor converted = Tensor::empty(t.sizes(), *dtype, t.device(), stream);
    ops::cast(t, converted, stream);
    t = converted;
  } else {
    t = t.clone(stream);
  }
  return t.device() == device ? t : t.to(device, stream);
}

void StateDictSource::load_into(const std::string& key, const TensorView& dst,
                                Stream stream) const {
  const Tensor t = load(key, dst.device, dst.dtype, stream);
  if (t.dtype() != dst.dtype)
    throw InvalidArgument("tensor '" + key + "' in " + describe() + " is " + dtype_name(t.dtype()) +
                          " and cannot be loaded into a " + dtype_name(dst.dtype) + " parameter");
  copy_view(dst, t.view(), stream);
}

DType StateDictSource::dtype_of(const std::string& key) const {
  return load(key, Device::cpu(), std::nullopt, {}).dtype();
}

namespace {

std::string list_names(const std::vector<std::string>& names, size_t first = 5) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < first; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > first) out += ", ... (" + std::to_string(names.size()) + " in total)";
  return out;
}

bool has_suffix(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The shape a layout's conversion makes from its sources' shapes, or a sentence saying why the
// sources do not fit it.
Shape converted_shape(const ParameterSource& src, const std::vector<Shape>& shapes,
                      std::string& why) {
  switch (src.op) {
    case ParameterSource::Op::Rename:
      if (shapes.size() != 1) why = "a rename takes one source";
      return shapes.empty() ? Shape{} : shapes[0];
    case ParameterSource::Op::Transpose:
      if (shapes.size() != 1 || shapes[0].size() != 2) {
        why = "a transpose takes one 2-D source";
        return {};
      }
      return {shapes[0][1], shapes[0][0]};
    case ParameterSource::Op::Concat: {
      if (shapes.empty()) {
        why = "a concatenation needs sources";
        return {};
      }
      Shape out = shapes[0];
      if (src.dim < 0 || src.dim >= static_cast<int>(out.size())) {
        why = "concatenation dim " + std::to_string(src.dim) + " is outside the sources' rank";
        return {};
      }
      for (size_t i = 1; i < shapes.size(); ++i) {
        bool fits = shapes[i].size() == out.size();
        for (size_t d = 0; fits && d < out.size(); ++d)
          fits = static_cast<int>(d) == src.dim || shapes[i][d] == out[d];
        if (!fits) {
          why = "sources " + shape_str(shapes[0]) + " and " + shape_str(shapes[i]) +
                " differ outside the concatenation dim " + std::to_string(src.dim);
          return {};
        }
        out[static_cast<size_t>(src.dim)] += shapes[i][static_cast<size_t>(src.dim)];
      }
      return out;
    }
  }
  return {};
}

// The dtype `key` is loaded as: the checkpoint's, or options.dtype for floating tensors.
DType load_dtype(const StateDictSource& source, const std::string& key,
                 const LoadStateOptions& options) {
  const DType d = source.dtype_of(key);
  return options.dtype && is_floating(d) ? *options.dtype : d;
}

// Sibling Linears that read one input (a module's SharedInput children: q/k/v, gate/up) get
// their weights, and their biases, as adjacent rows of one allocation, so a caller may run them
// as one product (nn::forward_linears) — the same bytes as separate loads. Only siblings loaded
// plainly from the checkpoint (`found`: parameter path -> key) with one dtype and equal trailing
// dims; returns the paths it loaded. Used on CUDA only: on the CPU a source may hand out
// zero-copy views of the checkpoint file.
std::set<std::string> load_siblings_adjacently(Module& root, const StateDictSource& source,
                                               const LoadStateOptions& options,
                                               const std::map<std::string, std::string>& found,
                                               const std::map<std::string, Parameter*>& wanted) {
  std::set<std::string> loaded;
  for (auto& [mpath, module] : root.named_modules()) {
    for (const Module::ChildFlow& flow : module->child_flows()) {
      if (flow.kind != Module::ChildFlow::Kind::SharedInput || flow.children.size() < 2) continue;
      for (const char* leaf : {"weight", "bias"}) {
        std::vector<std::string> paths;
        for (const std::string& child : flow.children)
          paths.push_back((mpath.empty() ? "" : mpath + ".") + child + "." + leaf);
        bool ok = found.count(paths[0]) && !loaded.count(paths[0]);
        const DType dtype = ok ? load_dtype(source, found.at(paths[0]), options) : DType::F32;
        const Shape s0 = ok ? wanted.at(paths[0])->shape : Shape{};
        int64_t rows = 0;
        for (size_t i = 0; ok && i < paths.size(); ++i) {
          ok = found.count(paths[i]) && !loaded.count(paths[i]);
          if (!ok) break;
          const Shape& s = wanted.at(paths[i])->shape;
          ok = !s.empty() && s.size() == s0.size() &&
               load_dtype(source, found.at(paths[i]), options) == dtype &&
               std::equal(s.begin() + 1, s.end(), s0.begin() + 1);
          rows += ok ? s[0] : 0;
        }
        if (!ok) continue;
        Shape shape = s0;
        shape[0] = rows;
        Tensor all = Tensor::empty(shape, dtype, options.device, options.stream);
        int64_t offset = 0;
        for (const std::string& path : paths) {
          const int64_t n = wanted.at(path)->shape[0];
          Tensor part = all.slice(0, offset, offset + n);
          source.load_into(found.at(path), part.view(), options.stream);
          wanted.at(path)->value = part;
          loaded.insert(path);
          offset += n;
        }
      }
    }
  }
  return loaded;
}

}  // namespace

void load_state_dict(Module& root, const StateDictSource& source, const LoadStateOptions& options) {
  std::map<std::string, Parameter*> wanted, tied;
  std::map<std::string, std::string> source_key_users;  // a layout's source key -> its parameter
  for (auto& [path, p] : root.named_parameters()) {
    if (!p->tied_to.empty()) {
      tied.emplace(path, p);
    } else if (p->persistent) {
      wanted.emplace(path, p);
      if (p->source)
        for (const std::string& k : p->source->keys) {
          auto [it, inserted] = source_key_users.emplace(k, path);
          if (!inserted)
            throw InvalidArgument("parameters '" + it->second + "' and '" + path +
                                  "' are both made from checkpoint tensor '" + k +
                                  "' (two kernel layouts claim it)");
        }
    }
  }

  std::map<std::string, std::string> found;        // model path -> checkpoint key
  std::map<std::string, std::string> source_keys;  // mapped source key -> checkpoint key
  std::vector<std::string> unexpected;
  for (const std::string& key : source.keys()) {
    std::optional<std::string> mapped = options.key_mapping ? options.key_mapping(key) : key;
    if (!mapped) continue;
    if (source_key_users.count(*mapped)) {
      auto [it, inserted] = source_keys.emplace(*mapped, key);
      if (!inserted)
        throw InvalidArgument("checkpoint keys '" + it->second + "' and '" + key +
                              "' both map to '" + *mapped + "' in " + source.describe());
      continue;
    }
    if (wanted.count(*mapped) && !wanted.at(*mapped)->source) {
      auto [it, inserted] = found.emplace(*mapped, key);
      if (!inserted)
        throw InvalidArgument("checkpoint keys '" + it->second + "' and '" + key +
                              "' both map to parameter '" + *mapped + "' in " + source.describe());
      continue;
    }
    if (tied.count(*mapped)) continue;  // tied weights are shared, a stored copy is redundant
    bool ignored = false;
    for (const auto& suffix : options.ignore_unexpected_suffixes)
      ignored = ignored || has_suffix(*mapped, suffix);
    if (!ignored) unexpected.push_back(*mapped == key ? key : key + " (as " + *mapped + ")");
  }

  std::vector<std::string> missing;
  for (const auto& [path, p] : wanted) {
    if (!p->source) {
      if (!found.count(path)) missing.push_back(path);
      continue;
    }
    for (const std::string& k : p->source->keys)
      if (!source_keys.count(k)) missing.push_back(k + " (for the kernel layout's " + path + ")");
  }
  if (!missing.empty())
    throw InvalidArgument(std::to_string(missing.size()) +
                          " tensor(s) the model needs are missing from " + source.describe() +
                          ": " + list_names(missing) +
                          "; the checkpoint does not match this model's config");
  if (!unexpected.empty())
    throw InvalidArgument(std::to_string(unexpected.size()) + " tensor(s) in " + source.describe() +
                          " do not belong to the model: " + list_names(unexpected) +
                          "; the checkpoint does not match this model's config");

  for (const auto& [path, key] : found) {
    Shape shape = source.shape(key);
    const Parameter& p = *wanted.at(path);
    if (shape != p.shape)
      throw InvalidArgument("tensor '" + key + "' in " + source.describe() + " has shape " +
                            shape_str(shape) + " but the model expects " + shape_str(p.shape) +
                            " for " + path + "; the checkpoint does not match config.json");
  }
  for (const auto& [path, p] : wanted) {
    if (!p->source) continue;
    std::vector<Shape> shapes;
    std::string keys;
    for (const std::string& k : p->source->keys) {
      shapes.push_back(source.shape(source_keys.at(k)));
      keys += (keys.empty() ? "" : ", ") + k + " " + shape_str(shapes.back());
    }
    std::string why;
    const Shape made = converted_shape(*p->source, shapes, why);
    if (why.empty() && made != p->shape)
      why = "they make " + shape_str(made) + " where the layout declares " + shape_str(p->shape);
    if (!why.empty())
      throw InvalidArgument("the kernel layout's parameter " + path + " cannot be made from " +
                            keys + " in " + source.describe() + ": " + why);
  }

  const std::set<std::string> loaded =
      options.device.is_cuda() ? load_siblings_adjacently(root, source, options, found, wanted)
                               : std::set<std::string>{};
  for (const auto& [path, key] : found)
    if (!loaded.count(path))
      wanted.at(path)->value = source.load(key, options.device, options.dtype, options.stream);
  for (const auto& [path, p] : wanted) {
    if (!p->source) continue;
    const ParameterSource& conv = *p->source;
    const std::string& first = source_keys.at(conv.keys.front());
    if (conv.op == ParameterSource::Op::Rename) {
      p->value = source.load(first, options.device, options.dtype, options.stream);
      continue;
    }
    const DType dtype = load_dtype(source, first, options);
    Tensor value = Tensor::empty(p->shape, dtype, options.device, options.stream);
    if (conv.op == ParameterSource::Op::Transpose) {
      source.load_into(first, value.view().transpose(0, 1), options.stream);
    } else {
      int64_t offset = 0;
      for (const std::string& k : conv.keys) {
        const std::string& ck = source_keys.at(k);
        const int64_t n = source.shape(ck)[static_cast<size_t>(conv.dim)];
        source.load_into(ck, value.view().slice(conv.dim, offset, offset + n), options.stream);
        offset += n;
      }
    }
    p->value = value;
  }
  resolve_ties(root);
}

}  // namespace hk::nn
