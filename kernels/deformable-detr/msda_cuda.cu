// msda_cuda.cu — kernels-community/deformable-detr, the cuda kernels (the ABI side is
// msda_cuda_library.cc). Parallelised like the original Deformable DETR kernel: one warp per
// (b, q, h) with the channels across the lanes (coalesced value reads), the L·P sampling points
// walked in turn. Backward: dvalue by f32 atomics (into dvalue when f32, else the workspace
// accumulator, cast at the end); d(location) and d(weight) reduce the channel products with warp
// shuffles, so no second pass over the points is needed. No allocation, no host sync.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "hk/kernel_sdk_cuda.cuh"
#include "hk_abi/hk_kernel.h"
#include "msda_problem.h"

namespace msda {
namespace {

using hk::sdk::cuda::from_f32;
using hk::sdk::cuda::to_f32;

constexpr int kWarps = 8;  // warps per block
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

template <class T>
__global__ void forward_kernel(Problem p) {
  const int lane = threadIdx.x & 31;
  const int64_t bqh = blockIdx.x * int64_t(kWarps) + (threadIdx.x >> 5);
  if (bqh >= p.batch * p.queries * p.heads) return;
  const int64_t h = bqh % p.heads, b = bqh / (p.heads * p.queries);
  const T* value = static_cast<const T*>(p.value);
  const T* loc = static_cast<const T*>(p.loc);
  const T* att = static_cast<const T*>(p.att);
  T* out = static_cast<T*>(p.out);
  for (int64_t d0 = 0; d0 < p.channels; d0 += 32) {
    const int64_t d = d0 + lane;
    float acc = 0.0f;
    for (int64_t l = 0; l < p.levels; ++l)
      for (int64_t pt = 0; pt < p.points; ++pt) {
        const int64_t j = (bqh * p.levels + l) * p.points + pt;
        const Corners c =
            corners(to_f32(loc[2 * j]), to_f32(loc[2 * j + 1]), p.height[l], p.width[l]);
        const float a = to_f32(att[j]);
        if (d < p.channels)
#pragma unroll
          for (int k = 0; k < 4; ++k)
            if (c.row[k] >= 0)
              acc +=
                  a * c.w[k] *
                  to_f32(
                      value[((b * p.rows + p.start[l] + c.row[k]) * p.heads + h) * p.channels + d]);
      }
    if (d < p.channels) out[bqh * p.channels + d] = from_f32<T>(acc);
  }
}

template <class T>
__global__ void backward_kernel(Problem p, float* dvalue) {
  const int lane = threadIdx.x & 31;
  const int64_t bqh = blockIdx.x * int64_t(kWarps) + (threadIdx.x >> 5);
  if (bqh >= p.batch * p.queries * p.heads) return;
  const int64_t h = bqh % p.heads, b = bqh / (p.heads * p.queries);
  const T* value = static_cast<const T*>(p.value);
  const T* loc = static_cast<const T*>(p.loc);
  const T* att = static_cast<const T*>(p.att);
  const T* dout = static_cast<const T*>(p.dout);
  for (int64_t l = 0; l < p.levels; ++l)
    for (int64_t pt = 0; pt < p.points; ++pt) {
      const int64_t j = (bqh * p.levels + l) * p.points + pt;
      const Corners c =
          corners(to_f32(loc[2 * j]), to_f32(loc[2 * j + 1]), p.height[l], p.width[l]);
      const float a = to_f32(att[j]);
      float sample_dot = 0.0f, gx = 0.0f, gy = 0.0f;
      for (int k = 0; k < 4; ++k) {
        if (c.row[k] < 0) continue;
        const int64_t base = ((b * p.rows + p.start[l] + c.row[k]) * p.heads + h) * p.channels;
        float dot = 0.0f;
        for (int64_t d = lane; d < p.channels; d += 32) {
          const float g = to_f32(dout[bqh * p.channels + d]);
          dot += g * to_f32(value[base + d]);
          if (dvalue) atomicAdd(dvalue + base + d, a * c.w[k] * g);
        }
        sample_dot += c.w[k] * dot;
        gx += c.dwx[k] * dot;
        gy += c.dwy[k] * dot;
      }
      sample_dot = warp_sum(sample_dot);
      gx = warp_sum(gx);
      gy = warp_sum(gy);
      if (lane == 0) {
        if (p.datt) static_cast<T*>(p.datt)[j] = from_f32<T>(sample_dot);
        if (p.dloc) {
          static_cast<T*>(p.dloc)[2 * j] = from_f32<T>(a * gx * static_cast<float>(p.width[l]));
          static_cast<T*>(p.dloc)[2 * j + 1] =
              from_f32<T>(a * gy * static_cast<float>(p.height[l]));
        }
      }
    }
}

template <class T>
__global__ void cast_kernel(const float* __restrict__ in, T* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f32<T>(in[i]);
}

unsigned warp_blocks(const Problem& p) {
  return static_cast<unsigned>((p.batch * p.queries * p.heads + kWarps - 1) / kWarps);
}

template <class T>
int run_forward(const Problem& p, cudaStream_t s) {
  if (p.batch * p.queries * p.heads == 0 || p.channels == 0) return 0;
  forward_kernel<T><<<warp_blocks(p), kWarps * 32, 0, s>>>(p);
  return static_cast<int>(cudaGetLastError());
}

template <class T>
int run_backward(const Problem& p, cudaStream_t s) {
  const int64_t n_value = p.batch * p.rows * p.heads * p.channels;
  float* acc = nullptr;
  if (p.dvalue) {
    acc = p.dtype == HK_DTYPE_F32 ? static_cast<float*>(p.dvalue) : p.accumulator;
    if (cudaError_t e = cudaMemsetAsync(acc, 0, n_value * sizeof(float), s)) return e;
  }
  if (p.batch * p.queries * p.heads > 0)
    backward_kernel<T><<<warp_blocks(p), kWarps * 32, 0, s>>>(p, acc);
  if (p.dvalue && p.dtype != HK_DTYPE_F32 && n_value > 0)
    cast_kernel<T>
        <<<static_cast<unsigned>((n_value + 255) / 256 < 65535 ? (n_value + 255) / 256 : 65535),
           256, 0, s>>>(acc, static_cast<T*>(p.dvalue), n_value);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int forward_cuda(const Problem& p, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (p.dtype == HK_DTYPE_F32) return run_forward<float>(p, s);
  if (p.dtype == HK_DTYPE_BF16) return run_forward<__nv_bfloat16>(p, s);
  return run_forward<__half>(p, s);
}

int backward_cuda(const Problem& p, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (p.dtype == HK_DTYPE_F32) return run_backward<float>(p, s);
  if (p.dtype == HK_DTYPE_BF16) return run_backward<__nv_bfloat16>(p, s);
  return run_backward<__half>(p, s);
}

}  // namespace msda
