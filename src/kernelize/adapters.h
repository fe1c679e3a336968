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

#include "hk/attention_functions.h"
#include "hk/kernel_loader.h"
#include "hk/layers.h"
#include "hk/mode.h"

namespace hk::kernel_binding {

// The layer names that have an adapter ("RMSNorm", "rotary_pos_emb", "MLP", "SiLU", "Linear",
// "ForCausalLMLoss"); attention goes through attention functions instead.
bool has_adapter(const std::string& layer);
// True when `entry` can serve `layer`: its interface's layer is `layer`, or `layer` is
// ForCausalLMLoss and the entry is a fused_linear_cross_entropy@1 (the fused lm_head + loss).
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
// An attention function (hk/attention_functions.h signature) calling an attention@1 entry.
nn::AttentionFunction make_attention_function(KernelFunction fn);

}  // namespace hk::kernel_binding
