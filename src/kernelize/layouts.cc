// Kernel layouts put in place of modules' parameters, and taken back out (see layouts.h).
#include "kernelize/layouts.h"

#include <algorithm>
#include <map>
#include <set>

#include "hk/error.h"

namespace hk::kernel_binding {
namespace {

constexpr uint32_t kMaxLayoutParameters = 64;  // a sanity bound on what a library declares

// Where a dotted name under `scope` lives: the deepest existing module along it, and the rest.
struct Location {
  nn::Module* owner = nullptr;
  std::string local;
  std::string owner_path;  // relative to the scope ("" = the scope itself)
};
Location locate(nn::Module& scope, const std::string& name) {
  Location at{&scope, name, ""};
  for (;;) {
    const auto dot = at.local.find('.');
    if (dot == std::string::npos) return at;
    nn::Module* child = at.owner->find_module(at.local.substr(0, dot));
    if (!child) return at;
    at.owner_path += (at.owner_path.empty() ? "" : ".") + at.local.substr(0, dot);
    at.owner = child;
    at.local = at.local.substr(dot + 1);
  }
}

std::string join_path(const std::string& a, const std::string& b) {
  return a.empty() ? b : b.empty() ? a : a + "." + b;
}

nn::ParameterSource::Op source_op(uint32_t op) {
  return op == HK_CONVERT_CONCAT      ? nn::ParameterSource::Op::Concat
         : op == HK_CONVERT_TRANSPOSE ? nn::ParameterSource::Op::Transpose
                                      : nn::ParameterSource::Op::Rename;
}

// The shape a conversion makes from its sources' declared shapes, or why it cannot.
Shape made_shape(const LayoutConversion& c, const std::vector<Shape>& shapes, std::string& why) {
  if (c.op == HK_CONVERT_RENAME) return shapes[0];
  if (c.op == HK_CONVERT_TRANSPOSE) {
    if (shapes[0].size() != 2) {
      why = "a transpose needs a 2-D source, got " + shape_str(shapes[0]);
      return {};
    }
    return {shapes[0][1], shapes[0][0]};
  }
  Shape out = shapes[0];
  if (c.dim < 0 || c.dim >= static_cast<int>(out.size())) {
    why = "concatenation dim " + std::to_string(c.dim) + " is outside the sources' rank";
    return {};
  }
  const size_t d = static_cast<size_t>(c.dim);
  for (size_t i = 1; i < shapes.size(); ++i) {
    bool fits = shapes[i].size() == out.size();
    for (size_t k = 0; fits && k < out.size(); ++k) fits = k == d || shapes[i][k] == out[k];
    if (!fits) {
      why = "sources " + shape_str(shapes[0]) + " and " + shape_str(shapes[i]) +
            " differ outside the concatenation dim";
      return {};
    }
    out[d] += shapes[i][d];
  }
  return out;
}

// What kernelize keeps on each replaced module: enough to give the originals back.
struct LayoutRecord final : nn::Module::LayoutState {
  std::string key;
  std::vector<nn::Module*> members;
  struct Original {  // a parameter the layout took out
    nn::Module* owner;
    std::string name;
    nn::Parameter slot;  // value released while the layout holds the weights
  };
  std::vector<Original> originals;
  struct Made {  // a parameter the layout put in, and what it was made from (indices in originals)
    nn::Module* owner;
    std::string name;
    uint32_t op;
    int dim;
    std::vector<size_t> sources;
  };
  std::vector<Made> made;
  ParamRefs parameters;
};

}  // namespace

const LayoutConversion* LayoutSpec::conversion_of(const std::string& parameter) const {
  for (const LayoutConversion& c : conversions)
    if (c.target == parameter) return &c;
  return nullptr;
}

std::string LayoutSpec::content() const {
  std::string out;
  for (const std::string& p : parameters) {
    out += p;
    if (const LayoutConversion* c = conversion_of(p)) {
      out += "=" + std::to_string(c->op) + "/" + std::to_string(c->dim) + "(";
      for (const std::string& s : c->sources) out += s + ",";
      out += ")";
    }
    out += ";";
  }
  return out;
}

std::optional<LayoutSpec> read_layout(const hk_layout& raw, std::string& why) {
  const std::string name = raw.name ? raw.name : "";
  auto bad = [&](const std::string& what) {
    why =
        "its layout " + (name.empty() ? std::string("(unnamed)") : name) + " is malformed: " + what;
    return std::nullopt;
  };
  if (name.empty()) return bad("no name");
  if (raw.num_parameters > kMaxLayoutParameters || raw.num_conversions > kMaxLayoutParameters)
    return bad("more than " + std::to_string(kMaxLayoutParameters) + " parameters or conversions");
  if ((raw.num_parameters && !raw.parameters) || (raw.num_conversions && !raw.conversions))
    return bad("a null parameter or conversion table");
  LayoutSpec spec;
  spec.name = name;
  std::set<std::string> seen;
  for (uint32_t i = 0; i < raw.num_parameters; ++i) {
    if (!raw.parameters[i] || !*raw.parameters[i]) return bad("an empty parameter name");
    if (!seen.insert(raw.parameters[i]).second)
      return bad(std::string("parameter ") + raw.parameters[i] + " listed twice");
    spec.parameters.emplace_back(raw.parameters[i]);
  }
  std::set<std::string> converted;
  for (uint32_t i = 0; i < raw.num_conversions; ++i) {
    const hk_conversion& c = raw.conversions[i];
    if (!c.target || !seen.count(c.target))
      return bad("a conversion for a parameter it does not list");
    if (!converted.insert(c.target).second)
      return bad(std::string("two conversions for ") + c.target);
    if (c.op != HK_CONVERT_RENAME && c.op != HK_CONVERT_CONCAT && c.op != HK_CONVERT_TRANSPOSE)
      return bad("unknown conversion op " + std::to_string(c.op) + " for " + c.target);
    if (c.num_sources == 0 || c.num_sources > kMaxLayoutParameters || !c.sources)
      return bad(std::string("no sources for ") + c.target);
    if (c.op != HK_CONVERT_CONCAT && c.num_sources != 1)
      return bad(std::string("a rename or transpose takes one source (") + c.target + ")");
    LayoutConversion conv;
    conv.target = c.target;
    conv.op = c.op;
    conv.dim = c.dim;
    for (uint32_t s = 0; s < c.num_sources; ++s) {
      if (!c.sources[s] || !*c.sources[s])
        return bad(std::string("an empty source of ") + c.target);
      conv.sources.emplace_back(c.sources[s]);
    }
    spec.conversions.push_back(std::move(conv));
  }
  return spec;
}

std::string check_layout(const LayoutSpec& layout, nn::Module& root, nn::Module& scope,
                         const std::vector<nn::Module*>& members) {
  const std::string what = "layout " + layout.name;
  // Every parameter path under the members (relative to the scope), and the tie targets.
  std::set<const nn::Module*> member_modules;
  for (nn::Module* m : members)
    for (auto& [path, module] : m->named_modules()) member_modules.insert(module);
  std::set<std::string> tie_targets;
  for (auto& [path, p] : root.named_parameters())
    if (!p->tied_to.empty()) tie_targets.insert(p->tied_to);
  std::map<const nn::Module*, std::string> path_of;
  for (auto& [path, module] : root.named_modules()) path_of[module] = path;

  auto find_param = [&](const std::string& name, std::string& why) -> const nn::Parameter* {
    const Location at = locate(scope, name);
    if (!at.owner->has_parameter(at.local)) {
      why = what + " needs the parameter '" + name + "', which the replaced module(s) do not have";
      return nullptr;
    }
    if (!member_modules.count(at.owner)) {
      why = what + " uses the parameter '" + name + "' of a module it does not replace";
      return nullptr;
    }
    const nn::Parameter& p = at.owner->slot(at.local);
    const std::string full = join_path(path_of[at.owner], at.local);
    if (!p.tied_to.empty() || tie_targets.count(full)) {
      why = what + " would replace the tied parameter '" + name +
            "' (shared with another module); hk does not convert tied weights";
      return nullptr;
    }
    return &p;
  };

  std::set<std::string> consumed;  // sources that conversions take out
  for (const LayoutConversion& c : layout.conversions)
    for (const std::string& s : c.sources) consumed.insert(s);
  std::set<std::string> made;
  for (const std::string& name : layout.parameters) {
    std::string why;
    const LayoutConversion* c = layout.conversion_of(name);
    if (!c) {  // a plain same-name parameter: must exist and stay
      if (!find_param(name, why)) return why;
      if (consumed.count(name))
        return what + " both keeps '" + name + "' and converts it into another parameter";
      continue;
    }
    std::vector<Shape> shapes;
    for (const std::string& s : c->sources) {
      const nn::Parameter* p = find_param(s, why);
      if (!p) return why;
      if (p->is_buffer) return what + " converts '" + s + "', which is a buffer";
      shapes.push_back(p->shape);
    }
    made_shape(*c, shapes, why);
    if (!why.empty()) return what + ": " + name + " cannot be made: " + why;
    const Location at = locate(scope, name);
    if (at.owner->has_parameter(at.local) && !consumed.count(name))
      return what + " declares '" + name + "', which already exists and is not converted";
    if (at.owner->find_module(at.local))
      return what + " declares '" + name + "', which is a module";
    if (!made.insert(name).second) return what + " makes '" + name + "' twice";
  }
  // The kernel computes from the layout's parameters only: a parameter of the replaced modules
  // that the layout neither keeps nor converts would be silently ignored (a bias, say).
  std::set<std::string> covered(consumed);
  for (const std::string& name : layout.parameters)
    if (!layout.conversion_of(name)) covered.insert(name);
  const std::string scope_prefix = path_of[&scope];
  for (nn::Module* m : members)
    for (auto& [path, p] : m->named_parameters(path_of[m])) {
      if (p->is_buffer || !p->tied_to.empty() || !p->persistent) continue;
      std::string rel = path;
      if (!scope_prefix.empty()) rel = path.substr(std::min(path.size(), scope_prefix.size() + 1));
      if (!covered.count(rel))
        return what + " does not hold the parameter '" + rel +
               "' of the replaced module(s), so the kernel would ignore it";
    }
  return "";
}

std::string layout_key(const LayoutSpec& layout, const std::string& scope_path,
                       const std::vector<std::string>& member_paths) {
  std::string key = scope_path + "|";
  for (const std::string& m : member_paths) key += m + ",";
  return key + "|" + layout.content();
}

std::string applied_layout_key(const nn::Module& module) {
  const auto* record = dynamic_cast<const LayoutRecord*>(module.layout_state().get());
  return record ? record->key : "";
}

AppliedLayout apply_layout(const LayoutSpec& layout, nn::Module& scope,
                           const std::string& scope_path, const std::vector<nn::Module*>& members,
                           const std::string& key) {
  if (const auto* existing =
          dynamic_cast<const LayoutRecord*>(members.front()->layout_state().get());
      existing && existing->key == key)
    return {existing->parameters, false, false};
  for (nn::Module* m : members)
    HK_CHECK(!m->layout_state(), "apply_layout: a module still holds another layout");

  auto record = std::make_shared<LayoutRecord>();
  record->key = key;
  record->members = members;
  // Resolve every source once (a source may feed one conversion only: check_layout made sure
  // conversions do not keep what they consume; two conversions of one source are refused too).
  std::map<std::string, size_t> original_index;
  bool any_loaded = false, any_unloaded = false;
  for (const LayoutConversion& c : layout.conversions)
    for (const std::string& s : c.sources) {
      if (original_index.count(s))
        throw InvalidArgument("layout " + layout.name + " converts '" + s + "' twice");
      const Location at = locate(scope, s);
      const nn::Parameter& p = at.owner->slot(at.local);
      (p.value.defined() ? any_loaded : any_unloaded) = true;
      original_index[s] = record->originals.size();
      record->originals.push_back({at.owner, at.local, nn::Parameter()});
    }
  if (any_loaded && any_unloaded)
    throw InvalidArgument("layout " + layout.name + " at " +
                          (scope_path.empty() ? "<root>" : scope_path) +
                          ": some of the parameters it converts are loaded and others are not; "
                          "load the checkpoint first or kernelize before it loads");

  // The new parameters (values computed from the loaded sources before those go).
  struct Pending {
    Location at;
    nn::Parameter slot;
  };
  std::vector<Pending> pending;
  for (const LayoutConversion& c : layout.conversions) {
    std::vector<Shape> shapes;
    std::vector<Tensor> values;
    bool requires_grad = true;
    LayoutRecord::Made made;
    made.op = c.op;
    made.dim = c.dim;
    nn::ParameterSource source;
    source.op = source_op(c.op);
    source.dim = c.dim;
    for (const std::string& s : c.sources) {
      const LayoutRecord::Original& o = record->originals[original_index.at(s)];
      const nn::Parameter& p = o.owner->slot(o.name);
      shapes.push_back(p.shape);
      values.push_back(p.value);
      requires_grad = requires_grad && p.requires_grad;
      made.sources.push_back(original_index.at(s));
      // The checkpoint key: the source's own path, or (a layout over an already re-declared
      // parameter is refused by check_layout) nothing else.
      source.keys.push_back(join_path(scope_path, s));
    }
    std::string why;
    nn::Parameter slot;
    slot.shape = made_shape(c, shapes, why);
    if (!why.empty()) throw InvalidArgument("layout " + layout.name + ": " + c.target + ": " + why);
    slot.requires_grad = requires_grad;
    if (any_loaded) {
      if (c.op == HK_CONVERT_RENAME) {
        slot.value = values[0];  // the same tensor under the new name
      } else if (c.op == HK_CONVERT_TRANSPOSE) {
        slot.value = values[0].transpose(0, 1).contiguous();
      } else {
        Tensor joined = Tensor::empty(slot.shape, values[0].dtype(), values[0].device());
        int64_t offset = 0;
        for (const Tensor& v : values) {
          joined.slice(c.dim, offset, offset + v.size(c.dim)).copy_from(v.view());
          offset += v.size(c.dim);
        }
        slot.value = joined;
      }
    } else {
      slot.source = std::move(source);
    }
    pending.push_back({locate(scope, c.target), std::move(slot)});
    made.owner = pending.back().at.owner;
    made.name = pending.back().at.local;
    record->made.push_back(std::move(made));
  }

  // Swap: take the originals out (releasing their weights), put the layout's parameters in.
  for (LayoutRecord::Original& o : record->originals) {
    o.slot = o.owner->take_parameter(o.name);
    o.slot.value = Tensor();
    o.slot.grad = Tensor();
    o.slot.grad_overwrite = false;
  }
  for (Pending& p : pending) p.at.owner->put_parameter(p.at.local, std::move(p.slot));
  for (const std::string& name : layout.parameters) {
    const Location at = locate(scope, name);
    record->parameters.push_back({at.owner, at.local});
  }
  for (nn::Module* m : members) m->set_layout_state(record);
  return {record->parameters, true, any_loaded};
}

void revert_layout(nn::Module& module) {
  auto record = std::dynamic_pointer_cast<LayoutRecord>(module.layout_state());
  if (!record) return;
  // Inverse conversions from the layout's (loaded) parameters.
  std::vector<Tensor> restored(record->originals.size());
  for (const LayoutRecord::Made& m : record->made) {
    const nn::Parameter& p = m.owner->slot(m.name);
    if (!p.value.defined()) continue;
    if (m.op == HK_CONVERT_RENAME) {
      restored[m.sources[0]] = p.value;
    } else if (m.op == HK_CONVERT_TRANSPOSE) {
      restored[m.sources[0]] = p.value.transpose(0, 1).contiguous();
    } else {
      int64_t offset = 0;
      for (size_t s : m.sources) {
        const int64_t n = record->originals[s].slot.shape[static_cast<size_t>(m.dim)];
        Tensor part = p.value.slice(m.dim, offset, offset + n);
        restored[s] = part.is_contiguous() ? part : part.contiguous();  // dim 0: a view
        offset += n;
      }
    }
  }
  for (const LayoutRecord::Made& m : record->made) m.owner->take_parameter(m.name);
  for (size_t i = 0; i < record->originals.size(); ++i) {
    LayoutRecord::Original& o = record->originals[i];
    nn::Parameter slot = o.slot;
    slot.value = restored[i];
    o.owner->put_parameter(o.name, std::move(slot));
  }
  for (nn::Module* m : record->members) m->set_layout_state(nullptr);
}

}  // namespace hk::kernel_binding
