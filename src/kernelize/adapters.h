// Internal: adapters that bind a loaded kernel entry to a module's layer interface.
//
// Each adapter subclasses the module's `<Layer>Impl` (hk/layers.h) and calls the kernel through
// the C ABI with the tensors and attribute struct of its layer interface (hk/layer_interfaces.h),
// reading parameters from the module it is bound to. Workspace, when an entry asks for one, is
// taken from the caching allocator per call. Adapters do no argument checking beyond what the
// kernel returns: the module's own forward already fixed the shapes. Adapters of entries with a
// backward also implement the Impl's training methods (forward_train / backward) through it; one
// layer, ForCausalLMLoss, also binds a second interface: fused_linear_cross_entropy@1 (training
// only), whose adapter takes the hidden states and lm_head.weight instead of logits.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hk/kernel_loader.h"
#include "hk/layers.h"
#include "hk/mode.h"

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
// (mlp@1 has none), a stateful (layout) RMSNorm kernel in training.
std::string adapter_refusal(const nn::Module& module, const std::string& layer,
                            const KernelEntryInfo& entry, Mode mode);
// An implementation of `module`'s layer calling `fn`; throws InvalidArgument when the layer has
// no adapter or the module is not of the layer's class. `layout_params` (from
// materialize_layout) replace the module's own parameters in the call for stateful kernels;
// only RMSNorm adapters take them.
std::shared_ptr<nn::LayerImpl> make_adapter(const nn::Module& module, const std::string& layer,
                                            KernelFunction fn, const std::string& display_name,
                                            std::vector<Tensor> layout_params = {});
// The parameters a kernel layout declares, in layout order, made from the parameters of the
// module(s) under `scope` (names relative to it, e.g. "mlp.gate_proj.weight"): plain copies by
// name, or the layout's conversions (rename, concatenate along a dim, transpose). Converted
// tensors are new (the originals stay with their modules). Throws InvalidArgument naming the
// layout and the missing source.
std::vector<Tensor> materialize_layout(const hk_layout& layout, nn::Module& scope);

// The fusion RMSNorm → MLP (rms_norm_mlp@1): the norm becomes an identity and the MLP runs the
// fused kernel on the norm's input.
struct FusedPair {
  std::shared_ptr<nn::LayerImpl> first, second;
};
FusedPair make_rmsnorm_mlp_fusion(const nn::RMSNorm& norm, const nn::MLP& mlp, KernelFunction fn,
                                  const std::string& display_name, std::vector<Tensor> params);

}  // namespace hk::kernel_binding
