// Internal: the two scalar kernels of ZeRO's global gradient norm on CUDA (zero_cuda.cu):
// this rank's norm squared into the buffer that is all-reduced, and the global norm and clipping
// coefficient from the reduced sum. Plain C++ types, so zero_optimizer.cc needs no CUDA headers.
#pragma once

#include "hk/stream.h"

namespace hk::dist::cuda {

// sum[0] = norm[0]² (0 when norm is null: a rank without parameter elements).
void square(const float* norm, float* sum, Stream stream);
// norm[0] = √sum[0]; coef[0] = min(1, max_norm / (norm + 1e-6)), 1 when max_norm <= 0 (torch's
// clip_grad_norm_).
void finish_norm(const float* sum, double max_norm, float* norm, float* coef, Stream stream);

}  // namespace hk::dist::cuda
