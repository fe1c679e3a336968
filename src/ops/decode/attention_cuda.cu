// Decode attention (decode_kernels.h): one query per row and q head against that row's cache,
// keys [key_start[b], lengths[b] + length_add) read from device memory, so one launch serves every
// step of a captured graph.
//
// A block serves one (row, kv head) and all the q heads of its GQA group, so each cached key and
// value is read once per group; its 4 warps (8 for grids that leave SMs idle) take interleaved
// keys, each lane EPL elements of the head dim, with an online softmax in f32 (scores = scale·q·k,
// flash semantics: probabilities are not rounded before P·V), one step per 32 (key, head) scores
// where the registers allow (lane_scores_loop), else one per key. When (rows × kv heads) cannot
// fill the device, the keys are split over `splits` blocks whose partial (max, sum, accumulator)
// land in a workspace; the last block of a (row, kv head) to finish (an atomic counter, reset by
// it) combines them in split order, so the result does not depend on scheduling. Old cache rows are
// prefetched into L2 before the PDL wait. With `eager` the probabilities are rounded to the dtype
// before P·V, as the eager op does (the "eager" attention implementation): two passes over the
// keys, no splits.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "hk/error.h"
#include "ops/decode/decode_common.cuh"

namespace hk::decode {
namespace {
using namespace detail;

constexpr int kAttnWarps = 4;
constexpr int kAttnThreads = kAttnWarps * 32;

struct AttnArgs {
  int heads_q = 0, heads_kv = 0, head_dim = 0, group = 0;
  const void* q = nullptr;
  int64_t q_bs = 0;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t c_bs = 0, c_rs = 0;
  const int32_t* lengths = nullptr;
  int length_add = 0;
  const int32_t* key_start = nullptr;
  void* out = nullptr;
  int64_t o_bs = 0;
  float scale = 0.0f;
  int splits = 1;
  float* ws = nullptr;
  int32_t* counters = nullptr;
};

template <class T, int EPL>
struct alignas(sizeof(T) * EPL >= 16 ? 16 : sizeof(T) * EPL) Pack {
  T v[EPL];
};

// EPL elements as loaded (vector loads of 4, 8 or 16 bytes, or two of 16), converted at use: a
// loop that loads several keys then holds raw registers, so the compiler issues every load of the
// loop before the first conversion waits (holding floats, it interleaved loads and conversions and
// each key's load waited in turn: ncu on the H200, batch 64 over 81 keys).
template <class T, int EPL>
__device__ __forceinline__ void load_raw(const T* p, Pack<T, EPL>& raw) {
  if constexpr (sizeof(T) * EPL >= 16) {
#pragma unroll
    for (int c = 0; c < int(sizeof(T) * EPL / 16); ++c)
      reinterpret_cast<uint4*>(&raw)[c] =
          *reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(p) + 16 * c);
  } else if constexpr (sizeof(T) * EPL == 8) {
    *reinterpret_cast<uint2*>(&raw) = *reinterpret_cast<const uint2*>(p);
  } else if constexpr (sizeof(T) * EPL == 4) {
    *reinterpret_cast<uint32_t*>(&raw) = *reinterpret_cast<const uint32_t*>(p);
  } else {
    raw.v[0] = p[0];
  }
}

template <class T, int EPL>
__device__ __forceinline__ void load_pack(const T* p, float (&out)[EPL]) {
  Pack<T, EPL> raw;
  load_raw<T, EPL>(p, raw);
#pragma unroll
  for (int i = 0; i < EPL; ++i) out[i] = to_f32(raw.v[i]);
}

// Prefetches the cached key and value rows [k0, k1) of one kv head into L2 (the block's threads).
template <class T>
__device__ __forceinline__ void prefetch_cached_rows(const T* kb, const T* vb, int k0, int k1,
                                                     int d, int64_t row_stride) {
  const int row_bytes = d * int(sizeof(T));
  for (int key = k0 + threadIdx.x; key < k1; key += int(blockDim.x))
    for (int off = 0; off < row_bytes; off += 128) {
      prefetch_l2(reinterpret_cast<const char*>(kb + int64_t(key) * row_stride) + off);
      prefetch_l2(reinterpret_cast<const char*>(vb + int64_t(key) * row_stride) + off);
    }
}

// This lane's EPL elements of the group's q heads (row b, kv head hk), times the scale; zeros
// for lanes past the head dim and heads past the group.
template <class T, int EPL, int MAXG>
__device__ __forceinline__ void load_scaled_q(const AttnArgs& a, int b, int hk, int lane,
                                              float (&q)[MAXG][EPL]) {
  const int d = a.head_dim, group = a.group;
  const T* qb = static_cast<const T*>(a.q) + int64_t(b) * a.q_bs + int64_t(hk) * group * d;
#pragma unroll
  for (int g = 0; g < MAXG; ++g) {
    if (g < group && lane * EPL < d) {
      load_pack<T, EPL>(qb + g * d + lane * EPL, q[g]);
#pragma unroll
      for (int e = 0; e < EPL; ++e) q[g][e] *= a.scale;
    } else {
#pragma unroll
      for (int e = 0; e < EPL; ++e) q[g][e] = 0.0f;
    }
  }
}

// A warp's keys of one step, base + u·W for u < U, as loaded (zeros past k1 and past the head
// dim), every load issued before any is used.
template <class T, int EPL, int U, int W>
__device__ __forceinline__ void load_step_keys(const AttnArgs& a, const T* kb, const T* vb,
                                               int base, int k1, int lane, bool lane_on,
                                               Pack<T, EPL> (&kraw)[U], Pack<T, EPL> (&vraw)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int key = base + u * W;
    if (key < k1 && lane_on) {
      load_raw<T, EPL>(kb + int64_t(key) * a.c_rs + lane * EPL, kraw[u]);
      load_raw<T, EPL>(vb + int64_t(key) * a.c_rs + lane * EPL, vraw[u]);
    } else {
#pragma unroll
      for (int e = 0; e < EPL; ++e) kraw[u].v[e] = vraw[u].v[e] = from_f32<T>(0.0f);
    }
  }
}

// One online-softmax step per key: each (key, head) score is a warp sum. For the shapes whose
// step does not fit lane_scores' registers (f32 or head dim 256 with small groups).
template <class T, int EPL, int MAXG, int W>
__device__ __forceinline__ void per_key_loop(const AttnArgs& a, const T* kb, const T* vb, int k0,
                                             int k1, int lane, int warp, bool lane_on,
                                             const float (&q)[MAXG][EPL], float (&m)[MAXG],
                                             float (&l)[MAXG], float (&acc)[MAXG][EPL]) {
  const int G = a.group;
  // keys a warp loads per step: 128 raw bytes a lane for each of k and v (16 keys at bf16, head
  // dim 128: the block's 64 keys a step cover a short cache in two), as before for groups of 8+
  constexpr int kRawKeys = 128 / int(sizeof(T) * EPL);
  constexpr int U = MAXG >= 8 ? (EPL >= 8 ? 4 : 8)
                              : (kRawKeys < 4    ? 4
                                 : kRawKeys > 16 ? 16
                                                 : kRawKeys);
  for (int base = k0 + warp; base < k1; base += W * U) {
    Pack<T, EPL> kraw[U], vraw[U];
    load_step_keys<T, EPL, U, W>(a, kb, vb, base, k1, lane, lane_on, kraw, vraw);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (base + u * W >= k1) break;  // warp-uniform
      float kv[EPL], vv[EPL];
#pragma unroll
      for (int e = 0; e < EPL; ++e) {
        kv[e] = to_f32(kraw[u].v[e]);
        vv[e] = to_f32(vraw[u].v[e]);
      }
      float s[MAXG];
#pragma unroll
      for (int g = 0; g < MAXG; ++g) {
        s[g] = 0.0f;
        if (g < G) {
#pragma unroll
          for (int e = 0; e < EPL; ++e) s[g] += q[g][e] * kv[e];
          s[g] = warp_sum(s[g]);
        }
      }
#pragma unroll
      for (int g = 0; g < MAXG; ++g) {
        if (g >= G) break;
        const float mn = fmaxf(m[g], s[g]);
        const float corr = expf(m[g] - mn);
        const float p = expf(s[g] - mn);
        l[g] = l[g] * corr + p;
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[g][e] = acc[g][e] * corr + p * vv[e];
        m[g] = mn;
      }
    }
  }
}

// Halving butterfly over a warp: at width H a lane keeps the half of `part` its bit H selects and
// adds its partner's copy of that half, so after H = 16..1 lane j holds part[j] summed over the
// warp. A template per width so that every index is a constant (with a loop over the widths, nvcc
// kept the array in local memory).
template <int H>
__device__ __forceinline__ void halving_butterfly(float (&part)[32], int lane) {
  const bool upper = (lane & H) != 0;
#pragma unroll
  for (int i = 0; i < H; ++i) {
    const float lo = part[i], hi = part[i + H];
    part[i] = (upper ? hi : lo) + __shfl_xor_sync(0xffffffffu, upper ? lo : hi, H);
  }
  if constexpr (H > 1) halving_butterfly<H / 2>(part, lane);
}

// Whether lane_scores_loop serves this shape: its step holds 32 / MAXG keys' raw k and v, at
// most 128 bytes of each a lane (bf16/f16 up to head dim 128; f32 with groups of 3+).
template <class T, int EPL, int MAXG>
constexpr bool lane_scores() {
  return MAXG <= 32 && int(sizeof(T)) * EPL * (32 / MAXG) <= 128;
}

// One online-softmax step per 32 (key, head) scores: a warp takes U = 32 / MAXG keys, each lane
// forms its partial dot products for all U·MAXG pairs, and a transposing butterfly (31 shuffles,
// where a warp sum per pair takes 5·32) leaves pair j's score on lane j. The exponentials are then
// one per lane, the max and sum are shuffles among the lanes of one head, and P·V fetches each
// pair's probability by shuffle. Per-warp m and l of head g live on the lanes with lane % MAXG ==
// g; the caller's m[g], l[g] get them at the end (ncu on the H200, batch 64 over 81 keys: the
// per-key form was bound by its shuffles and its serial exp chain, not by memory).
template <class T, int EPL, int MAXG, int W>
__device__ __forceinline__ void lane_scores_loop(const AttnArgs& a, const T* kb, const T* vb,
                                                 int k0, int k1, int lane, int warp, bool lane_on,
                                                 const float (&q)[MAXG][EPL], float (&m)[MAXG],
                                                 float (&l)[MAXG], float (&acc)[MAXG][EPL]) {
  constexpr int U = 32 / MAXG;
  const int G = a.group, my_g = lane % MAXG;
  float my_m = -INFINITY, my_l = 0.0f;
  for (int base = k0 + warp; base < k1; base += W * U) {
    Pack<T, EPL> kraw[U], vraw[U];
    load_step_keys<T, EPL, U, W>(a, kb, vb, base, k1, lane, lane_on, kraw, vraw);
    float part[32];  // pair j = u·MAXG + g
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int g = 0; g < MAXG; ++g) {
        float sum = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) sum += q[g][e] * to_f32(kraw[u].v[e]);
        part[u * MAXG + g] = sum;
      }
    halving_butterfly<16>(part, lane);
    const int my_key = base + (lane / MAXG) * W;
    const float s = my_key < k1 && my_g < G ? part[0] : -INFINITY;
    float chunk_max = s;
#pragma unroll
    for (int o = MAXG; o < 32; o <<= 1)
      chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, o));
    const float mn = fmaxf(my_m, chunk_max);
    const float corr = mn == -INFINITY ? 1.0f : expf(my_m - mn);
    const float p = s == -INFINITY ? 0.0f : expf(s - mn);
    float p_sum = p;
#pragma unroll
    for (int o = MAXG; o < 32; o <<= 1) p_sum += __shfl_xor_sync(0xffffffffu, p_sum, o);
    my_l = my_l * corr + p_sum;
    my_m = mn;
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
      const float c = __shfl_sync(0xffffffffu, corr, g);
#pragma unroll
      for (int e = 0; e < EPL; ++e) acc[g][e] *= c;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (base + u * W >= k1) break;  // warp-uniform
      float vv[EPL];
#pragma unroll
      for (int e = 0; e < EPL; ++e) vv[e] = to_f32(vraw[u].v[e]);
#pragma unroll
      for (int g = 0; g < MAXG; ++g) {
        const float pg = __shfl_sync(0xffffffffu, p, u * MAXG + g);
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[g][e] += pg * vv[e];
      }
    }
  }
#pragma unroll
  for (int g = 0; g < MAXG; ++g) {
    m[g] = __shfl_sync(0xffffffffu, my_m, g);
    l[g] = __shfl_sync(0xffffffffu, my_l, g);
  }
}

template <class T, int EPL, int MAXG, bool kLaneScores, int W>
__global__ void __launch_bounds__(W * 32) decode_attention_kernel(const AttnArgs a) {
  extern __shared__ float sm[];
  const int bh = blockIdx.x, b = bh / a.heads_kv, hk = bh % a.heads_kv, split = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int D = a.head_dim, G = a.group;
  const bool lane_on = lane * EPL < D;
  const T* kb = static_cast<const T*>(a.k) + int64_t(b) * a.c_bs + int64_t(hk) * D;
  const T* vb = static_cast<const T*>(a.v) + int64_t(b) * a.c_bs + int64_t(hk) * D;

  // Lengths come from an earlier step (the host, or the previous step's last kernel), which has
  // completed before this step's first (non-PDL) kernel ran: safe to read before the wait. Only the
  // key this step appends is written by the predecessor.
  const int len = a.lengths[b] + a.length_add;
  const int ks = a.key_start ? max(0, a.key_start[b]) : 0;
  const int total = max(0, len - ks);
  const int per = (total + a.splits - 1) / a.splits;
  const int k0 = ks + split * per, k1 = min(len, k0 + per);
  prefetch_cached_rows(kb, vb, k0, k1 - a.length_add, D, a.c_rs);
  grid_wait();
  grid_launch_dependents();

  float q[MAXG][EPL];
  load_scaled_q<T, EPL, MAXG>(a, b, hk, lane, q);
  float m[MAXG], l[MAXG], acc[MAXG][EPL];
#pragma unroll
  for (int g = 0; g < MAXG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < EPL; ++e) acc[g][e] = 0.0f;
  }

  if constexpr (kLaneScores) {
    lane_scores_loop<T, EPL, MAXG, W>(a, kb, vb, k0, k1, lane, warp, lane_on, q, m, l, acc);
  } else {
    per_key_loop<T, EPL, MAXG, W>(a, kb, vb, k0, k1, lane, warp, lane_on, q, m, l, acc);
  }

  // Combine the warps: sm = acc [warps][MAXG][D], then m, l [warps][MAXG].
  float* s_acc = sm;
  float* s_m = sm + W * MAXG * D;
  float* s_l = s_m + W * MAXG;
#pragma unroll
  for (int g = 0; g < MAXG; ++g) {
    if (g >= G) break;
    if (lane_on)
#pragma unroll
      for (int e = 0; e < EPL; ++e) s_acc[(warp * MAXG + g) * D + lane * EPL + e] = acc[g][e];
    if (lane == 0) {
      s_m[warp * MAXG + g] = m[g];
      s_l[warp * MAXG + g] = l[g];
    }
  }
  __syncthreads();
  const int hq0 = hk * G;
  float* ws_m = a.ws;
  float* ws_l = a.ws ? a.ws + int64_t(gridDim.x / a.heads_kv) * a.heads_q * a.splits : nullptr;
  float* ws_acc = a.ws ? ws_l + int64_t(gridDim.x / a.heads_kv) * a.heads_q * a.splits : nullptr;
  for (int i = threadIdx.x; i < G * D; i += W * 32) {
    const int g = i / D, d = i % D;
    float M = -INFINITY;
    for (int w = 0; w < W; ++w) M = fmaxf(M, s_m[w * MAXG + g]);
    float L = 0.0f, A = 0.0f;
    if (M != -INFINITY)
      for (int w = 0; w < W; ++w) {
        const float mw = s_m[w * MAXG + g];
        if (mw == -INFINITY) continue;
        const float f = expf(mw - M);
        L += s_l[w * MAXG + g] * f;
        A += s_acc[(w * MAXG + g) * D + d] * f;
      }
    if (a.splits == 1) {
      static_cast<T*>(a.out)[int64_t(b) * a.o_bs + int64_t(hq0 + g) * D + d] =
          from_f32<T>(L > 0.0f ? A / L : 0.0f);
    } else {
      const int64_t slot = (int64_t(b) * a.heads_q + hq0 + g) * a.splits + split;
      if (d == 0) {
        ws_m[slot] = M;
        ws_l[slot] = L;
      }
      ws_acc[slot * D + d] = A;
    }
  }
  if (a.splits == 1) return;

  __shared__ int is_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&a.counters[bh], 1) == a.splits - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  for (int i = threadIdx.x; i < G * D; i += W * 32) {
    const int g = i / D, d = i % D;
    const int64_t first = (int64_t(b) * a.heads_q + hq0 + g) * a.splits;
    float M = -INFINITY;
    for (int sp = 0; sp < a.splits; ++sp) M = fmaxf(M, __ldcg(ws_m + first + sp));
    float L = 0.0f, A = 0.0f;
    if (M != -INFINITY)
      for (int sp = 0; sp < a.splits; ++sp) {
        const float ms = __ldcg(ws_m + first + sp);
        if (ms == -INFINITY) continue;
        const float f = expf(ms - M);
        L += __ldcg(ws_l + first + sp) * f;
        A += __ldcg(ws_acc + (first + sp) * D + d) * f;
      }
    static_cast<T*>(a.out)[int64_t(b) * a.o_bs + int64_t(hq0 + g) * D + d] =
        from_f32<T>(L > 0.0f ? A / L : 0.0f);
  }
  if (threadIdx.x == 0) a.counters[bh] = 0;
}

// Eager semantics (the eager op and Transformers' eager attention): softmax in f32 over the visible
// keys, probabilities rounded to the dtype, then P·V accumulated in f32 and rounded once. Two
// passes over the keys of one (row, kv head) in one block (no key splits: the normalisation must be
// known before the rounding): the first finds each head's max and sum (online, per warp, combined
// over the warps in a fixed order), the second accumulates round(p)·v.
template <class T, int EPL, int MAXG>
__global__ void __launch_bounds__(kAttnThreads) decode_attention_eager_kernel(const AttnArgs a) {
  extern __shared__ float sm[];
  const int bh = blockIdx.x, b = bh / a.heads_kv, hk = bh % a.heads_kv;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int D = a.head_dim, G = a.group;
  const bool lane_on = lane * EPL < D;
  const T* kb = static_cast<const T*>(a.k) + int64_t(b) * a.c_bs + int64_t(hk) * D;
  const T* vb = static_cast<const T*>(a.v) + int64_t(b) * a.c_bs + int64_t(hk) * D;
  const int len = a.lengths[b] + a.length_add;
  const int k0 = a.key_start ? max(0, a.key_start[b]) : 0, k1 = len;
  prefetch_cached_rows(kb, vb, k0, k1 - a.length_add, D, a.c_rs);
  grid_wait();
  grid_launch_dependents();

  float q[MAXG][EPL];
  load_scaled_q<T, EPL, MAXG>(a, b, hk, lane, q);
  constexpr int U = EPL >= 8 ? 4 : 8;
  // pass 1: max and sum per head
  float m[MAXG], l[MAXG];
#pragma unroll
  for (int g = 0; g < MAXG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
  }
  for (int base = k0 + warp; base < k1; base += kAttnWarps * U) {
    float kv[U][EPL];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int key = base + u * kAttnWarps;
      if (key < k1 && lane_on) {
        load_pack<T, EPL>(kb + int64_t(key) * a.c_rs + lane * EPL, kv[u]);
      } else {
#pragma unroll
        for (int e = 0; e < EPL; ++e) kv[u][e] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (base + u * kAttnWarps >= k1) break;  // warp-uniform
#pragma unroll
      for (int g = 0; g < MAXG; ++g) {
        if (g >= G) break;
        float sc = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) sc += q[g][e] * kv[u][e];
        sc = warp_sum(sc);
        const float mn = fmaxf(m[g], sc);
        l[g] = l[g] * expf(m[g] - mn) + expf(sc - mn);
        m[g] = mn;
      }
    }
  }
  float* s_m = sm;                         // [warps][MAXG]
  float* s_l = s_m + kAttnWarps * MAXG;    // [warps][MAXG]
  float* s_acc = s_l + kAttnWarps * MAXG;  // [warps][MAXG][D]
  if (lane == 0)
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
      s_m[warp * MAXG + g] = m[g];
      s_l[warp * MAXG + g] = l[g];
    }
  __syncthreads();
  float M[MAXG], inv_l[MAXG];
#pragma unroll
  for (int g = 0; g < MAXG; ++g) {
    float mx = -INFINITY;
    for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, s_m[w * MAXG + g]);
    float sum = 0.0f;
    if (mx != -INFINITY)
      for (int w = 0; w < kAttnWarps; ++w)
        if (s_m[w * MAXG + g] != -INFINITY) sum += s_l[w * MAXG + g] * expf(s_m[w * MAXG + g] - mx);
    M[g] = mx;
    inv_l[g] = sum > 0.0f ? 1.0f / sum : 0.0f;
  }
  // pass 2: acc = sum of round(p)·v
  float acc[MAXG][EPL];
#pragma unroll
  for (int g = 0; g < MAXG; ++g)
#pragma unroll
    for (int e = 0; e < EPL; ++e) acc[g][e] = 0.0f;
  for (int base = k0 + warp; base < k1; base += kAttnWarps * U) {
    float kv[U][EPL], vv[U][EPL];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int key = base + u * kAttnWarps;
      if (key < k1 && lane_on) {
        load_pack<T, EPL>(kb + int64_t(key) * a.c_rs + lane * EPL, kv[u]);
        load_pack<T, EPL>(vb + int64_t(key) * a.c_rs + lane * EPL, vv[u]);
      } else {
#pragma unroll
        for (int e = 0; e < EPL; ++e) kv[u][e] = vv[u][e] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (base + u * kAttnWarps >= k1) break;
#pragma unroll
      for (int g = 0; g < MAXG; ++g) {
        if (g >= G) break;
        float sc = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) sc += q[g][e] * kv[u][e];
        sc = warp_sum(sc);
        const float p = round_as<T>(expf(sc - M[g]) * inv_l[g]);
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[g][e] += p * vv[u][e];
      }
    }
  }
#pragma unroll
  for (int g = 0; g < MAXG; ++g) {
    if (g >= G) break;
    if (lane_on)
#pragma unroll
      for (int e = 0; e < EPL; ++e) s_acc[(warp * MAXG + g) * D + lane * EPL + e] = acc[g][e];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * D; i += kAttnThreads) {
    const int g = i / D, d = i % D;
    float sum = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) sum += s_acc[(w * MAXG + g) * D + d];
    static_cast<T*>(a.out)[int64_t(b) * a.o_bs + int64_t(hk * G + g) * D + d] = from_f32<T>(sum);
  }
}

// Whether environment variable `name` is set to `value` (the A/B switches below, read once each).
bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::string(v) == value;
}

int elements_per_lane(int64_t d) {
  return d <= 32 ? 1 : d <= 64 ? 2 : d <= 128 ? 4 : 8;
}

// A grid of (rows × kv heads, splits) blocks of `warps` warps, with the shared memory the warps'
// combine needs.
template <class Kernel>
void launch_blocks(Kernel kernel, int warps, int maxg, const AttnArgs& args, int64_t batch,
                   int splits, Stream stream) {
  const size_t smem = sizeof(float) * (size_t(warps) * maxg * args.head_dim + 2 * warps * maxg);
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  launch(kernel, dim3(static_cast<unsigned>(batch * args.heads_kv), splits),
         dim3(static_cast<unsigned>(warps * 32)), smem, stream, args);
}

// The flash-form kernel with W warps: a step per 32 scores where lane_scores serves the shape,
// unless HK_DECODE_ATTENTION_STEP=per-key (the A/B switch; the results agree within rounding).
template <class T, int EPL, int MAXG, int W>
void launch_flash_form(const AttnArgs& args, int64_t batch, Stream stream) {
  static const bool per_key = env_is("HK_DECODE_ATTENTION_STEP", "per-key");
  constexpr bool kLaneScores = lane_scores<T, EPL, MAXG>();
  launch_blocks(kLaneScores && !per_key ? decode_attention_kernel<T, EPL, MAXG, kLaneScores, W>
                                        : decode_attention_kernel<T, EPL, MAXG, false, W>,
                W, MAXG, args, batch, args.splits, stream);
}

// Warps a block: 8 when the grid leaves most SMs idle (a block's keys then take half the steps:
// 81 keys are one step of 8 warps × 16), else 4, so that 4 blocks of 124 registers a thread fit
// an SM at batch 64 (HK_DECODE_ATTENTION_WARPS=4 keeps 4, the A/B switch). The eager kernel keeps
// 4 and has no splits.
template <class T, int EPL, int MAXG>
void launch_attention(const AttnArgs& args, int64_t batch, bool eager, Stream stream) {
  static const bool four_only = env_is("HK_DECODE_ATTENTION_WARPS", "4");
  if (eager)
    launch_blocks(decode_attention_eager_kernel<T, EPL, MAXG>, kAttnWarps, MAXG, args, batch, 1,
                  stream);
  else if (!four_only && batch * args.heads_kv * args.splits <= detail::device_sm_count())
    launch_flash_form<T, EPL, MAXG, 8>(args, batch, stream);
  else
    launch_flash_form<T, EPL, MAXG, kAttnWarps>(args, batch, stream);
}

template <class T, int EPL>
void dispatch_group(const AttnArgs& args, int64_t batch, bool eager, Stream stream) {
  if (args.group <= 2)
    launch_attention<T, EPL, 2>(args, batch, eager, stream);
  else if (args.group <= 4)
    launch_attention<T, EPL, 4>(args, batch, eager, stream);
  else if (args.group <= 8)
    launch_attention<T, EPL, 8>(args, batch, eager, stream);
  else
    launch_attention<T, EPL, 16>(args, batch, eager, stream);
}

template <class T>
void dispatch_epl(const AttnArgs& args, int64_t batch, bool eager, Stream stream) {
  switch (elements_per_lane(args.head_dim)) {
    case 1:
      return dispatch_group<T, 1>(args, batch, eager, stream);
    case 2:
      return dispatch_group<T, 2>(args, batch, eager, stream);
    case 4:
      return dispatch_group<T, 4>(args, batch, eager, stream);
    default:
      return dispatch_group<T, 8>(args, batch, eager, stream);
  }
}

}  // namespace

int attention_splits(int64_t batch, int64_t heads_kv, int64_t max_keys) {
  const int64_t blocks = std::max<int64_t>(1, batch * heads_kv);
  const int64_t target = 2 * int64_t(detail::device_sm_count());
  int64_t splits = (target + blocks - 1) / blocks;
  splits = std::min<int64_t>({splits, std::max<int64_t>(1, max_keys / 32), 64});
  return static_cast<int>(std::max<int64_t>(splits, 1));
}

size_t attention_workspace_floats(int64_t batch, int64_t heads_q, int64_t head_dim, int splits) {
  if (splits <= 1) return 0;
  return size_t(batch) * heads_q * splits * (head_dim + 2);
}

std::string attention_unsupported(const DecodeAttentionParams& p) {
  if (p.dtype != DType::BF16 && p.dtype != DType::F16 && p.dtype != DType::F32)
    return std::string("dtype ") + dtype_name(p.dtype);
  if (p.heads_kv <= 0 || p.heads_q % p.heads_kv != 0) return "q heads not a multiple of kv heads";
  if (p.heads_q / p.heads_kv > 16) return "more than 16 q heads per kv head";
  if (p.head_dim <= 0 || p.head_dim > 256) return "head_dim above 256";
  const int epl = elements_per_lane(p.head_dim);
  if (p.head_dim % epl != 0)
    return "head_dim " + std::to_string(p.head_dim) + " is not a multiple of " +
           std::to_string(epl);
  const size_t bytes = dtype_size(p.dtype) * epl;
  const int64_t align = static_cast<int64_t>(std::min<size_t>(bytes, 16) / dtype_size(p.dtype));
  const size_t vec = std::min<size_t>(bytes, 16);
  auto ok = [&](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % vec == 0; };
  if (!ok(p.q) || !ok(p.k_cache) || !ok(p.v_cache) || p.q_batch_stride % align != 0 ||
      p.cache_batch_stride % align != 0 || p.cache_row_stride % align != 0 ||
      p.head_dim % align != 0)
    return "q or cache rows not aligned for vector loads";
  if (!p.eager && p.splits > 1 && (!p.workspace || !p.counters))
    return "split attention without workspace";
  return "";
}

void attention(const DecodeAttentionParams& p, Stream stream) {
  const std::string why = attention_unsupported(p);
  if (!why.empty()) throw Unsupported("decode attention: " + why);
  AttnArgs a;
  a.heads_q = static_cast<int>(p.heads_q);
  a.heads_kv = static_cast<int>(p.heads_kv);
  a.head_dim = static_cast<int>(p.head_dim);
  a.group = static_cast<int>(p.heads_q / p.heads_kv);
  a.q = p.q;
  a.q_bs = p.q_batch_stride;
  a.k = p.k_cache;
  a.v = p.v_cache;
  a.c_bs = p.cache_batch_stride;
  a.c_rs = p.cache_row_stride;
  a.lengths = p.lengths;
  a.length_add = p.length_add;
  a.key_start = p.key_start;
  a.out = p.out;
  a.o_bs = p.out_batch_stride;
  a.scale = p.scale > 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  a.splits = p.eager ? 1 : std::max(1, p.splits);
  a.ws = p.workspace;
  a.counters = p.counters;
  switch (p.dtype) {
    case DType::BF16:
      return dispatch_epl<__nv_bfloat16>(a, p.batch, p.eager, stream);
    case DType::F16:
      return dispatch_epl<__half>(a, p.batch, p.eager, stream);
    default:
      return dispatch_epl<float>(a, p.batch, p.eager, stream);
  }
}

}  // namespace hk::decode
