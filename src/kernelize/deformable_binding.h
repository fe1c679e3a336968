// Internal: binding a multi_scale_deformable_attention@1 hub kernel (kernels-community/
// deformable-detr:MultiScaleDeformableAttention) to the MultiScaleDeformableAttention layer
// (hk/deformable_attention.h). adapters.cc dispatches the layer here.
#pragma once

#include <memory>
#include <string>

#include "hk/deformable_attention.h"
#include "hk/kernel_loader.h"

namespace hk::kernel_binding {

std::shared_ptr<nn::LayerImpl> make_deformable_attention_adapter(
    const nn::MultiScaleDeformableAttention& module, KernelFunction fn,
    const std::string& display_name);

}  // namespace hk::kernel_binding
