// flash_attn/device_common.cuh — device helpers shared by every flash kernel: the mma.sync,
// ldmatrix and cp.async wrappers, the swizzled shared-memory tile addressing, and the per-row
// geometry (sequence lengths, visible key ranges) that forward and backward agree on.
//
// Tiles in shared memory are rows of head_dim 16-bit values; 16-byte chunk c of row r lives at
// chunk (c ^ (r & 7)), so the 8 rows an ldmatrix phase reads hit 8 different bank groups.
// Not here: any kernel, any host code.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

#include "flash_attn/dq_tiles.h"
#include "flash_attn/flash.h"
#include "flash_attn/stream_jobs.h"
#include "hk/kernel_sdk_cuda.cuh"
#include "hk/kernel_sdk_sm80.cuh"

namespace hk_flash {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- tensor-core primitives (sm_80+): the kernel SDK's (hk/kernel_sdk_sm80.cuh)
using hk::sdk::cuda::sm80::cp_async16;
using hk::sdk::cuda::sm80::cp_async_commit;
using hk::sdk::cuda::sm80::cp_async_wait;
using hk::sdk::cuda::sm80::grid_launch_dependents;  // programmatic dependent launch
using hk::sdk::cuda::sm80::grid_wait;
using hk::sdk::cuda::sm80::ldmatrix_x4;
using hk::sdk::cuda::sm80::ldmatrix_x4_trans;
using hk::sdk::cuda::sm80::mma16816;
using hk::sdk::cuda::sm80::prefetch_l2;

template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t v);
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
}
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t v) {
  return __half22float2(*reinterpret_cast<__half2*>(&v));
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
// 2^x on the special-function unit (flushes denormal results to 0; 2^-inf = 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile whose rows are `row_bytes`.
__device__ __forceinline__ uint32_t tile_offset(int row, int chunk, int row_bytes) {
  return static_cast<uint32_t>(row * row_bytes + ((chunk ^ (row & 7)) << 4));
}

// Loads rows [0, rows) of a [rows × D] tile from global (row r at base + r·row_stride elements,
// rows ≥ valid_rows zero-filled) into a swizzled shared tile with all `threads` threads.
template <class T, int D>
__device__ __forceinline__ void load_tile_async(uint32_t smem, const T* base, int64_t row_stride,
                                                int rows, int valid_rows, int tid, int threads) {
  constexpr int kChunks = D / 8;
  for (int i = tid; i < rows * kChunks; i += threads) {
    const int r = i / kChunks, c = i % kChunks;
    const bool valid = r < valid_rows;
    const T* src = valid ? base + r * row_stride + c * 8 : base;
    cp_async16(smem + tile_offset(r, c, D * 2), src, valid);
  }
}

// ---- geometry ---------------------------------------------------------------------------------
// One sequence of the batch as a kernel sees it.
struct SeqInfo {
  int64_t q_row0 = 0, k_row0 = 0;  // first packed row (varlen) — 0 in batch layout
  int S = 0, T = 0;                // queries, keys of this sequence
  int key_start = 0;               // first visible key
};

__device__ __forceinline__ SeqInfo seq_info(const Params& p, int b) {
  SeqInfo s;
  if (p.cu_seqlens_q != nullptr) {
    s.q_row0 = p.cu_seqlens_q[b];
    s.S = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    s.k_row0 = p.cu_seqlens_k[b];
    s.T = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  } else {
    s.S = p.seqlen_q;
    s.T = p.seqlens_k != nullptr ? min(p.seqlens_k[b] + p.seqlens_k_add, p.seqlen_k) : p.seqlen_k;
  }
  if (p.key_start != nullptr) {
    const int64_t ks = p.key_start_i64 ? static_cast<const int64_t*>(p.key_start)[b]
                                       : static_cast<const int32_t*>(p.key_start)[b];
    s.key_start = static_cast<int>(max(int64_t(0), min(ks, int64_t(s.T))));
  }
  return s;
}

// Visible keys [lo, hi) of query row s (0 ≤ s < S).
struct KeyRange {
  int lo, hi;
};
__device__ __forceinline__ KeyRange key_range(const Params& p, const SeqInfo& q, int s) {
  const int diag = s + q.T - q.S;  // the last key a causal query sees
  int hi = p.causal ? min(q.T, diag + 1) : q.T;
  int lo = q.key_start;
  if (p.window_left >= 0) lo = max(lo, diag - p.window_left);
  return {lo, max(lo, hi)};
}

// Element offsets of row `row` (packed or batch) of head `h` of a strided [.., rows, H, D] tensor.
__device__ __forceinline__ int64_t row_offset(const Strides& st, int b, int64_t row0, int row,
                                              int h) {
  return static_cast<int64_t>(b) * st.batch + (row0 + row) * st.row +
         static_cast<int64_t>(h) * st.head;
}
__device__ __forceinline__ int64_t lse_offset(const Params& p, int b, int64_t row0, int row,
                                              int h) {
  return p.cu_seqlens_q != nullptr ? h * p.lse_head + row0 + row
                                   : static_cast<int64_t>(b) * p.lse_batch + h * p.lse_head + row;
}

// The backward's f32 row dots Di = Σ dO·O and dq accumulator: contiguous [B, Hq, S] / [Hq, Sq]
// and [B, S, Hq, D] / [Sq, Hq, D].
__device__ __forceinline__ int64_t di_offset(const Params& p, int b, int64_t row0, int row, int h) {
  return p.cu_seqlens_q != nullptr ? static_cast<int64_t>(h) * p.total_q + row0 + row
                                   : (static_cast<int64_t>(b) * p.heads_q + h) * p.seqlen_q + row;
}
__device__ __forceinline__ int64_t dq_accum_offset(const Params& p, int b, int64_t row0, int row,
                                                   int h) {
  const int64_t r =
      p.cu_seqlens_q != nullptr ? row0 + row : static_cast<int64_t>(b) * p.seqlen_q + row;
  return (r * p.heads_q + h) * p.head_dim;
}
// The Hopper backward's dq accumulator (batch layouts only) is tiled the way its warps hold dQ,
// so each part leaves by one flat bulk reduce-add from shared memory: per (b, h, 64-row tile) a
// block of 64 × D floats, per 64 columns in the word order of dq_tiles.h. The rows past S in the
// last tile are written, never read.
__device__ __forceinline__ int64_t dq_tiled_index(const Params& p, int b, int row, int h, int d) {
  const int tiles = (p.seqlen_q + kDqTileRows - 1) / kDqTileRows;
  const int64_t tile = (static_cast<int64_t>(b) * p.heads_q + h) * tiles + row / kDqTileRows;
  return tile * kDqTileRows * p.head_dim + (d / 64) * 64 * 64 +
         dq_tile_float(row % kDqTileRows, d % 64);
}

#ifdef HK_FLASH_TRACE
// HK_FLASH_TRACE builds only (measurement, never shipped): the row of Params::trace that
// warpgroup wg of this block stamps, in the [block][warpgroup][tile][phases] layout
// hk_bench_flash_kernels reads; null when the call has no trace buffer.
__device__ __forceinline__ unsigned long long* trace_row(const Params& p, int wg, int phases) {
  if (p.trace == nullptr) return nullptr;
  const int64_t block =
      blockIdx.x + gridDim.x * (blockIdx.y + static_cast<int64_t>(gridDim.y) * blockIdx.z);
  return p.trace + (block * 2 + wg) * kTraceTiles * phases;
}
// The block's life in tile slot 0 of each consumer warpgroup's row (the key-tile stamps start at
// stream index 1): the SM, clock64 at the start, at the first S issue, at the last tile's epilogue
// and at the end — the benchmark works out the start and end costs, and the idle time between
// consecutive blocks on one SM (clock64 counts per SM, so those gaps are exact).
enum TraceBlockSlot { kTraceSm, kTraceStart, kTraceFirstS, kTraceEpilogue, kTraceEnd };
__device__ __forceinline__ void trace_block(unsigned long long* row, TraceBlockSlot slot) {
  if (row == nullptr) return;
  unsigned long long v;
  if (slot == kTraceSm) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
    v = sm;
  } else {
    asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(v));
  }
  row[slot] = v;
}
// clock64 into phase k of tile `tile` (the first kTraceTiles tiles; nothing on a null row).
__device__ __forceinline__ void trace_stamp(unsigned long long* row, int tile, int phases, int k) {
  if (row == nullptr || tile >= kTraceTiles) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(t));
  row[tile * phases + k] = t;
}
#endif

// This block's (head, position) in block_order_of's order (stream_jobs.h says why that order).
__device__ __forceinline__ BlockOrder block_order(int heads, int positions, int heads_per_section) {
  return block_order_of(static_cast<int>(blockIdx.x), heads, positions, heads_per_section);
}

// How raw q·k dots become log2-domain scores: without softcap one FFMA per element inside the
// exponent (exp2(s·scale_log2 − m)), so the row max is taken over the raw dots (scale > 0 keeps
// the order); with softcap the dots first become softcap·tanh(s·scale/softcap) (natural units)
// and scale_log2 is log2(e). Kernels branch on `softcap` once per tile, never per element.
struct ScoreMap {
  float scale_log2;
  float cap_in = 0.0f;   // scale / softcap
  float cap_out = 0.0f;  // softcap (0: none)
  __device__ __forceinline__ bool softcap() const { return cap_out != 0.0f; }
  __device__ __forceinline__ float cap(float s) const { return cap_out * tanhf(s * cap_in); }
};
__device__ __forceinline__ ScoreMap score_map(const Params& p, float scale) {
  ScoreMap m;
  if (p.softcap > 0.0f) {
    m.scale_log2 = kLog2e;
    m.cap_in = scale / p.softcap;
    m.cap_out = p.softcap;
  } else {
    m.scale_log2 = scale * kLog2e;
  }
  return m;
}

}  // namespace hk_flash
