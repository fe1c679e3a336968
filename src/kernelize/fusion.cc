// Fusion rules against the module tree and the fusion kinds hk runs (see fusion.h).
#include "kernelize/fusion.h"

#include <algorithm>
#include <map>
#include <optional>

#include "hk/error.h"
#include "hk/layers.h"
#include "kernelize/mapping.h"

namespace hk::kernel_binding {
namespace {

std::string parent_of(const std::string& path) {
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}
std::string last_segment(const std::string& path) {
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

std::string describe_flows(const nn::Module& parent) {
  std::vector<std::string> flows;
  for (const auto& f : parent.child_flows())
    flows.push_back(f.kind == nn::Module::ChildFlow::Kind::Chain ? join(f.children, " → ")
                                                                 : join(f.children, " ‖ "));
  return flows.empty() ? "none" : join(flows, ", ");
}

const char* kSupported =
    "hk fuses a chain RMSNorm → MLP (rms_norm_mlp@1), a chain Linear → RMSNorm (linear_rms_norm@1) "
    "and sibling Linears that read one input (linear_group@1)";

}  // namespace

bool FusionGroup::complete() const {
  return std::all_of(members.begin(), members.end(), [](const nn::Module* m) { return m; });
}

bool path_matches(const std::string& path, const std::string& pattern) {
  size_t p = 0, q = 0;
  while (p < path.size() && q < pattern.size()) {
    if (pattern[q] == '*') {
      const size_t end = path.find('.', p);
      p = end == std::string::npos ? path.size() : end;
      ++q;
    } else if (pattern[q] == path[p]) {
      ++p;
      ++q;
    } else {
      return false;
    }
  }
  return p == path.size() && q == pattern.size();
}

std::vector<FusionGroup> match_fusion(
    const FusionRule& rule, const std::string& where,
    const std::vector<std::pair<std::string, nn::Module*>>& modules) {
  if (rule.modules.size() < 2)
    throw InvalidArgument(where + ": a fusion replaces two or more modules, got " +
                          std::to_string(rule.modules.size()));
  const std::string parent_pattern = parent_of(rule.modules.front().second);
  for (const auto& [cls, pattern] : rule.modules)
    if (parent_of(pattern) != parent_pattern)
      throw InvalidArgument(where + ": fused modules must share one parent, but '" +
                            rule.modules.front().second + "' and '" + pattern +
                            "' are under different parents");
  std::map<std::string, FusionGroup> by_parent;
  std::vector<std::string> order;  // parents in tree order
  for (size_t k = 0; k < rule.modules.size(); ++k) {
    const auto& [cls, pattern] = rule.modules[k];
    size_t matches = 0;
    for (const auto& [path, module] : modules) {
      if (!path_matches(path, pattern) || module->layer_interface().empty()) continue;
      const auto names = mapping_names(*module);
      if (std::find(names.begin(), names.end(), cls) == names.end()) continue;
      const std::string parent = parent_of(path);
      auto [it, inserted] = by_parent.try_emplace(parent);
      FusionGroup& g = it->second;
      if (inserted) {
        order.push_back(parent);
        g.parent_path = parent;
        g.member_paths.resize(rule.modules.size());
        g.members.resize(rule.modules.size(), nullptr);
        for (const auto& [p, m] : modules)
          if (p == parent) g.parent = m;
      }
      if (g.members[k])
        throw InvalidArgument(where + ": the pattern '" + pattern + "' matches both " +
                              g.member_paths[k] + " and " + path + " under one parent");
      for (size_t j = 0; j < k; ++j)
        if (g.members[j] == module)
          throw InvalidArgument(where + ": " + path + " is matched by two of its patterns");
      g.members[k] = module;
      g.member_paths[k] = path;
      ++matches;
    }
    if (matches == 0)
      throw InvalidArgument(where + ": the pattern '" + pattern + "' (class " + cls +
                            ") matches no module of this model");
  }
  std::sort(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
    auto index = [&](const std::string& p) {
      for (size_t i = 0; i < modules.size(); ++i)
        if (modules[i].first == p) return i;
      return modules.size();
    };
    return index(a) < index(b);
  });
  std::vector<FusionGroup> out;
  for (const std::string& parent : order) out.push_back(std::move(by_parent.at(parent)));
  return out;
}

const char* fusion_interface(FusionKind kind) {
  switch (kind) {
    case FusionKind::RmsNormMlp:
      return "rms_norm_mlp";
    case FusionKind::LinearRmsNorm:
      return "linear_rms_norm";
    case FusionKind::LinearGroup:
      return "linear_group";
  }
  return "";
}

const char* fusion_layer(FusionKind kind) {
  switch (kind) {
    case FusionKind::RmsNormMlp:
      return "RMSNorm+MLP";
    case FusionKind::LinearRmsNorm:
      return "Linear+RMSNorm";
    case FusionKind::LinearGroup:
      return "LinearGroup";
  }
  return "";
}

FusionKind fusion_kind(const FusionGroup& group, const std::string& where) {
  std::vector<std::string> children, layers;
  for (size_t i = 0; i < group.members.size(); ++i) {
    children.push_back(last_segment(group.member_paths[i]));
    layers.push_back(group.members[i]->layer_interface());
  }
  const std::string parent = group.parent_path.empty() ? "the root" : group.parent_path;
  const std::string parent_class = group.parent ? group.parent->type_name() : "?";
  // Which of the parent's flows holds these children, the way a fusion needs them.
  std::optional<nn::Module::ChildFlow::Kind> flow;
  if (group.parent)
    for (const auto& f : group.parent->child_flows()) {
      if (f.kind == nn::Module::ChildFlow::Kind::Chain) {
        auto at =
            std::search(f.children.begin(), f.children.end(), children.begin(), children.end());
        if (at != f.children.end()) flow = f.kind;
      } else {
        const bool all = std::all_of(children.begin(), children.end(), [&](const std::string& c) {
          return std::find(f.children.begin(), f.children.end(), c) != f.children.end();
        });
        if (all) flow = f.kind;
      }
      if (flow) break;
    }
  if (!flow)
    throw InvalidArgument(
        where + ": " + join(children, ", ") + " under " + parent + " (" + parent_class +
        ") are not adjacent in its forward: neither a chain where each output "
        "is the next one's only input nor siblings reading one input (" +
        parent_class + "'s fusable children: " + describe_flows(*group.parent) + ")");
  using Kind = nn::Module::ChildFlow::Kind;
  if (*flow == Kind::Chain && layers == std::vector<std::string>{"RMSNorm", "MLP"})
    return FusionKind::RmsNormMlp;
  if (*flow == Kind::Chain && layers == std::vector<std::string>{"Linear", "RMSNorm"})
    return FusionKind::LinearRmsNorm;
  if (*flow == Kind::SharedInput &&
      std::all_of(layers.begin(), layers.end(), [](const std::string& l) { return l == "Linear"; }))
    return FusionKind::LinearGroup;
  std::string why;
  if (std::find(layers.begin(), layers.end(), "attention") != layers.end())
    why =
        " (the attention module runs its own projections, rotary and KV cache, and is bound "
        "through attn_implementation; fuse its projections instead)";
  throw InvalidArgument(where + ": hk has no fusion interface for " +
                        join(layers, *flow == Kind::Chain ? " → " : " ‖ ") + " (" +
                        join(children, ", ") + " under " + parent + ")" + why + "; " + kSupported);
}

FusedImpls make_fusion(FusionKind kind, const FusionGroup& group, KernelFunction fn,
                       const std::string& display_name, ParamRefs params) {
  switch (kind) {
    case FusionKind::RmsNormMlp:
      return make_rmsnorm_mlp_fusion(dynamic_cast<const nn::RMSNorm&>(*group.members[0]),
                                     dynamic_cast<const nn::MLP&>(*group.members[1]), std::move(fn),
                                     display_name, std::move(params));
    case FusionKind::LinearRmsNorm:
      return make_linear_rmsnorm_fusion(dynamic_cast<const nn::Linear&>(*group.members[0]),
                                        dynamic_cast<const nn::RMSNorm&>(*group.members[1]),
                                        std::move(fn), display_name, std::move(params));
    case FusionKind::LinearGroup: {
      std::vector<const nn::Linear*> linears;
      for (nn::Module* m : group.members) linears.push_back(&dynamic_cast<const nn::Linear&>(*m));
      return make_linear_group_fusion(linears, std::move(fn), display_name, std::move(params));
    }
  }
  throw InvalidArgument("kernelize: unknown fusion kind");
}

}  // namespace hk::kernel_binding
