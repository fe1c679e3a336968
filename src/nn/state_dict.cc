// Loading a module tree from a StateDictSource through a checkpoint-key mapping.
//
// All checks (missing, unexpected, duplicate after mapping, shape) run before any tensor is copied,
// so a failed load leaves the tree as it was. Dtype conversion happens on the CPU before the move
// to the target device. It deliberately does not transform tensors (concatenate, transpose):
// layouts that need that supply their own source wrapper.
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

}  // namespace

void load_state_dict(Module& root, const StateDictSource& source, const LoadStateOptions& options) {
  std::map<std::string, Parameter*> wanted, tied;
  for (auto& [path, p] : root.named_parameters()) {
    if (!p->tied_to.empty())
      tied.emplace(path, p);
    else if (p->persistent)
      wanted.emplace(path, p);
  }

  std::map<std::string, std::string> found;  // model path -> checkpoint key
  std::vector<std::string> unexpected;
  for (const std::string& key : source.keys()) {
    std::optional<std::string> mapped = options.key_mapping ? options.key_mapping(key) : key;
    if (!mapped) continue;
    if (wanted.count(*mapped)) {
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
  for (const auto& [path, p] : wanted)
    if (!found.count(path)) missing.push_back(path);
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

  for (const auto& [path, key] : found)
    wanted.at(path)->value = source.load(key, options.device, options.dtype, options.stream);
  resolve_ties(root);
}

}  // namespace hk::nn
