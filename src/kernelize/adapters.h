// Internal: adapters that bind a loaded kernel entry to a module's layer interface.
//
// Each adapter subclasses the module's `<Layer>Impl` (hk/layers.h) and calls the kernel through
// the C ABI with the tensors and attribute struct of its layer interface (hk/layer_interfaces.h),
// reading parameters from the module it is bound to. Workspace, when an entry asks for one, is
// taken from the caching allocator per call. Adapters do no argument checking beyond what the
// kernel returns: the module's own forward already fixed the shapes.
#pragma once

#include <memory>
#include <string>

#include "hk/attention_functions.h"
#include "hk/kernel_loader.h"
#include "hk/layers.h"

namespace hk::kernel_binding {

// The layer names that have an adapter ("RMSNorm", "rotary_pos_emb", "MLP", "SiLU", "Linear",
// "ForCausalLMLoss"); attention goes through attention functions instead.
bool has_adapter(const std::string& layer);
// An implementation of `module`'s layer calling `fn`; throws InvalidArgument when the layer has
// no adapter or the module is not of the layer's class.
std::shared_ptr<nn::LayerImpl> make_adapter(const nn::Module& module, const std::string& layer,
                                            KernelFunction fn, const std::string& display_name);
// An attention function (hk/attention_functions.h signature) calling an attention@1 entry.
nn::AttentionFunction make_attention_function(KernelFunction fn);

}  // namespace hk::kernel_binding
