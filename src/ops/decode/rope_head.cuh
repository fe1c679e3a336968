// Internal: the q/k RMSNorm + rotary + KV-cache write of decode::qk_rope_cache as device pieces,
// shared by its kernel (a block per (head, row), any even head dim up to 2048) and by the decode
// attention's fused form (a warp per head of its own GQA group, head dim up to 256, before it
// attends). Rounding as the unfused layers: the norm output is rounded to the dtype
// (ops::rms_norm), the rotation is computed in f32 from it and rounded once
// (ops::rotary_embedding), with cos/sin = cos/sin(position·inv_freq) in f32 as ops::rotary_tables.
// No kernels and no PDL here: callers wait before `apply`.
#pragma once

#include "ops/decode/decode_common.cuh"

namespace hk::decode::detail {

struct RopeArgs {
  int heads_q = 0, heads_kv = 0, head_dim = 0;
  void* qkv = nullptr;
  int64_t qkv_stride = 0;
  int head_offset = 0;  // first head handled (heads_q when q is left alone)
  const void* q_norm = nullptr;
  const void* k_norm = nullptr;
  float eps = 0.0f;
  bool rotate = true;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  float theta = 0.0f, scaling = 1.0f;
  const int32_t* cache_index = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  int64_t c_bs = 0, c_rs = 0, capacity = 0;
};

inline RopeArgs rope_args(const QkRopeCacheParams& p) {
  RopeArgs a;
  a.heads_q = static_cast<int>(p.heads_q);
  a.heads_kv = static_cast<int>(p.heads_kv);
  a.head_dim = static_cast<int>(p.head_dim);
  a.qkv = p.qkv;
  a.qkv_stride = p.qkv_stride;
  a.head_offset = p.process_q ? 0 : a.heads_q;
  a.q_norm = p.q_norm_weight;
  a.k_norm = p.k_norm_weight;
  a.eps = p.eps;
  a.rotate = p.rotate;
  a.positions = p.positions;
  a.inv_freq = p.inv_freq;
  a.theta = p.rope_theta;
  a.scaling = p.attention_scaling;
  a.cache_index = p.cache_index;
  a.k_cache = p.k_cache;
  a.v_cache = p.v_cache;
  a.c_bs = p.cache_batch_stride;
  a.c_rs = p.cache_row_stride;
  a.capacity = p.capacity;
  return a;
}

__device__ __forceinline__ float inverse_frequency(const float* table, float theta, int j, int d) {
  return theta > 0.0f ? 1.0f / powf(theta, static_cast<float>(2 * j) / static_cast<float>(d))
                      : table[j];
}

// 0: a q head, 1: a k head, 2: a v head of the fused q/k/v row.
__device__ __forceinline__ int rope_kind(const RopeArgs& a, int head) {
  return head < a.heads_q ? 0 : head < a.heads_q + a.heads_kv ? 1 : 2;
}
__device__ __forceinline__ const void* rope_norm(const RopeArgs& a, int kind) {
  return kind == 0 ? a.q_norm : kind == 1 ? a.k_norm : nullptr;
}

// One rotary pair (j, j + D/2) after the norm: scaled by 1/rms, rounded, times the weight,
// rounded; then rotated by position·freq unless `rotate` is off.
template <class T>
__device__ __forceinline__ void rope_pair(float& x1, float& x2, bool normed, float r, float w1,
                                          float w2, bool rotate, int32_t position, float freq,
                                          float scaling) {
  if (normed) {
    x1 = round_as<T>(round_as<T>(x1 * r) * w1);
    x2 = round_as<T>(round_as<T>(x2 * r) * w2);
  }
  if (rotate) {
    const float angle = static_cast<float>(position) * freq;
    const float c = cosf(angle) * scaling, s = sinf(angle) * scaling;
    const float y1 = x1 * c - x2 * s;
    const float y2 = x2 * c + x1 * s;
    x1 = y1;
    x2 = y2;
  }
}

// Where head `head` of row b goes: q in place, k and v to their cache row; null when the cache
// row is outside the cache (the host sizes the cache, so nothing is written).
template <class T>
__device__ __forceinline__ T* rope_destination(const RopeArgs& a, int kind, int head, int b,
                                               int64_t cache_row) {
  T* src = static_cast<T*>(a.qkv) + int64_t(b) * a.qkv_stride + int64_t(head) * a.head_dim;
  if (kind == 0) return src;
  if (cache_row < 0 || cache_row >= a.capacity) return nullptr;
  T* cache = static_cast<T*>(kind == 1 ? a.k_cache : a.v_cache);
  const int kv_head = head - a.heads_q - (kind == 2 ? a.heads_kv : 0);
  return cache + int64_t(b) * a.c_bs + cache_row * a.c_rs + int64_t(kv_head) * a.head_dim;
}

// A warp's share of one head: pairs j = lane + 32·t, t < kRopeWarpPairs (head dim up to 256).
constexpr int kRopeWarpPairs = 4;
struct RopeWarpHead {
  int head = -1, kind = 0;
  float w1[kRopeWarpPairs], w2[kRopeWarpPairs], freq[kRopeWarpPairs];
};

// The weights and frequencies (no kernel writes them): read before the PDL wait.
template <class T>
__device__ __forceinline__ RopeWarpHead rope_warp_prepare(const RopeArgs& a, int head, int lane) {
  RopeWarpHead h;
  h.head = head;
  h.kind = rope_kind(a, head);
  const T* norm = static_cast<const T*>(rope_norm(a, h.kind));
  const int half = a.head_dim / 2;
#pragma unroll
  for (int t = 0; t < kRopeWarpPairs; ++t) {
    const int j = lane + 32 * t;
    const bool on = j < half;
    h.w1[t] = on && norm ? to_f32(norm[j]) : 1.0f;
    h.w2[t] = on && norm ? to_f32(norm[j + half]) : 1.0f;
    h.freq[t] = on && h.kind != 2 && a.rotate
                    ? inverse_frequency(a.inv_freq, a.theta, j, a.head_dim)
                    : 0.0f;
  }
  return h;
}

// Norm + rotary + write of the warp's head of row b (after the wait: q/k/v, positions and the
// cache index come from the step's kernels).
template <class T>
__device__ __forceinline__ void rope_warp_apply(const RopeArgs& a, const RopeWarpHead& h, int b,
                                                int lane) {
  const int D = a.head_dim, half = D / 2;
  const T* src = static_cast<const T*>(a.qkv) + int64_t(b) * a.qkv_stride + int64_t(h.head) * D;
  float x1[kRopeWarpPairs], x2[kRopeWarpPairs];
  float ss = 0.0f;
#pragma unroll
  for (int t = 0; t < kRopeWarpPairs; ++t) {
    const int j = lane + 32 * t;
    x1[t] = j < half ? to_f32(src[j]) : 0.0f;
    x2[t] = j < half ? to_f32(src[j + half]) : 0.0f;
    ss += x1[t] * x1[t] + x2[t] * x2[t];
  }
  const bool normed = rope_norm(a, h.kind) != nullptr;
  const float r = normed ? rsqrtf(warp_sum(ss) / static_cast<float>(D) + a.eps) : 1.0f;
  const bool rotate = h.kind != 2 && a.rotate;
  const int32_t position = rotate ? a.positions[b] : 0;
  T* dst = rope_destination<T>(a, h.kind, h.head, b, h.kind != 0 ? a.cache_index[b] : 0);
  if (!dst) return;
#pragma unroll
  for (int t = 0; t < kRopeWarpPairs; ++t) {
    const int j = lane + 32 * t;
    if (j >= half) break;
    rope_pair<T>(x1[t], x2[t], normed, r, h.w1[t], h.w2[t], rotate, position, h.freq[t], a.scaling);
    dst[j] = from_f32<T>(x1[t]);
    dst[j + half] = from_f32<T>(x2[t]);
  }
}

}  // namespace hk::decode::detail
