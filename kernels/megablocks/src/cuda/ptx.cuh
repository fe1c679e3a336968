// ptx.cuh — the PTX instructions of the grouped GEMMs (grouped_gemm.cuh), from the kernel SDK's
// hk/kernel_sdk_sm80.cuh (shared with flash-attn), with the generic-pointer forms these kernels
// use: cp.async copies, ldmatrix fragment loads and the m16n8k16 tensor-core MMA. The CPU
// emulation of the device (device_compat.cuh) replaces this header with the same names.
#pragma once

#include <cstdint>

#include "hk/kernel_sdk_sm80.cuh"

namespace megablocks::cuda {

using hk::sdk::cuda::sm80::cp_async_commit;
using hk::sdk::cuda::sm80::cp_async_wait;
using hk::sdk::cuda::sm80::mma16816;

// 16 bytes to a shared-memory address (as __cvta_generic_to_shared gives), or 16 zero bytes.
__device__ __forceinline__ void cp_async16_shared(unsigned smem, const void* gmem, bool valid) {
  hk::sdk::cuda::sm80::cp_async16(smem, gmem, valid);
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  cp_async16_shared(static_cast<unsigned>(__cvta_generic_to_shared(smem)), gmem, valid);
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  hk::sdk::cuda::sm80::ldmatrix_x4(r, static_cast<uint32_t>(__cvta_generic_to_shared(smem)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  hk::sdk::cuda::sm80::ldmatrix_x4_trans(r, static_cast<uint32_t>(__cvta_generic_to_shared(smem)));
}

}  // namespace megablocks::cuda
