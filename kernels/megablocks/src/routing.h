// routing.h — the routing and token-permutation logic of moe_mlp@1, written once for the host
// (cpu variant, CPU unit tests) and the device (cuda variant: each function is the body of one
// thread's or one block's work).
//
//   route_row        softmax (f32) → top-k by probability (descending, ties to the lower expert)
//                    → renormalisation; k passes over E, no scratch: pass j takes the best entry
//                    that orders after pass j−1's pick, so nothing needs a "taken" array. The cpu
//                    variant runs it; the cuda variant's routing runs a warp a token in its order
//                    (ranks_before, the softmax summed in expert order) for the same results.
//   permutation      the canonical order of the T·k assignments (expert ascending, then t·k + j):
//                    a stable counting sort in three phases that need no host sync —
//                    1. per chunk of kChunk assignments: a histogram over experts and each
//                       assignment's rank among the chunk's assignments to the same expert;
//                    2. per expert: the chunk prefix sums, the expert's count, then the exclusive
//                       scan over experts (offsets) and the GEMM tile offsets;
//                    3. per assignment: its sorted row = offsets[e] + chunk prefix + local rank.
//   tile_expert      which expert a GEMM row tile belongs to (binary search in the tile offsets).
//   activation       act and act' for the interface's activation codes.
// Deliberately free of CUDA types and of allocation; callers own every buffer.
#pragma once

#include <cmath>
#include <cstdint>

#include "hk/layer_interfaces.h"

#if defined(__CUDACC__)
#define MB_HD __host__ __device__ __forceinline__
#else
#define MB_HD inline
#endif

namespace megablocks {

// Assignments per permutation chunk (one CUDA block of as many threads): large, so that phase 2
// walks few chunks (T·k / 1024, e.g. 128 at 16384 tokens × top-8).
inline constexpr int kChunk = 1024;

MB_HD int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// `a` orders before `b` in the top-k order: larger probability first, lower index on ties.
MB_HD bool ranks_before(float pa, int32_t a, float pb, int32_t b) {
  return pa > pb || (pa == pb && a < b);
}

// One token's routing (templated on a device-only accessor in the cuda variant: nvcc must not
// check it as host code). `logit(e)` returns the logit of expert e as f32 (already rounded to the
// activations' dtype). Writes ids[0..k) and weights[0..k) (f32, before rounding to the dtype).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Logit>
MB_HD void route_row(const Logit& logit, int32_t E, int32_t k, bool norm_topk_prob, int32_t* ids,
                     float* weights) {
  float m = -INFINITY;
  for (int32_t e = 0; e < E; ++e) m = fmaxf(m, logit(e));
  float sum = 0.0f;
  for (int32_t e = 0; e < E; ++e) sum += expf(logit(e) - m);
  float prev_p = INFINITY, selected = 0.0f;
  int32_t prev = -1;
  for (int32_t j = 0; j < k; ++j) {
    float best_p = -1.0f;
    int32_t best = -1;
    for (int32_t e = 0; e < E; ++e) {
      const float p = expf(logit(e) - m) / sum;
      if (prev >= 0 && !ranks_before(prev_p, prev, p, e)) continue;  // taken by an earlier pass
      if (best < 0 || ranks_before(p, e, best_p, best)) {
        best_p = p;
        best = e;
      }
    }
    ids[j] = best;
    weights[j] = best_p;
    selected += best_p;
    prev = best;
    prev_p = best_p;
  }
  if (norm_topk_prob)
    for (int32_t j = 0; j < k; ++j) weights[j] /= selected;
}

// ---- the permutation ---------------------------------------------------------------------------

MB_HD int64_t num_chunks(int64_t assignments) {
  return ceil_div(assignments, kChunk);
}

// Phase 1 for the i-th assignment of a chunk (chunk_ids: that chunk's expert ids): its rank among
// the chunk's earlier assignments to the same expert.
MB_HD int32_t chunk_rank(const int32_t* chunk_ids, int32_t i) {
  int32_t rank = 0;
  for (int32_t j = 0; j < i; ++j) rank += chunk_ids[j] == chunk_ids[i];
  return rank;
}

// Phase 2 for expert `e`: turns its column of the chunk histogram hist[c·E + e] into exclusive
// prefix sums over chunks, in place; returns the expert's count.
// Loads go in batches of 8 so a device thread keeps several in flight.
MB_HD int64_t chunk_prefix(int32_t* hist, int64_t chunks, int32_t E, int32_t e) {
  int64_t running = 0;
  for (int64_t c0 = 0; c0 < chunks; c0 += 8) {
    const int n = chunks - c0 < 8 ? static_cast<int>(chunks - c0) : 8;
    int32_t count[8];
    for (int i = 0; i < n; ++i) count[i] = hist[(c0 + i) * E + e];
    for (int i = 0; i < n; ++i) {
      hist[(c0 + i) * E + e] = static_cast<int32_t>(running);
      running += count[i];
    }
  }
  return running;
}

// Phase 2, after every expert's count: offsets[0..E] (exclusive scan) and tile_offsets[0..E]
// (rows of each expert in tiles of `tile_rows`, scanned). Sequential: E is small; the cuda variant
// runs it in one thread after a block-wide count, or as a block scan.
MB_HD void expert_offsets(const int64_t* counts, int32_t E, int64_t tile_rows, int64_t* offsets,
                          int64_t* tile_offsets) {
  offsets[0] = 0;
  tile_offsets[0] = 0;
  for (int32_t e = 0; e < E; ++e) {
    offsets[e + 1] = offsets[e] + counts[e];
    tile_offsets[e + 1] = tile_offsets[e] + ceil_div(counts[e], tile_rows);
  }
}

// Phase 3 for assignment `a` with its chunk rank: the sorted row.
MB_HD int64_t sorted_row(const int32_t* ids, const int32_t* prefix, const int64_t* offsets,
                         int32_t E, int64_t a, int32_t rank) {
  const int32_t e = ids[a];
  return offsets[e] + prefix[(a / kChunk) * E + e] + rank;
}

// The expert owning row tile `tile` (tile_offsets[e] <= tile < tile_offsets[e + 1]; experts with
// no rows own no tile). tile < tile_offsets[E].
MB_HD int32_t tile_expert(const int64_t* tile_offsets, int32_t E, int64_t tile) {
  int32_t lo = 0, hi = E - 1;  // the last e with tile_offsets[e] <= tile
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (tile_offsets[mid] <= tile)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// ---- activations
// ---------------------------------------------------------------------------------

// SiLU's sigmoid. On the GPU the fast exponential and division (a few f32 ulps, far below the
// 16-bit rounding of every value the epilogues store): with the IEEE forms the d(act) GEMM's
// SwiGLU-backward epilogue (two sigmoids a pair) took a third of the GEMM's time on the H200.
// The CPU (and the CPU emulation of the device kernels) keeps the exact form.
MB_HD float sigmoid(float x) {
#ifdef __CUDA_ARCH__
  return __fdividef(1.0f, 1.0f + __expf(-x));
#else
  return 1.0f / (1.0f + expf(-x));
#endif
}

MB_HD float act(uint32_t kind, float x) {
  switch (kind) {
    case hk::kActivationGELU:
      return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case hk::kActivationGELUTanh: {
      const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
      return 0.5f * x * (1.0f + tanhf(u));
    }
    default:  // x / (1 + e^-x) on the CPU, as before the GPU took the fast form (same bits)
#ifdef __CUDA_ARCH__
      return x * sigmoid(x);
#else
      return x / (1.0f + expf(-x));
#endif
  }
}

MB_HD float act_grad(uint32_t kind, float x) {
  switch (kind) {
    case hk::kActivationGELU: {
      const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
      return cdf + x * 0.3989422804014327f * expf(-0.5f * x * x);
    }
    case hk::kActivationGELUTanh: {
      const float c = 0.7978845608028654f;
      const float u = c * (x + 0.044715f * x * x * x);
      const float t = tanhf(u);
      return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * x * x);
    }
    default: {
      const float s = sigmoid(x);
      return s * (1.0f + x * (1.0f - s));
    }
  }
}

}  // namespace megablocks
