// Internal: what the two decode GEMV kernels share — the kernel arguments, the segment lookup,
// the 16-bit vector steps of the RMSNorm prologue and the output store with bias and the SwiGLU
// pair — and the entry points of the wide kernel (gemv_wide_cuda.cu, 17–64 rows) that
// gemv_cuda.cu routes to. Only included by src/ops/decode/gemv*_cuda.cu; no kernels here.
#pragma once

#include <string>

#include "ops/decode/decode_common.cuh"

namespace hk::decode::detail {

// Rows of x the one-m-tile kernel (gemv_cuda.cu) serves with 16-bit weights; more go to the wide
// kernel (gemv_wide_cuda.cu).
constexpr int64_t kGemvNarrowMaxRows = 16;

struct GemvArgs {
  int m = 0, k = 0;
  const void* x = nullptr;
  int64_t x_stride = 0;
  GemvPrologue pro;  // read when the kernel has the prologue
  const void* w[3] = {};
  const void* bias[3] = {};
  void* out[3] = {};
  int64_t out_stride[3] = {};
  int n[3] = {};
  int tile_begin[4] = {};
  int num_segments = 0;
  // wide kernel only: blocks per cluster (k split), the shared x row stride (elements) and the
  // byte sizes of the shared x slice and of the area after it (reduction / prologue delta).
  int cluster = 1, xs_stride = 0, xs_bytes = 0, area_bytes = 0;
};

// The arguments common to both kernels (tiles of `rows_per_tile` weight rows; with SiluMul only
// segment 0's tiles, the up rows ride along).
GemvArgs gemv_args(const GemvParams& p, int rows_per_tile, int& tiles);

__device__ __forceinline__ int segment_of(const GemvArgs& a, int tile) {
  int s = 0;
  while (s + 1 < a.num_segments && tile >= a.tile_begin[s + 1]) ++s;
  return s;
}

// round(v + d) elementwise (ops::add's rounding), eight 16-bit values.
template <class T>
__device__ __forceinline__ uint4 add_rounded16(const uint4& v, const uint4& d) {
  uint4 o;
  o.x = pack2<T>(lane_value<T>(v, 0) + lane_value<T>(d, 0),
                 lane_value<T>(v, 1) + lane_value<T>(d, 1));
  o.y = pack2<T>(lane_value<T>(v, 2) + lane_value<T>(d, 2),
                 lane_value<T>(v, 3) + lane_value<T>(d, 3));
  o.z = pack2<T>(lane_value<T>(v, 4) + lane_value<T>(d, 4),
                 lane_value<T>(v, 5) + lane_value<T>(d, 5));
  o.w = pack2<T>(lane_value<T>(v, 6) + lane_value<T>(d, 6),
                 lane_value<T>(v, 7) + lane_value<T>(d, 7));
  return o;
}
template <class T>
__device__ __forceinline__ float sum_squares16(const uint4& v) {
  float ss = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float f = lane_value<T>(v, e);
    ss += f * f;
  }
  return ss;
}
// round(round(v · r) · w) elementwise, as ops::rms_norm rounds.
template <class T>
__device__ __forceinline__ uint4 rms_scale16(const uint4& v, const uint4& w, float r) {
  float y[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) y[e] = round_as<T>(lane_value<T>(v, e) * r) * lane_value<T>(w, e);
  uint4 o;
  o.x = pack2<T>(y[0], y[1]);
  o.y = pack2<T>(y[2], y[3]);
  o.z = pack2<T>(y[4], y[5]);
  o.w = pack2<T>(y[6], y[7]);
  return o;
}

// out[col, j] of segment s from the f32 sum v (SiluMul: v = gate, u = up, both of segment
// 0/1's row j): bias added, then stored (Store) or round(silu(round(gate))) · round(up) as
// ops::act_mul after two rounded linears.
template <class T, bool kPair>
__device__ __forceinline__ void store_result(const GemvArgs& a, int s, int j, int col, float v,
                                             float u) {
  if constexpr (!kPair) {
    if (a.bias[s]) v += to_f32(static_cast<const T*>(a.bias[s])[j]);
    static_cast<T*>(a.out[s])[col * a.out_stride[s] + j] = from_f32<T>(v);
  } else {
    if (a.bias[0]) v += to_f32(static_cast<const T*>(a.bias[0])[j]);
    if (a.bias[1]) u += to_f32(static_cast<const T*>(a.bias[1])[j]);
    v = round_as<T>(v);
    u = round_as<T>(u);
    static_cast<T*>(a.out[0])[col * a.out_stride[0] + j] = from_f32<T>(round_as<T>(silu(v)) * u);
  }
}

// The wide kernel (17–64 rows, 16-bit): why it cannot serve `p` ("" when it can; the checks
// common to both kernels are gemv_unsupported's), and its launch.
std::string gemv_wide_unsupported(const GemvParams& p);
void gemv_wide(const GemvParams& p, Stream stream);

}  // namespace hk::decode::detail
