// Internal: the kernel-side arguments of the decode gemv (one struct passed by value), built from
// decode::GemvParams once per launch, shared by the mma.sync gemv (gemv_cuda.cu) and the
// shared-memory-staged one (gemv_bulk_sm90.cu). A launch walks tiles of `rows_per_tile` weight
// rows: segment s owns tiles [tile_begin[s], tile_begin[s + 1]); the SwiGLU pair owns one tile
// range for both of its weights. It deliberately checks nothing: gemv_unsupported does.
#pragma once

#include <cstdint>

#include "ops/decode/decode_common.cuh"
#include "ops/decode/decode_kernels.h"

namespace hk::decode::detail {

struct GemvArgs {
  int m = 0, k = 0;
  const void* x = nullptr;
  int64_t x_stride = 0;
  GemvPrologue prologue;  // as given (read only by the prologue instances)
  const void* w[3] = {};
  const void* bias[3] = {};
  void* out[3] = {};
  int64_t out_stride[3] = {};
  int n[3] = {};
  int tile_begin[4] = {};
  int num_segments = 0;
  uint64_t* trace = nullptr;  // GemvParams::trace
};

// Thread 0's %globaltimer at phase `point` of a traced launch (GemvParams::trace), read once
// `after` has been computed (so a stamp can wait for the loads behind a value).
__device__ __forceinline__ void trace_point(const GemvArgs& a, int point, float after = 0.0f) {
  if (a.trace && threadIdx.x == 0) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "f"(after));
    a.trace[blockIdx.x * kGemvTracePoints + point] = t;
  }
}

__device__ __forceinline__ int segment_of(const GemvArgs& a, int tile) {
  int s = 0;
  while (s + 1 < a.num_segments && tile >= a.tile_begin[s + 1]) ++s;
  return s;
}

// Output (x row `row`, weight row j) of segment s from its f32 sums: + bias, rounded; SwiGLU
// (kPair): gate and up each rounded, silu(gate) rounded, times up — the rounding points both gemv
// kernels share (decode_kernels.h).
template <class T, bool kPair>
__device__ __forceinline__ void store_output(const GemvArgs& a, int s, int row, int j,
                                             const float (&sum)[kPair ? 2 : 1]) {
  if constexpr (!kPair) {
    float v = sum[0];
    if (a.bias[s]) v += to_f32(static_cast<const T*>(a.bias[s])[j]);
    static_cast<T*>(a.out[s])[row * a.out_stride[s] + j] = from_f32<T>(v);
  } else {
    float gv = sum[0], uv = sum[1];
    if (a.bias[0]) gv += to_f32(static_cast<const T*>(a.bias[0])[j]);
    if (a.bias[1]) uv += to_f32(static_cast<const T*>(a.bias[1])[j]);
    gv = round_as<T>(gv);
    uv = round_as<T>(uv);
    static_cast<T*>(a.out[0])[row * a.out_stride[0] + j] = from_f32<T>(round_as<T>(silu(gv)) * uv);
  }
}

// The arguments of `p` for tiles of `rows_per_tile` weight rows; the launch's tile count is
// a.tile_begin[a.num_segments].
inline GemvArgs gemv_args(const GemvParams& p, int rows_per_tile) {
  GemvArgs a;
  a.m = static_cast<int>(p.m);
  a.k = static_cast<int>(p.k);
  a.x = p.x;
  a.x_stride = p.x_stride;
  if (p.has_prologue) a.prologue = p.prologue;
  const bool pair = p.epilogue == GemvEpilogue::SiluMul;
  a.num_segments = p.num_segments;
  int tiles = 0;
  for (int s = 0; s < p.num_segments; ++s) {
    a.w[s] = p.segments[s].weight;
    a.bias[s] = p.segments[s].bias;
    a.out[s] = p.segments[s].out;
    a.out_stride[s] = p.segments[s].out_stride;
    a.n[s] = static_cast<int>(p.segments[s].n);
    a.tile_begin[s] = tiles;
    if (!pair || s == 0)
      tiles += static_cast<int>((p.segments[s].n + rows_per_tile - 1) / rows_per_tile);
  }
  a.tile_begin[p.num_segments] = tiles;
  a.trace = p.trace;
  return a;
}

}  // namespace hk::decode::detail
