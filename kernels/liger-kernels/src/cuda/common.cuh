// cuda/common.cuh — internal helpers for the liger cuda kernels: f32 conversion of the element
// types, 16-byte packs, warp/block reductions, dtype dispatch, the multiprocessor count.
// Nothing here launches work.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "hk/kernel_sdk_cuda.cuh"
#include "hk/kernel_sdk_sm80.cuh"
#include "liger/args.h"

namespace liger::cuda {

using hk::sdk::cuda::from_f32;
using hk::sdk::cuda::round_as;
using hk::sdk::cuda::to_f32;

// Runtime-typed scalar load (weights, cos/sin tables: small, cache resident).
__device__ __forceinline__ float load_dt(const void* p, Dt dt, int64_t i) {
  if (dt == Dt::F32) return static_cast<const float*>(p)[i];
  if (dt == Dt::BF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return __half2float(static_cast<const __half*>(p)[i]);
}
__device__ __forceinline__ void store_dt(void* p, Dt dt, int64_t i, float v) {
  if (dt == Dt::F32)
    static_cast<float*>(p)[i] = v;
  else if (dt == Dt::BF16)
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else
    static_cast<__half*>(p)[i] = __float2half_rn(v);
}
__device__ __forceinline__ int64_t load_index(const void* p, IndexDt dt, int64_t i) {
  return dt == IndexDt::I32 ? static_cast<const int32_t*>(p)[i] : static_cast<const int64_t*>(p)[i];
}

// N consecutive elements moved as one access (N·sizeof(T) = 16 bytes, or N = 1 for the scalar
// path of unaligned operands).
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T e[N];
};
template <class T, int N>
__device__ __forceinline__ Pack<T, N> ld(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}
template <class T, int N>
__device__ __forceinline__ void st(T* p, const Pack<T, N>& v) {
  *reinterpret_cast<Pack<T, N>*>(p) = v;
}

// Asks L2 to fetch the 128-byte line holding p (no registers, no wait): used to start the next
// row's loads while the current row is being reduced and written.
using hk::sdk::cuda::sm80::prefetch_l2;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a group of G threads: one warp (G = 32, no shared memory) or the whole block
// (G = blockDim.x; `red` holds ≥ 32 floats). Every thread of the group gets the result.
template <int G>
__device__ __forceinline__ float group_sum(float v, float* red) {
  v = warp_sum(v);
  if constexpr (G == 32) {
    return v;
  } else {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // `red` may still be read from the previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = 0;
#pragma unroll
    for (int i = 0; i < G / 32; ++i) t += red[i];
    return t;
  }
}

template <class T>
constexpr Dt dt_of() {
  return sizeof(T) == 4 ? Dt::F32 : (std::is_same<T, __half>::value ? Dt::F16 : Dt::BF16);
}

// N consecutive elements of a runtime-typed vector (weights, cos/sin) as floats: one 16-byte
// access when `same` (the vector has the element type T and the caller checked alignment), else
// N scalar loads. The branch is uniform across the launch.
template <class T, int N>
__device__ __forceinline__ void load_run(const void* p, Dt dt, int64_t i, bool same,
                                         float (&out)[N]) {
  if (same) {
    const Pack<T, N> v = ld<T, N>(static_cast<const T*>(p) + i);
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = to_f32(v.e[k]);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = load_dt(p, dt, i + k);
  }
}

inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// A Rows operand can be moved in 16-byte packs of N elements.
inline bool rows_vectorizable(const Rows& m, int n) {
  return m.data == nullptr ||
         (aligned16(m.data) && m.cols % n == 0 && (m.rows <= 1 || m.row_stride % n == 0));
}

int sm_count();                  // of the current device (cached per device)
int compute_capability_major();  // of the current device (cached per device)

#define LIGER_DISPATCH_FLOAT(dt, T, ...) \
  switch (dt) {                          \
    case ::liger::Dt::F32: {             \
      using T = float;                   \
      __VA_ARGS__;                       \
      break;                             \
    }                                    \
    case ::liger::Dt::BF16: {            \
      using T = __nv_bfloat16;           \
      __VA_ARGS__;                       \
      break;                             \
    }                                    \
    default: {                           \
      using T = __half;                  \
      __VA_ARGS__;                       \
    }                                    \
  }

inline int last_error() {
  return static_cast<int>(cudaGetLastError());
}

}  // namespace liger::cuda
