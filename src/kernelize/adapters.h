// Internal: adapters that bind a loaded kernel entry to a module's layer interface.
//
// Each adapter subclasses the module's `<Layer>Impl` (hk/layers.h) and calls the kernel through
// the C ABI with the tensors and attribute struct of its layer interface (hk/layer_interfaces.h),
// reading parameters from the module it is bound to — or, for a stateful kernel, the parameters of
// its layout (layouts.h). Workspace, when an entry asks for one, is taken from the caching
// allocator per call. Adapters do no argument checking beyond what the
// kernel returns: the module's own forward already fixed the shapes. Adapters of entries with a
// backward also implement the Impl's training methods (forward_train / backward) through it; one
// layer, ForCausalLMLoss, also binds a second interface: fused_linear_cross_entropy@1 (training
// only), whose adapter takes the hidden states and lm_head.weight instead of logits.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hk/kernel_loader.h"
#include "hk/layers.h"
#include "hk/mode.h"
#include "kernelize/layouts.h"

namespace hk::kernel_binding {

// True when `impl` is an adapter whose kernel entry declares HK_MODE_CAPTURE (safe inside a CUDA
// graph: no host sync, no allocation, no host reads), or the pass-through half of a fusion. False
// for any other implementation (callers treat the built-in ones as safe themselves).
bool declares_capture(const nn::LayerImpl& impl);
// Adapters defined in other files (activation_binding.cc, deformable_binding.cc) implement this so
// declares_capture can ask them.
class CaptureDeclaring {
 public:
  virtual ~CaptureDeclaring() = default;
  virtual bool declares_capture() const = 0;
};
// Calls one pass of `fn` (forward, or backward when `backward`) with a workspace from the caching
// allocator on `stream` when the entry asks for one (adapters and attention bindings share it).
void call_kernel_pass(const KernelFunction& fn, bool backward,
                      const std::vector<TensorView>& inputs, const std::vector<TensorView>& outputs,
                      const void* attrs, size_t attrs_size, Stream stream);

// The layer names that have an adapter ("RMSNorm", "rotary_pos_emb", "MLP", the activation layers
// of activation_binding.h, "Linear", "ForCausalLMLoss", "MultiScaleDeformableAttention", "MoeMLP"
// — in moe_adapter.cc); attention goes through attention functions instead
// (kernelize/attention_binding.h).
bool has_adapter(const std::string& layer);
// True when `entry` can serve `layer`: its interface's layer is `layer`, `layer` is an activation
// layer and the entry an activation@1, or `layer` is ForCausalLMLoss and the entry is a
// fused_linear_cross_entropy@1 (the fused lm_head + loss).
bool entry_serves(const KernelEntryInfo& entry, const std::string& layer);
// Why the adapter cannot serve this module with `entry` in `mode` (a sentence for the report), or
// "" when it can: a fused linear cross-entropy outside training mode, a gated MLP with biases
// (mlp@1 has none), a layout on a layer whose adapter has no parameters to replace.
std::string adapter_refusal(const nn::Module& module, const std::string& layer,
                            const KernelEntryInfo& entry, Mode mode);
// An implementation of `module`'s layer calling `fn`; throws InvalidArgument when the layer has
// no adapter or the module is not of the layer's class. `layout`: the parameters of the entry's
// layout (layouts.h), which the kernel gets in place of the interface's parameter tensors
// (hk/layer_interfaces.h) — and whose gradients its backward writes.
std::shared_ptr<nn::LayerImpl> make_adapter(const nn::Module& module, const std::string& layer,
                                            KernelFunction fn, const std::string& display_name,
                                            std::optional<ParamRefs> layout = std::nullopt);

// Fusions (fusion.h): the implementations of the fused modules.
struct FusedImpls {
  std::vector<std::shared_ptr<nn::LayerImpl>> members;  // one per fused module, in order
};
// RMSNorm → MLP (rms_norm_mlp@1): the norm passes its input through, the MLP runs the kernel on it.
FusedImpls make_rmsnorm_mlp_fusion(const nn::RMSNorm& norm, const nn::MLP& mlp, KernelFunction fn,
                                   const std::string& display_name, ParamRefs params);
// Linear → RMSNorm over heads (linear_rms_norm@1): the projection runs the kernel, the norm passes
// its (already normalised) input through.
FusedImpls make_linear_rmsnorm_fusion(const nn::Linear& linear, const nn::RMSNorm& norm,
                                      KernelFunction fn, const std::string& display_name,
                                      ParamRefs params);
// Sibling Linears reading one input (linear_group@1): one group implementation the parent runs
// through nn::forward_linears; each member alone runs the group and keeps its own output.
FusedImpls make_linear_group_fusion(const std::vector<const nn::Linear*>& members,
                                    KernelFunction fn, const std::string& display_name,
                                    ParamRefs params);

}  // namespace hk::kernel_binding
