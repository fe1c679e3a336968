// Internal: the adapter binding a moe_mlp@1 kernel entry to a MoeMLP layer (hk/moe.h); see
// moe_adapter.cc. Dispatched from adapters.cc's make_adapter.
#pragma once

#include <memory>
#include <string>

#include "hk/kernel_loader.h"
#include "hk/moe.h"

namespace hk::kernel_binding {

std::shared_ptr<nn::MoeMLPImpl> make_moe_mlp_adapter(KernelFunction fn,
                                                     const std::string& display_name);

}  // namespace hk::kernel_binding
