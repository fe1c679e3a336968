// ZeRO's norm kernels (zero_cuda.h): one thread each, on the trainer's stream.
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "train/distributed/zero_cuda.h"

namespace hk::dist::cuda {
namespace {

__global__ void square_kernel(const float* norm, float* sum) {
  const float n = norm ? norm[0] : 0.0f;
  sum[0] = n * n;
}

__global__ void finish_kernel(const float* sum, float max_norm, float* norm, float* coef) {
  const float n = sqrtf(sum[0]);
  norm[0] = n;
  coef[0] = max_norm > 0.0f ? fminf(1.0f, max_norm / (n + 1e-6f)) : 1.0f;
}

}  // namespace

void square(const float* norm, float* sum, Stream stream) {
  square_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream.handle)>>>(norm, sum);
  HK_CUDA_CHECK_LAUNCH();
}

void finish_norm(const float* sum, double max_norm, float* norm, float* coef, Stream stream) {
  finish_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream.handle)>>>(
      sum, static_cast<float>(max_norm), norm, coef);
  HK_CUDA_CHECK_LAUNCH();
}

}  // namespace hk::dist::cuda
