// Internal: device helpers of the decode kernels — programmatic dependent launch (PDL), L2
// prefetch, streaming 16-byte loads, bf16/f16 tensor-core products, and the launch helper that
// adds the PDL attribute. Only included by src/ops/decode/*_cuda.cu.
//
// PDL protocol of every decode kernel: prefetch what no predecessor writes (weights, old cache
// rows), then `grid_wait()` (returns once the preceding kernel finished and its writes are
// visible; a no-op when launched without the attribute), then `grid_launch_dependents()` so the
// next kernel may start its own prefetch while this one computes. Triggering after the wait bounds
// the overlap to one kernel ahead, so prefetched weights are not evicted before they are used.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "core/cuda_check.h"
#include "hk/kernel_sdk_cuda.cuh"
#include "hk/kernel_sdk_sm80.cuh"
#include "ops/decode/decode_kernels.h"

namespace hk::decode::detail {

using hk::sdk::cuda::from_f32;
using hk::sdk::cuda::round_as;
using hk::sdk::cuda::to_f32;

using hk::sdk::cuda::sm80::grid_launch_dependents;
using hk::sdk::cuda::sm80::grid_wait;
using hk::sdk::cuda::sm80::prefetch_l2;
// 16 bytes that are read once: not kept in L1.
__device__ __forceinline__ uint4 load_stream16(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}
__device__ __forceinline__ uint4 load_ro16(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}
__device__ __forceinline__ uint4 zero16() {
  return make_uint4(0u, 0u, 0u, 0u);
}

// D += A·B for one m16n8k16 tile (f32 accumulators); A row-major (4 registers), B column-major
// (2 registers), each register two 16-bit values, the lower index in the lower half: the kernel
// SDK's instruction (hk/kernel_sdk_sm80.cuh) with the A registers passed one by one.
template <class T>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  const uint32_t a[4] = {a0, a1, a2, a3};
  hk::sdk::cuda::sm80::mma16816<T>(d, a, b0, b1);
}

// Eight 16-bit values of a uint4 (element e in register e/2, lower half first).
template <class T>
__device__ __forceinline__ float lane_value(const uint4& v, int e) {
  const uint32_t word = e < 2 ? v.x : e < 4 ? v.y : e < 6 ? v.z : v.w;
  const uint16_t bits = static_cast<uint16_t>((e & 1) ? (word >> 16) : (word & 0xffffu));
  T t;
  *reinterpret_cast<uint16_t*>(&t) = bits;
  return to_f32(t);
}
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  T a = from_f32<T>(lo), b = from_f32<T>(hi);
  return static_cast<uint32_t>(*reinterpret_cast<uint16_t*>(&a)) |
         (static_cast<uint32_t>(*reinterpret_cast<uint16_t*>(&b)) << 16);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Rotary inverse frequency j of a head dim d: θ^(−2j/d) computed as ops::rotary_tables does when
// θ > 0 (the default rope), else the model's own table (scaled ropes).
__device__ __forceinline__ float inverse_frequency(const float* table, float theta, int j, int d) {
  return theta > 0.0f ? 1.0f / powf(theta, static_cast<float>(2 * j) / static_cast<float>(d))
                      : table[j];
}

// SiLU as the built-in ops compute it (ops/cuda_common.cuh activation_forward).
__device__ __forceinline__ float silu(float x) {
  return x * __frcp_rn(1.0f + expf(-x));
}

inline cudaStream_t native(Stream s) {
  return static_cast<cudaStream_t>(s.handle);
}

// Launches `kernel` with `attribute` (none when null).
template <class... KernelArgs, class... Args>
void launch_with(const cudaLaunchAttribute* attribute, void (*kernel)(KernelArgs...), dim3 grid,
                 dim3 block, size_t smem, Stream stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = native(stream);
  cudaLaunchAttribute attributes[1];
  if (attribute != nullptr) attributes[0] = *attribute;
  config.attrs = attributes;
  config.numAttrs = attribute != nullptr ? 1 : 0;
  HK_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}
// Launches `kernel` with the PDL attribute when pdl_enabled().
template <class... KernelArgs, class... Args>
void launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, Stream stream,
            Args&&... args) {
  cudaLaunchAttribute pdl;
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  launch_with(pdl_enabled() ? &pdl : nullptr, kernel, grid, block, smem, stream,
              std::forward<Args>(args)...);
}
// Launches `kernel` cooperatively: every block resident at once (blocks that wait on each other).
template <class... KernelArgs, class... Args>
void launch_cooperative(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                        Stream stream, Args&&... args) {
  cudaLaunchAttribute cooperative;
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = 1;
  launch_with(&cooperative, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

// The shared-memory-staged gemv (gemv_bulk_sm90.cu): its 8-row groups a block for `p` (0 when it
// cannot serve it, the reason in *why when asked), and its launch with them (p already checked
// by gemv_unsupported).
int bulk_groups(const GemvParams& p, std::string* why);
void gemv_bulk(const GemvParams& p, int groups, Stream stream);

// Raises a kernel's dynamic shared memory limit as launches need more (per process and kernel).
void allow_dynamic_smem(const void* kernel, size_t bytes);
int device_sm_count();
// The current device is sm_90 or later (PDL, bulk copies); asked once a process.
bool device_is_sm90_or_later();

}  // namespace hk::decode::detail
