// Internal: the resolved mapping kernelize consults — layer → device type → capability range →
// mode → kernel spec — built from hk's default table and a KernelConfig, and which layer names a
// module answers to.
//
// Precedence: a KernelConfig value for a layer replaces the default rules of that layer for the
// device types it covers (a plain value covers all device types; a per-device value only those
// it names); with inherit_mapping=false the defaults are not used at all. Among rules for one
// layer and device, the smallest capability range containing the device wins, then the mode
// chain of hk/mode.h picks the first mode key present. This file does not touch the hub.
#pragma once

#include <climits>
#include <optional>
#include <string>
#include <vector>

#include "hk/kernel_config.h"
#include "hk/mode.h"

namespace hk::nn {
class Module;
}

namespace hk::kernel_binding {

struct MappingRule {
  std::string layer;   // layer interface name registered by the model, e.g. "RMSNorm"
  std::string device;  // "cpu", "cuda", "rocm", "xpu", ...
  int min_capability = 0;
  int max_capability = INT_MAX;
  Mode mode = Mode::Fallback;  // mode key of this rule
  MappedKernel kernel;         // disabled() = use the built-in implementation
  std::string source;          // "default table" or "kernel_config" (for the report)
};

struct MappingChoice {
  MappingRule rule;
  Mode matched_mode;  // which key of the chain matched
};

// hk's device-aware default table (MISSION.md §2 plus cpu entries for hk's own cpu kernels).
const std::vector<MappingRule>& default_mapping();

// Rules in effect for `config` (defaults merged with config values, per the precedence above).
std::vector<MappingRule> effective_rules(const KernelConfig& config);

// The rule for one layer on one device in one mode, or nullopt when no rule applies.
std::optional<MappingChoice> choose_rule(const std::vector<MappingRule>& rules,
                                         const std::string& layer, const std::string& device,
                                         int capability, Mode mode);
// The same over the names a module answers to: the first name with a KernelConfig rule for the
// device, else the first with any rule (so a KernelConfig value for "MLP" or "GELU" beats the
// default "SwiGLUMLP" or "GeLU" rule).
std::optional<MappingChoice> choose_rule(const std::vector<MappingRule>& rules,
                                         const std::vector<std::string>& names,
                                         const std::string& device, int capability, Mode mode);

// The names a module can be mapped by, its registered layer name first: a gated MLP is also
// Transformers' "SwiGLUMLP" (SiLU) or "GeGLUMLP" (GELU, either form) — the keys of Transformers'
// default table; activation layers also answer to hk's earlier names ("GELU", "GELUTanh").
std::vector<std::string> mapping_names(const nn::Module& module);

}  // namespace hk::kernel_binding
