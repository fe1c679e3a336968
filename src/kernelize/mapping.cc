// Merging KernelConfig over the default table, choosing a rule for (layer, device, mode), and the
// names a module answers to.
#include "kernelize/mapping.h"

#include <algorithm>
#include <set>

#include "hk/layers.h"

namespace hk::kernel_binding {

std::vector<MappingRule> effective_rules(const KernelConfig& config) {
  static const char* kDeviceTypes[] = {"cpu", "cuda", "rocm", "xpu", "mps", "npu"};
  std::vector<MappingRule> out;
  // (layer, device) pairs the config speaks for: their defaults are dropped.
  std::set<std::pair<std::string, std::string>> overridden;
  for (const auto& [layer, value] : config.kernel_mapping) {
    for (const char* device : kDeviceTypes) {
      auto spec = value.for_device(device);
      if (!spec) continue;
      overridden.emplace(layer, device);
      MappingRule rule;
      rule.layer = layer;
      rule.device = device;
      rule.kernel = *spec;
      rule.source = "kernel_config";
      out.push_back(std::move(rule));
    }
  }
  if (config.inherit_mapping) {
    for (const auto& rule : default_mapping())
      if (!overridden.count({rule.layer, rule.device})) out.push_back(rule);
  }
  return out;
}

std::optional<MappingChoice> choose_rule(const std::vector<MappingRule>& rules,
                                         const std::string& layer, const std::string& device,
                                         int capability, Mode mode) {
  // Smallest capability range that contains the device.
  long best_width = -1;
  for (const auto& r : rules) {
    if (r.layer != layer || r.device != device) continue;
    if (capability < r.min_capability || capability > r.max_capability) continue;
    const long width = static_cast<long>(r.max_capability) - r.min_capability;
    if (best_width < 0 || width < best_width) best_width = width;
  }
  if (best_width < 0) return std::nullopt;
  for (Mode key : fallback_chain(mode)) {
    for (const auto& r : rules) {
      if (r.layer != layer || r.device != device || r.mode != key) continue;
      if (capability < r.min_capability || capability > r.max_capability) continue;
      if (static_cast<long>(r.max_capability) - r.min_capability != best_width) continue;
      return MappingChoice{r, key};
    }
  }
  return std::nullopt;
}

std::optional<MappingChoice> choose_rule(const std::vector<MappingRule>& rules,
                                         const std::vector<std::string>& names,
                                         const std::string& device, int capability, Mode mode) {
  // A KernelConfig value under any of the names beats the default table's rules.
  for (const bool from_config : {true, false})
    for (const std::string& name : names) {
      const bool any = std::any_of(rules.begin(), rules.end(), [&](const MappingRule& r) {
        return r.layer == name && r.device == device &&
               (!from_config || r.source == "kernel_config");
      });
      if (any) return choose_rule(rules, name, device, capability, mode);
    }
  return std::nullopt;
}

std::vector<std::string> mapping_names(const nn::Module& module) {
  std::vector<std::string> names{module.layer_interface()};
  if (const auto* mlp = dynamic_cast<const nn::MLP*>(&module)) {
    const ops::Activation act = mlp->act_fn->kind();
    if (act == ops::Activation::SiLU) names.push_back("SwiGLUMLP");
    if (act == ops::Activation::GELU || act == ops::Activation::GELUTanh)
      names.push_back("GeGLUMLP");
  } else if (module.layer_interface() == "GeLU") {
    names.push_back("GELU");
  } else if (module.layer_interface() == "GeluTanh") {
    names.push_back("GELUTanh");
  }
  return names;
}

}  // namespace hk::kernel_binding
