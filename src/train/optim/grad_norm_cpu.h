// Internal: the CPU global gradient norm (double accumulation) and torch's clipping coefficient,
// shared by hk::optim::clip_grad_norm and AdamW::clip_grad_norm.
#pragma once

#include <vector>

#include "hk/optim.h"

namespace hk::optim::detail {

void grad_norm_cpu(const std::vector<OptimTensor>& tensors, double max_norm, float* norm,
                   float* coef);

}  // namespace hk::optim::detail
