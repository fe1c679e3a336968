// Merging KernelConfig over the default table and choosing a rule for (layer, device, mode).
#include "kernelize/mapping.h"

#include <set>

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

}  // namespace hk::kernel_binding
