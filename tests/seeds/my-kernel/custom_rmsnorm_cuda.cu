// custom_rmsnorm_cuda.cu — owner/my-kernel, the cuda kernel of CustomRMSNorm (see
// custom_rmsnorm.h): one block per row, an f32 sum of squares reduced in shared memory, the guide's
// two roundings. No allocation and no host synchronisation, so it may be captured into a CUDA
// graph.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "custom_rmsnorm_rows.h"
#include "hk/kernel_sdk_cuda.cuh"
#include "hk_abi/hk_kernel.h"

namespace {

using hk::sdk::cuda::from_f32;
using hk::sdk::cuda::round_as;
using hk::sdk::cuda::to_f32;

constexpr int kThreads = 256;

template <class T>
__global__ void custom_rmsnorm_kernel(const T* __restrict__ x, const T* __restrict__ scale,
                                      T* __restrict__ y, int64_t hidden, int64_t x_stride,
                                      int64_t y_stride, float eps) {
  __shared__ float partial[kThreads];
  const T* xr = x + blockIdx.x * x_stride;
  T* yr = y + blockIdx.x * y_stride;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < hidden; j += kThreads) {
    const float h = to_f32(xr[j]);
    sum += h * h;
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float rstd = rsqrtf(partial[0] / static_cast<float>(hidden) + eps);
  for (int64_t j = threadIdx.x; j < hidden; j += kThreads)
    yr[j] = from_f32<T>(to_f32(scale[j]) * round_as<T>(to_f32(xr[j]) * rstd));
}

template <class T>
void launch(const custom_rmsnorm::Rows& r, cudaStream_t stream) {
  custom_rmsnorm_kernel<T><<<static_cast<unsigned>(r.rows), kThreads, 0, stream>>>(
      static_cast<const T*>(r.x), static_cast<const T*>(r.scale), static_cast<T*>(r.y), r.hidden,
      r.x_stride, r.y_stride, r.eps);
}

}  // namespace

int custom_rmsnorm::launch_cuda(const Rows& r, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (r.dtype == HK_DTYPE_F32)
    launch<float>(r, s);
  else if (r.dtype == HK_DTYPE_BF16)
    launch<__nv_bfloat16>(r, s);
  else
    launch<__half>(r, s);
  return static_cast<int>(cudaGetLastError());
}
