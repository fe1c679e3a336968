// Internal: module fusion — a KernelConfig fusion rule matched against the module tree, checked
// against the parents' child flows (Module::child_flows), and the fusion kinds hk can run.
//
// A rule lists (class name, path pattern) pairs; `*` matches exactly one path segment and every
// pattern must lie under the same parent pattern. Each parent where all patterns match is one
// group. A group may be fused when its members are, in the parent's own description of its
// forward, a chain (each member's output is the next one's only input) or a shared-input group
// (members that read the same input), and hk has a fusion interface for their layers:
//
//   chain  RMSNorm → MLP       rms_norm_mlp@1     the MLP runs the kernel on the norm's input;
//                                                 the norm passes it through
//   chain  Linear → RMSNorm    linear_rms_norm@1  the projection runs the kernel (projection +
//                                                 per-head norm); the norm passes it through
//   shared Linear, Linear, ... linear_group@1     the parent runs the siblings as one call
//
// Anything else (input_layernorm → self_attn: the attention module runs its own projections and
// KV cache, so no interface takes over all of it) is refused with the reason. The kernel always
// ships a layout (its parameters, layouts.h). This file does not talk to the hub.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "hk/kernel_config.h"
#include "hk/kernel_loader.h"
#include "hk/module.h"
#include "kernelize/adapters.h"

namespace hk::kernel_binding {

// One parent's modules matched by a rule, in rule order (null where a pattern matched nothing).
struct FusionGroup {
  std::string parent_path;
  nn::Module* parent = nullptr;
  std::vector<std::string> member_paths;
  std::vector<nn::Module*> members;
  bool complete() const;
};

// The groups of `rule` in `modules` (root.named_modules()), by parent path. Throws
// InvalidArgument, naming `where`, for a rule that cannot be met as written: fewer than two
// modules, patterns under different parents, a pattern that matches no module, or a pattern that
// matches two modules under one parent.
std::vector<FusionGroup> match_fusion(
    const FusionRule& rule, const std::string& where,
    const std::vector<std::pair<std::string, nn::Module*>>& modules);

enum class FusionKind { RmsNormMlp, LinearRmsNorm, LinearGroup };
// The interface a kind is bound through ("rms_norm_mlp"), and its layer name in the interface
// registry ("RMSNorm+MLP", what pick_entry matches).
const char* fusion_interface(FusionKind kind);
const char* fusion_layer(FusionKind kind);

// The kind of a complete group. Throws InvalidArgument when its members are not a chain or a
// shared-input group of the parent, or hk has no fusion interface for their layers (the message
// lists the parent's flows and what hk fuses).
FusionKind fusion_kind(const FusionGroup& group, const std::string& where);

// The implementations of the group's members, in member order, calling `fn` with `params` (the
// kernel layout's parameters).
FusedImpls make_fusion(FusionKind kind, const FusionGroup& group, KernelFunction fn,
                       const std::string& display_name, ParamRefs params);

// `*` matches exactly one dotted segment.
bool path_matches(const std::string& path, const std::string& pattern);

}  // namespace hk::kernel_binding
