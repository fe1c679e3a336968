// hk/kernel_sdk_cuda.cuh — device-side numerics shared by hk's CUDA code and kernel repos.
//
// The one definition of how f32 math meets the 16-bit storage types: to_f32 widens, from_f32<T>
// rounds to nearest-even, round_as<T> is "one rounding to the dtype" of the eager semantics.
// Header-only and free of libhk symbols, so kernel libraries (which never link libhk) can use it;
// include it only from .cu files. It deliberately holds no kernels, vector types or launch code.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace hk::sdk::cuda {

__device__ __forceinline__ float to_f32(float v) {
  return v;
}
__device__ __forceinline__ float to_f32(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Rounds through T and back.
template <class T>
__device__ __forceinline__ float round_as(float v) {
  return to_f32(from_f32<T>(v));
}

}  // namespace hk::sdk::cuda
