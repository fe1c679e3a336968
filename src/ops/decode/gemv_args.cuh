// Internal: the kernel-side arguments of the decode gemv (one struct passed by value), built from
// decode::GemvParams once per launch, shared by the mma.sync gemv (gemv_cuda.cu) and the
// shared-memory-staged one (gemv_bulk_sm90.cu). A launch walks tiles of `rows_per_tile` weight
// rows: segment s owns tiles [tile_begin[s], tile_begin[s + 1]); the SwiGLU pair owns one tile
// range for both of its weights; a launch may also prefetch a later launch's weights into L2. It
// deliberately checks nothing: gemv_unsupported does.
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
  GemvL2Range l2_prefetch[3];
  bool l2_lines = false;  // prefetch_later_weights by lines (HK_DECODE_L2_FORM=lines)
};

// The block asks L2 for its share of the later launch's weights (GemvParams::l2_prefetch) before
// the wait, so the weight stream runs while the chain of dependent launches waits: with
// `l2_lines` every thread prefetches 128-byte lines (the load/store path), else thread `issuer`
// issues bulk prefetches (the copy engine the staged gemv also stages its weights with).
__device__ __forceinline__ void prefetch_later_weights(const GemvArgs& a, int issuer) {
  constexpr int64_t kPiece = 64 * 1024;  // one bulk prefetch at most (a hint of bounded size)
  for (const GemvL2Range& r : a.l2_prefetch) {
    if (r.bytes < 16) continue;
    const int64_t share = ((r.bytes + gridDim.x - 1) / gridDim.x + 127) / 128 * 128;
    const int64_t begin = int64_t(blockIdx.x) * share;
    const int64_t end = min(r.bytes, begin + share) / 16 * 16;
    const char* base = static_cast<const char*>(r.ptr);
    if (a.l2_lines) {
      for (int64_t off = begin + int64_t(threadIdx.x) * 128; off < end;
           off += int64_t(blockDim.x) * 128)
        prefetch_l2(base + off);
    } else if (int(threadIdx.x) == issuer) {
      for (int64_t off = begin; off < end; off += kPiece)
        bulk_prefetch_l2(base + off, static_cast<uint32_t>(min(kPiece, end - off)));
    }
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
  for (int i = 0; i < 3; ++i) a.l2_prefetch[i] = p.l2_prefetch[i];
  a.l2_lines = l2_prefetch_by_lines();
  return a;
}

}  // namespace hk::decode::detail
