// moe_cuda.cu — the cuda variant of kernels-community/megablocks (moe_mlp@1), sm_90a.
//
// Forward, all on the call's stream, no host sync, no allocation (workspace from the caller):
//   1. router logits = x · router_wᵀ                       M-grouped GEMM with one group
//   2. routing: one warp per token (route_row's order): softmax, top-k, renormalisation
//   3. permutation by expert, three kernels (routing.h): chunk histograms and ranks, per-expert
//      offsets and GEMM tile offsets, the scatter to sorted rows (token, weight, position)
//   4. gate_up GEMM over the experts' rows, x gathered by token (the TMA kernels: x copied in
//      expert order first, into the down GEMM's output rows), fused SwiGLU epilogue
//   5. down GEMM over the experts' rows
//   6. weighted un-permutation: y[t] = Σ_j w·o over the token's k rows (deterministic, no atomics)
// Backward, from the saved routing (ids, weights) and gate_up pre-activations:
//   permutation again; d(act)/w = dy·down_w (GEMM, dy gathered) with the SwiGLU backward in its
//   epilogue (d(gate ‖ up), w·act, per-tile parts of d(weight); the TMA kernels: a plain GEMM,
//   then swiglu_backward_kernel, a warp a row); d(down_w) (K-grouped over each
//   expert's rows); d(weight) summed; the routing backward (one warp per token:
//   renormalisation, softmax, + drouter_logits); the router's dx part and d(router_w); dx rows =
//   d(gate ‖ up) · gate_up_w, then the un-permutation sum; d(gate_up_w) (K-grouped). The TMA
//   kernels read dy, then x, in expert order, copied into the dx rows' buffer while it is free.
// Every grid is sized from host-known shapes (persistent GEMMs read their tile count on the
// device), so the entry is capture-safe. Requirements: bf16 or f16; H and I multiples of 8;
// 16-byte aligned tensors (UNSUPPORTED otherwise).
//
// The GEMMs (the experts' gate_up, down, d(act), dx rows, d(down_w), d(gate_up_w) and the
// router's three) run, on sm_90 by default or with HK_MEGABLOCKS_GEMM=tma, the experts' bf16 ones
// on the TMA warp-specialised kernels (grouped_gemm_tma.cuh) and the rest (f16, the router's) on
// the Hopper wgmma kernels (grouped_gemm_sm90.cuh, all of them with HK_MEGABLOCKS_GEMM=wgmma);
// elsewhere, or with HK_MEGABLOCKS_GEMM=mma, on the mma.sync kernels (grouped_gemm.cuh).
// HK_MEGABLOCKS_TIMING=1 prints each pass's per-stage times to stderr (it synchronises the
// stream: a diagnostic for benchmarks, not for capture).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "device_compat.cuh"
#include "grouped_gemm.cuh"
#include "moe_call.h"

// The wgmma kernels exist in builds with sm_90a device code, never in the CPU emulation.
#if !defined(MEGABLOCKS_DEVICE_EMULATION) && defined(MEGABLOCKS_HAVE_SM90A) && MEGABLOCKS_HAVE_SM90A
#include "grouped_gemm_sm90.cuh"
#include "grouped_gemm_tma.cuh"
#define MEGABLOCKS_WGMMA 1
#else
#define MEGABLOCKS_WGMMA 0
#endif

namespace megablocks::cuda {
namespace {

// ---- small kernels ----------------------------------------------------------------------------

__global__ void single_group_kernel(int64_t rows, int64_t* offsets, int64_t* tile_offsets) {
  offsets[0] = 0;
  offsets[1] = rows;
  tile_offsets[0] = 0;
  tile_offsets[1] = ceil_div(rows, kBM);
}

// The routing kernels run one warp a token, lanes over its experts (e = lane, lane + 32, ...):
// the softmax's max and sum and the top-k's argmax rounds are warp reductions, reads and writes
// coalesced. One thread a token (routing.h route_row, as the cpu variant runs it) had 16384
// threads for 16384 tokens, latency-bound: 0.16 ms forward and ~0.2 backward on the H200. The
// order (ranks_before: larger probability, then the lower expert) and the softmax sum's order
// are route_row's, so ids and weights are the cpu variant's.
inline constexpr int kRouteWarps = 8;  // tokens a block

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The softmax of a token's logits: its max and sum of exponentials, every lane.
template <class T>
struct Softmax {
  const T* z;  // the token's E logits
  float m, sum;
  __device__ Softmax(const T* logits, int32_t E, int lane) : z(logits) {
    float mx = -INFINITY;
    for (int32_t e = lane; e < E; e += 32) mx = fmaxf(mx, to_f32(z[e]));
    m = warp_max(mx);
    // In expert order by one lane, as route_row sums (the same weights as the cpu variant's to
    // the bit where expf is the host's, in the CPU emulation); broadcast by adding zeros.
    float s = 0.0f;
    if (lane == 0)
      for (int32_t e = 0; e < E; ++e) s += expf(to_f32(z[e]) - m);
    sum = warp_sum(s);
  }
  __device__ float prob(int32_t e) const { return expf(to_f32(z[e]) - m) / sum; }
};

template <class T>
__global__ void route_kernel(const T* logits, int64_t tokens, int32_t E, int32_t k, bool norm,
                             int32_t* ids, float* weights) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + threadIdx.x / 32;
  if (t >= tokens) return;  // (the whole warp)
  const int lane = threadIdx.x % 32;
  const Softmax<T> sm(logits + t * E, E, lane);
  float prev_p = INFINITY, selected = 0.0f;
  int32_t prev = -1;
  for (int32_t j = 0; j < k; ++j) {
    // This lane's best expert ranking after the previous pick, then the warp's (pairs exchanged
    // as floats: expert ids are exact in f32).
    float best_p = -1.0f;
    int32_t best = -1;
    for (int32_t e = lane; e < E; e += 32) {
      const float p = sm.prob(e);
      if (prev >= 0 && !ranks_before(prev_p, prev, p, e)) continue;
      if (best < 0 || ranks_before(p, e, best_p, best)) {
        best_p = p;
        best = e;
      }
    }
    for (int o = 16; o > 0; o /= 2) {
      const float op = __shfl_xor_sync(0xffffffffu, best_p, o);
      const int32_t oe =
          static_cast<int32_t>(__shfl_xor_sync(0xffffffffu, static_cast<float>(best), o));
      if (oe >= 0 && (best < 0 || ranks_before(op, oe, best_p, best))) {
        best_p = op;
        best = oe;
      }
    }
    if (lane == 0) {
      ids[t * k + j] = best;
      weights[t * k + j] = best_p;
    }
    selected += best_p;
    prev = best;
    prev_p = best_p;
  }
  if (norm && lane == 0)  // (the lane that wrote them)
    for (int32_t j = 0; j < k; ++j) weights[t * k + j] /= selected;
}

// Phase 1: one block of kChunk threads per chunk.
__global__ void chunk_kernel(const int32_t* ids, int64_t n, int32_t E, int32_t* hist,
                             int32_t* rank) {
  __shared__ int32_t chunk_ids[kChunk];
  MB_EXTERN_SHARED(int32_t, counts);  // [E]
  const int64_t c = blockIdx.x;
  const int i = threadIdx.x;
  const int64_t a = c * kChunk + i;
  for (int32_t e = i; e < E; e += blockDim.x) counts[e] = 0;
  chunk_ids[i] = a < n ? ids[a] : -1;
  __syncthreads();
  if (a < n) {
    rank[a] = chunk_rank(chunk_ids, i);
    atomicAdd(&counts[chunk_ids[i]], 1);  // a count: its order does not matter
  }
  __syncthreads();
  for (int32_t e = i; e < E; e += blockDim.x) hist[c * E + e] = counts[e];
}

// Phase 2: one block.
__global__ void offsets_kernel(int32_t* hist, int64_t chunks, int32_t E, int64_t* offsets,
                               int64_t* tile_offsets) {
  MB_EXTERN_SHARED(int64_t, expert_counts);  // [E]
  for (int32_t e = threadIdx.x; e < E; e += blockDim.x)
    expert_counts[e] = chunk_prefix(hist, chunks, E, e);
  __syncthreads();
  if (threadIdx.x == 0) expert_offsets(expert_counts, E, kBM, offsets, tile_offsets);
}

// Phase 3.
__global__ void scatter_kernel(const int32_t* ids, const float* weights, const int32_t* rank,
                               const int32_t* prefix, const int64_t* offsets, int64_t n, int32_t E,
                               int32_t k, int32_t* sorted_token, float* sorted_weight,
                               int32_t* position) {
  const int64_t a = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (a >= n) return;
  const int64_t row = sorted_row(ids, prefix, offsets, E, a, rank[a]);
  sorted_token[row] = static_cast<int32_t>(a / k);
  sorted_weight[row] = weights[a];
  position[a] = static_cast<int32_t>(row);
}

// Eight 16-bit elements as one 16-byte access (p 16-byte aligned). memcpy, not a pointer cast, so
// no compiler may assume the element array and the vector do not alias.
template <class T>
__device__ __forceinline__ void load8(T (&e)[8], const T* p) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  memcpy(e, &v, sizeof v);
}
template <class T>
__device__ __forceinline__ void store8(T* p, const T (&e)[8]) {
  uint4 v;
  memcpy(&v, e, sizeof v);
  *reinterpret_cast<uint4*>(p) = v;
}

// y[t] = round(Σ_j round(round(w)·o[row_j])), 8 columns per thread (16-byte loads).
template <class T>
__global__ void combine_kernel(const T* rows, const int32_t* position, const float* weights,
                               int32_t k, int64_t H, T* y) {
  const int64_t t = blockIdx.x;
  for (int64_t h = threadIdx.x * 8; h < H; h += blockDim.x * 8) {
    float acc[8] = {};
    for (int32_t j = 0; j < k; ++j) {
      const int64_t row = position[t * k + j];
      const float w = round_as<T>(weights[t * k + j]);
      T e[8];
      load8(e, rows + row * H + h);
#pragma unroll
      for (int q = 0; q < 8; ++q) acc[q] += round_as<T>(w * to_f32(e[q]));
    }
    T out[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) out[q] = from_f32<T>(acc[q]);
    store8(y + t * H + h, out);
  }
}

// The rows of src (x or dy, [T][H]) in expert order: token t's row to its k sorted rows
// position[t·k + j] (read once, written k times): the copy that the TMA kernels read whole
// (gathering the rows inside the GEMMs, by cp.async from the producer warpgroup, took ~1.0 µs a
// k-tile on the H200 against ~0.7 for whole-tile TMA copies; walking the sorted rows instead read
// each token's row k times, 0.24 ms at 16384 tokens).
template <class T>
__global__ void expert_order_kernel(const T* src, const int32_t* position, int32_t k, int64_t H,
                                    T* dst) {
  const int64_t t = blockIdx.x;
  for (int64_t h = threadIdx.x * 8; h < H; h += blockDim.x * 8) {
    T e[8];
    load8(e, src + t * H + h);
    for (int32_t j = 0; j < k; ++j)
      store8(dst + static_cast<int64_t>(position[t * k + j]) * H + h, e);
  }
}

// The SwiGLU backward on the TMA path, a warp a sorted row, after the d(act) GEMM stored d =
// d(act)/w (rounded) in act_w: d(gate ‖ up), w·act (over d, in place) and the row's d(weight)
// part (each lane's columns in order, then the lanes' sums in a fixed tree). Fused into the GEMM's
// epilogue instead, the saved gate/up reads and three outputs (320 KB a 128 × 256 tile) kept the
// tensor cores idle ~25 µs a tile on the H200 (1.16 ms at 16384 tokens, the GEMM alone ~0.6).
template <class T>
__global__ void swiglu_backward_kernel(T* act_w, const T* gate_up, const float* row_weight,
                                       int64_t n, int64_t I, uint32_t activation, T* dgate_up,
                                       float* partial) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= n) return;
  const int lane = threadIdx.x % 32;
  const float w = round_as<T>(row_weight[row]);
  T* a_row = act_w + row * I;
  const T* g_row = gate_up + row * 2 * I;
  T* dg_row = dgate_up + row * 2 * I;
  float part = 0.0f;
  with_activation(activation, [&](auto kind) {
    for (int64_t i = lane * 8; i < I; i += 32 * 8) {
      T d[8], g[8], u[8], dg[8], du[8], aw[8];
      load8(d, a_row + i);
      load8(g, g_row + i);
      load8(u, g_row + I + i);
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const SwigluBackwardValue v = swiglu_backward_value<decltype(kind)::value, T>(
            w, to_f32(d[q]), to_f32(g[q]), to_f32(u[q]), part);
        dg[q] = from_f32<T>(v.dg);
        du[q] = from_f32<T>(v.du);
        aw[q] = from_f32<T>(v.aw);
      }
      store8(dg_row + i, dg);
      store8(dg_row + I + i, du);
      store8(a_row + i, aw);
    }
  });
  part = warp_sum(part);
  if (lane == 0) partial[row] = part;
}

// dx[t] = round(dx_router[t] + Σ_j drows[row_j]).
template <class T>
__global__ void combine_backward_kernel(const T* drows, const int32_t* position, int32_t k,
                                        int64_t H, const float* dx_router, T* dx) {
  const int64_t t = blockIdx.x;
  for (int64_t h = threadIdx.x * 8; h < H; h += blockDim.x * 8) {
    float acc[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) acc[q] = dx_router[t * H + h + q];
    for (int32_t j = 0; j < k; ++j) {
      const int64_t row = position[t * k + j];
      T e[8];
      load8(e, drows + row * H + h);
#pragma unroll
      for (int q = 0; q < 8; ++q) acc[q] += to_f32(e[q]);
    }
    T out[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) out[q] = from_f32<T>(acc[q]);
    store8(dx + t * H + h, out);
  }
}

// d(router_w) split over the tokens (one K-grouped GEMM group per chunk of rows): the chunk
// offsets, and the sum of the chunks' f32 parts (+ what is there when accumulating), rounded once.
// A single group walked all T rows in 16 blocks (E 128 × H 2048: 0.22 ms at 16384 tokens, H200).
inline constexpr int64_t kRouterSplitRows = 1024;
__global__ void split_rows_kernel(int64_t rows, int64_t chunk, int32_t chunks, int64_t* offsets) {
  for (int32_t i = threadIdx.x; i <= chunks; i += blockDim.x)
    offsets[i] = i * chunk < rows ? i * chunk : rows;
}
template <class T>
__global__ void sum_parts_kernel(const float* parts, int32_t chunks, int64_t count, bool accumulate,
                                 T* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  float sum = accumulate ? to_f32(out[i]) : 0.0f;
  for (int32_t c = 0; c < chunks; ++c) sum += parts[c * count + i];
  out[i] = from_f32<T>(sum);
}

// d(weight) of each assignment: the sum of its row's per-tile parts, in tile order.
__global__ void dweight_kernel(const float* partial, const int32_t* position, int64_t n,
                               int64_t n_tiles, float* dweights) {
  const int64_t a = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (a >= n) return;
  const float* p = partial + static_cast<int64_t>(position[a]) * n_tiles;
  float sum = 0.0f;
  for (int64_t i = 0; i < n_tiles; ++i) sum += p[i];
  dweights[a] = sum;
}

// d(logits) of one token per warp (lanes over the experts): renormalisation, the top-k gather
// and the softmax backward, plus drouter_logits; rounded to the logits' dtype into [T, Ep] (pad
// columns zero). The k-long sums run in every lane in the same order.
template <class T>
__global__ void route_backward_kernel(const T* logits, const int32_t* ids, const float* weights,
                                      const float* dweights, const float* drouter, int64_t tokens,
                                      int32_t E, int32_t Ep, int32_t k, bool norm, T* dlogits) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + threadIdx.x / 32;
  if (t >= tokens) return;  // (the whole warp)
  const int lane = threadIdx.x % 32;
  const Softmax<T> sm(logits + t * E, E, lane);
  const int32_t* id = ids + t * k;
  const float* w = weights + t * k;
  const float* dw = dweights + t * k;
  float selected = 0.0f, dot = 0.0f;
  for (int32_t j = 0; j < k; ++j) {
    selected += sm.prob(id[j]);
    dot += dw[j] * w[j];
  }
  auto dp = [&](int32_t j) { return norm ? (dw[j] - dot) / selected : dw[j]; };
  float dot2 = 0.0f;
  for (int32_t j = 0; j < k; ++j) dot2 += sm.prob(id[j]) * dp(j);
  T* out = dlogits + t * Ep;
  for (int32_t e = lane; e < Ep; e += 32) {
    float g = 0.0f;
    if (e < E) {
      float dpe = 0.0f;
      for (int32_t j = 0; j < k; ++j)
        if (id[j] == e) dpe = dp(j);
      g = sm.prob(e) * (dpe - dot2);
      if (drouter) g += drouter[t * E + e];
    }
    out[e] = from_f32<T>(g);
  }
}

// ---- launch helpers ----------------------------------------------------------------------------

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    fail(HK_STATUS_DEVICE_ERROR,
         std::string("megablocks cuda: ") + what + " failed: " + cudaGetErrorString(err));
}

// Per device (up to 16), once: a kernel's dynamic shared memory limit and, for the persistent
// GEMMs, its grid (SMs × resident blocks of `threads`). `Tag` makes one set of statics per kernel.
template <class Tag, class Kernel>
int configure(Kernel kernel, int smem, int threads = kThreads) {
  static int blocks[16] = {};
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  int& b = blocks[device & 15];
  if (b == 0) {
    check(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
          "cudaFuncSetAttribute");
    int sms = 0, per_sm = 0;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
          "cudaDeviceGetAttribute");
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
              &per_sm, reinterpret_cast<const void*>(kernel), threads, smem),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    b = sms * (per_sm > 0 ? per_sm : 1);
  }
  return b;
}

template <class T, Major LB, Epi E, int BN>
struct MGroupedTag {};

template <class T, Major LB, Epi E, int BN>
void m_grouped_launch(const MGroupedParams<T>& p, cudaStream_t stream) {
  constexpr int smem = smem_bytes<Major::K, LB, BN>();
  auto kernel = m_grouped_gemm<T, LB, E, BN>;
  const int blocks = configure<MGroupedTag<T, LB, E, BN>>(kernel, smem);
  MB_LAUNCH(kernel, blocks, kThreads, smem, stream)(p);
  check(cudaGetLastError(), "M-grouped GEMM launch");
}

// The N extent of the expert GEMMs' tiles: 128 by default; MEGABLOCKS_GEMM_TILE=128x256 picks
// 256 (64×64 warp tiles, one block per SM) — a tuning knob, read on every call.
int expert_tile_n() {
  const char* v = std::getenv("MEGABLOCKS_GEMM_TILE");
  return v && std::string(v) == "128x256" ? 256 : 128;
}

template <class T, Major LB, Epi E>
void m_grouped(const MGroupedParams<T>& p, cudaStream_t stream, int bn = 128) {
  if (bn == 256)
    m_grouped_launch<T, LB, E, 256>(p, stream);
  else
    m_grouped_launch<T, LB, E, 128>(p, stream);
}

template <class T>
void k_grouped(const KGroupedParams<T>& p, cudaStream_t stream) {
  constexpr int smem = smem_bytes<Major::MN, Major::MN, kKGroupedBN>();
  auto kernel = k_grouped_gemm<T>;
  configure<KGroupedParams<T>>(kernel, smem);
  const dim3 grid(static_cast<unsigned>(ceil_div(p.n, kKGroupedBN)),
                  static_cast<unsigned>(ceil_div(p.m_store, kBM)),
                  static_cast<unsigned>(p.groups.count));
  MB_LAUNCH(kernel, grid, kThreads, smem, stream)(p);
  check(cudaGetLastError(), "K-grouped GEMM launch");
}

// ---- the GEMMs' kernels: mma.sync or wgmma -----------------------------------------------------

// HK_MEGABLOCKS_GEMM (read on every call): tma (unset on sm_90: the default), wgmma or mma.
struct GemmKernels {
  bool wgmma = false;
  int bn = 128;  // the expert M-grouped tiles' N extent (the d(weight) parts per row are I / bn)
  bool tma = false;  // the experts' GEMMs on the TMA kernels (bf16; the rest on wgmma)
  // The router's GEMMs: the wgmma or mma kernels, 128-column tiles.
  GemmKernels router() const { return {wgmma, 128, false}; }
  // The TMA kernels are built for bf16 only: f16 runs on the wgmma kernels.
  template <class T>
  GemmKernels for_dtype() const {
    return tma && !std::is_same_v<T, __nv_bfloat16> ? router() : *this;
  }
};

#if MEGABLOCKS_WGMMA
int device_major() {
  static int major[16] = {};
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  int& m = major[device & 15];
  if (m == 0)
    check(cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, device),
          "cudaDeviceGetAttribute");
  return m;
}

void require_hopper() {
  const int m = device_major();
  if (m != 9)
    fail(HK_STATUS_UNSUPPORTED,
         "megablocks cuda: HK_MEGABLOCKS_GEMM=wgmma needs a Hopper GPU "
         "(sm_90a), this device is sm_" +
             std::to_string(m) + "x: unset HK_MEGABLOCKS_GEMM or set it to mma");
}
#endif

GemmKernels gemm_kernels() {
  const char* v = std::getenv("HK_MEGABLOCKS_GEMM");
  const std::string s = v ? v : "";
  if (s == "mma") return {false, expert_tile_n()};
  if (!s.empty() && s != "wgmma" && s != "tma")
    fail(HK_STATUS_INVALID_ARGUMENT, "megablocks cuda: HK_MEGABLOCKS_GEMM is '" + s +
                                         "': use tma (the default on Hopper), wgmma or mma");
#if MEGABLOCKS_WGMMA
  // The default on Hopper: the TMA kernels for the experts' bf16 GEMMs, the wgmma ones for the
  // rest. On the H200 at 16384 tokens the wgmma kernels took the block's forward+backward from
  // 17.8 ms (mma) to 12.3, the TMA ones to ~8 (docs/performance.md).
  if (s.empty() && device_major() != 9) return {false, expert_tile_n()};
  require_hopper();
  if (s.empty() || s == "tma") return {true, tma::kBN, true};
  return {true, sm90::kBN};
#else
  if (s.empty()) return {false, expert_tile_n()};
  fail(HK_STATUS_UNSUPPORTED,
       "megablocks cuda: HK_MEGABLOCKS_GEMM=" + s +
           ", but this build has no sm_90a code (configure "
           "with 90a in HK_CUDA_ARCHITECTURES): unset HK_MEGABLOCKS_GEMM or set it to mma");
#endif
}

#if MEGABLOCKS_WGMMA
template <class T, Major LB, Epi E>
struct Sm90MGroupedTag {};
template <class T>
struct Sm90KGroupedTag {};
#endif

#if MEGABLOCKS_WGMMA
template <class T, Major LB, Epi E>
struct TmaMGroupedTag {};
template <class T>
struct TmaKGroupedTag {};

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  const auto fn = hk::sdk::cuda::sm90::tensor_map_encoder();
  if (fn == nullptr)
    fail(HK_STATUS_DEVICE_ERROR,
         "megablocks cuda: the CUDA driver has no cuTensorMapEncodeTiled (needs CUDA 12+)");
  return fn;
}

// A TMA map over `outer` row-stored 16-bit matrices [rows][cols] (`ld` elements between rows,
// `outer_stride` between matrices), 128-byte swizzle, boxes of 64 columns × `box_rows` rows;
// coordinates outside it read as zeros.
template <class T>
CUtensorMap tensor_map(const T* data, int64_t cols, int64_t rows, int64_t outer, int64_t ld,
                       int64_t outer_stride, int box_rows) {
  const int64_t matrix = outer > 1 ? outer_stride : ld * rows;  // a stride TMA accepts when unused
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(outer), 1};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(ld) * sizeof(T),
                                 static_cast<cuuint64_t>(matrix) * sizeof(T),
                                 static_cast<cuuint64_t>(matrix) * outer * sizeof(T)};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t elem[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult r =
      tensor_map_encoder()(&map,
                           std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                            : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                           4, const_cast<T*>(data), dims, strides, box, elem,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    fail(HK_STATUS_DEVICE_ERROR, "megablocks cuda: cuTensorMapEncodeTiled failed with CUresult " +
                                     std::to_string(r) + " (" + std::to_string(rows) + " x " +
                                     std::to_string(cols) + " operand)");
  return map;
}

// The M-grouped GEMM on the TMA kernels: A and the outputs have `rows` stored (expert-sorted) rows,
// A copied whole (the TMA kernels gather no rows).
template <Major LB, Epi E>
void m_grouped_tma(const MGroupedParams<__nv_bfloat16>& p, int64_t rows, cudaStream_t stream) {
  using T = __nv_bfloat16;
  if (p.k <= 0 || p.a.gather)  // (the kernel stores its accumulators after a k-tile at least)
    fail(HK_STATUS_INVALID_ARGUMENT,
         "megablocks cuda: the TMA expert GEMMs need whole operands and a K extent");
  tma::MGroupedMaps maps{};
  maps.a = tensor_map(p.a.ptr, p.k, rows, 1, p.a.ld, 0, tma::kBM);
  if constexpr (E == Epi::Store) {
    maps.out[0] = tensor_map(static_cast<const T*>(p.epi.out), p.n, rows, 1, p.epi.ld, 0, 64);
  } else if constexpr (E == Epi::SwigluForward) {
    const int64_t I = p.epi.inter;
    if (p.epi.gate_up) {  // gate and up columns as two [rows][I] tensors of row stride 2I
      maps.out[0] = tensor_map(p.epi.gate_up, I, rows, 1, 2 * I, 0, 64);
      maps.out[1] = tensor_map(p.epi.gate_up + I, I, rows, 1, 2 * I, 0, 64);
    }
    maps.out[2] = tensor_map(p.epi.act, I, rows, 1, I, 0, 64);
  }
  if constexpr (LB == Major::K)  // [N][K] per expert (SwiGLU: gate rows, then up rows)
    maps.b = tensor_map(p.b.ptr, p.k, E == Epi::SwigluForward ? 2 * p.n : p.n, p.groups.count,
                        p.b.ld, p.b.group_stride, 128);
  else  // [K][N] per expert
    maps.b = tensor_map(p.b.ptr, p.n, p.b_rows, p.groups.count, p.b.ld, p.b.group_stride, 64);
  auto kernel = tma::m_grouped_gemm<T, LB, E>;
  const int blocks = configure<TmaMGroupedTag<T, LB, E>>(kernel, tma::kSmemBytes, tma::kThreads);
  kernel<<<blocks, tma::kThreads, tma::kSmemBytes, stream>>>(p, maps);
  check(cudaGetLastError(), "M-grouped GEMM (tma) launch");
}

// The K-grouped GEMM on the TMA kernels: A and B have `rows` stored (expert-sorted) rows, copied
// whole.
void k_grouped_tma(const KGroupedParams<__nv_bfloat16>& p, int64_t rows, cudaStream_t stream) {
  using T = __nv_bfloat16;
  if (p.a.gather || p.b.gather)
    fail(HK_STATUS_INVALID_ARGUMENT, "megablocks cuda: the TMA expert GEMMs need whole operands");
  tma::KGroupedMaps maps{};
  maps.a_tile = tensor_map(p.a.ptr, p.m, rows, 1, p.a.ld, 0, 64);
  maps.b_tile = tensor_map(p.b.ptr, p.n, rows, 1, p.b.ld, 0, 64);
  if (!p.accumulate)
    maps.out = tensor_map(p.out, p.n, p.m_store, p.groups.count, p.n, p.m_store * p.n, 64);
  auto kernel = tma::k_grouped_gemm<T>;
  const int blocks = configure<TmaKGroupedTag<T>>(kernel, tma::kSmemBytes, tma::kThreads);
  kernel<<<blocks, tma::kThreads, tma::kSmemBytes, stream>>>(p, maps);
  check(cudaGetLastError(), "K-grouped GEMM (tma) launch");
}
#endif

// `rows`: the expert-sorted rows of the operands and outputs (the TMA kernels' maps need them;
// the others do not).
template <class T, Major LB, Epi E>
void m_grouped_on(const MGroupedParams<T>& p, cudaStream_t stream, const GemmKernels& g,
                  int64_t rows = 0) {
#if MEGABLOCKS_WGMMA
  // (The TMA path runs the SwiGLU backward after a Store GEMM: no TMA instance of that epilogue.)
  if constexpr (std::is_same_v<T, __nv_bfloat16> && E != Epi::StoreF32 &&
                E != Epi::SwigluBackward) {
    if (g.tma) {
      m_grouped_tma<LB, E>(p, rows, stream);
      return;
    }
  }
  if (g.wgmma) {
    auto kernel = sm90::m_grouped_gemm<T, LB, E>;
    const int blocks = configure<Sm90MGroupedTag<T, LB, E>>(kernel, sm90::kSmemBytes);
    MB_LAUNCH(kernel, blocks, sm90::kThreads, sm90::kSmemBytes, stream)(p);
    check(cudaGetLastError(), "M-grouped GEMM (wgmma) launch");
    return;
  }
#endif
  m_grouped<T, LB, E>(p, stream, g.bn);
}

template <class T>
void k_grouped_on(const KGroupedParams<T>& p, cudaStream_t stream, const GemmKernels& g,
                  int64_t rows = 0) {
#if MEGABLOCKS_WGMMA
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (g.tma) {
      k_grouped_tma(p, rows, stream);
      return;
    }
  }
  if (g.wgmma) {
    auto kernel = sm90::k_grouped_gemm<T>;
    configure<Sm90KGroupedTag<T>>(kernel, sm90::kSmemBytes);
    const dim3 grid(static_cast<unsigned>(ceil_div(p.n, sm90::kBN)),
                    static_cast<unsigned>(ceil_div(p.m_store, sm90::kBM)),
                    static_cast<unsigned>(p.groups.count));
    MB_LAUNCH(kernel, grid, sm90::kThreads, sm90::kSmemBytes, stream)(p);
    check(cudaGetLastError(), "K-grouped GEMM (wgmma) launch");
    return;
  }
#endif
  k_grouped(p, stream);
}

// HK_MEGABLOCKS_TIMING=1: an event after each stage of a pass; finish() waits for the last and
// prints every stage's time to stderr. Off (the default) it does nothing.
class StageTimer {
 public:
  StageTimer(cudaStream_t stream, const char* pass, const GemmKernels& g)
      : stream_(stream),
        pass_(pass),
        path_(g.tma     ? "tma"
              : g.wgmma ? "wgmma"
                        : "mma") {
    const char* v = std::getenv("HK_MEGABLOCKS_TIMING");
    on_ = v && std::string(v) == "1";
    mark("start");
  }
  void mark(const char* stage) {
    if (!on_) return;
    cudaEvent_t e;
    check(cudaEventCreate(&e), "cudaEventCreate");
    check(cudaEventRecord(e, stream_), "cudaEventRecord");
    marks_.push_back({stage, e});
  }
  void finish() {
    if (!on_) return;
    check(cudaEventSynchronize(marks_.back().event), "cudaEventSynchronize");
    for (size_t i = 1; i < marks_.size(); ++i) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, marks_[i - 1].event, marks_[i].event),
            "cudaEventElapsedTime");
      std::fprintf(stderr, "megablocks timing: %-8s %-5s %-26s %8.3f ms\n", pass_, path_,
                   marks_[i].stage, ms);
    }
    for (const Mark& m : marks_) cudaEventDestroy(m.event);
    marks_.clear();
  }

 private:
  struct Mark {
    const char* stage;
    cudaEvent_t event;
  };
  cudaStream_t stream_;
  const char *pass_, *path_;
  bool on_ = false;
  std::vector<Mark> marks_;
};

// ---- workspace ---------------------------------------------------------------------------------

// Carves aligned buffers out of the workspace (or, with base null, only counts their bytes).
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  template <class U>
  U* take(int64_t count) {
    const size_t at = (used_ + 255) / 256 * 256;
    used_ = at + static_cast<size_t>(count) * sizeof(U);
    return base_ ? reinterpret_cast<U*>(base_ + at) : nullptr;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

int64_t padded_experts(int64_t E) {
  return ceil_div(E, 8) * 8;
}

// The permutation's buffers (forward and backward).
struct Permutation {
  int32_t *hist, *rank, *sorted_token, *position;
  float* sorted_weight;
  int64_t *offsets, *tile_offsets, *one_group, *one_group_tiles;
};

Permutation carve_permutation(Carver& w, const MoeCall& c) {
  const int64_t n = c.assignments();
  Permutation p;
  p.hist = w.take<int32_t>(num_chunks(n) * c.E);
  p.rank = w.take<int32_t>(n);
  p.sorted_token = w.take<int32_t>(n);
  p.position = w.take<int32_t>(n);
  p.sorted_weight = w.take<float>(n);
  p.offsets = w.take<int64_t>(c.E + 1);
  p.tile_offsets = w.take<int64_t>(c.E + 1);
  p.one_group = w.take<int64_t>(2);
  p.one_group_tiles = w.take<int64_t>(2);
  return p;
}

template <class T>
struct ForwardBuffers {
  Permutation perm;
  T* logits;
  int32_t* ids;
  float* weights;
  T *act, *out;
};

template <class T>
ForwardBuffers<T> carve_forward(Carver& w, const MoeCall& c) {
  ForwardBuffers<T> b;
  b.perm = carve_permutation(w, c);
  const int64_t n = c.assignments();
  b.logits = c.router_logits ? static_cast<T*>(c.router_logits) : w.take<T>(c.T * c.E);
  b.ids = c.topk_ids ? c.topk_ids : w.take<int32_t>(n);
  b.weights = c.topk_weights ? c.topk_weights : w.take<float>(n);
  b.act = w.take<T>(n * c.I);
  b.out = w.take<T>(n * c.H);
  return b;
}

template <class T>
struct BackwardBuffers {
  Permutation perm;
  T *dgate_up, *act_weighted, *dlogits, *drows;
  float *partial, *dweights, *dx_router;
  int32_t router_chunks;  // d(router_w) split-K (wgmma kernels): chunks, their offsets and parts
  int64_t* router_offsets;
  float* router_parts;
};

template <class T>
BackwardBuffers<T> carve_backward(Carver& w, const MoeCall& c) {
  BackwardBuffers<T> b;
  b.perm = carve_permutation(w, c);
  const int64_t n = c.assignments();
  b.dgate_up = w.take<T>(n * 2 * c.I);
  b.act_weighted = w.take<T>(n * c.I);
  b.partial = w.take<float>(n * ceil_div(c.I, 128));  // parts per row: I / BN, BN ≥ 128
  b.dweights = w.take<float>(n);
  b.dlogits = w.take<T>(c.T * padded_experts(c.E));
  b.dx_router = w.take<float>(c.T * c.H);
  b.router_chunks = static_cast<int32_t>(ceil_div(c.T, kRouterSplitRows));
  b.router_offsets = w.take<int64_t>(b.router_chunks + 1);
  b.router_parts = w.take<float>(b.router_chunks * c.E * c.H);
  b.drows = w.take<T>(n * c.H);
  return b;
}

void check_layout(const MoeCall& c, std::initializer_list<const void*> pointers) {
  if (c.dtype != HK_DTYPE_BF16 && c.dtype != HK_DTYPE_F16)
    fail(HK_STATUS_UNSUPPORTED, "megablocks cuda computes in bf16 or f16, not " +
                                    std::string(hk::sdk::dtype_code_name(c.dtype)));
  if (c.H % 8 != 0 || c.I % 8 != 0)
    fail(HK_STATUS_UNSUPPORTED, "megablocks cuda needs hidden (" + std::to_string(c.H) +
                                    ") and moe_intermediate (" + std::to_string(c.I) +
                                    ") sizes that are multiples of 8");
  for (const void* p : pointers)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0)
      fail(HK_STATUS_UNSUPPORTED, "megablocks cuda needs 16-byte aligned tensors");
}

// The permutation of `ids` (with their weights) on the stream.
void permute(const MoeCall& c, const int32_t* ids, const float* weights, const Permutation& p,
             cudaStream_t stream) {
  const int64_t n = c.assignments(), chunks = num_chunks(n);
  const int32_t E = static_cast<int32_t>(c.E), k = static_cast<int32_t>(c.k);
  MB_LAUNCH(chunk_kernel, static_cast<unsigned>(chunks), kChunk, E * sizeof(int32_t), stream)
  (ids, n, E, p.hist, p.rank);
  MB_LAUNCH(offsets_kernel, 1, 1024, E * sizeof(int64_t), stream)
  (p.hist, chunks, E, p.offsets, p.tile_offsets);
  MB_LAUNCH(scatter_kernel, static_cast<unsigned>(ceil_div(n, 256)), 256, 0, stream)
  (ids, weights, p.rank, p.hist, p.offsets, n, E, k, p.sorted_token, p.sorted_weight, p.position);
  check(cudaGetLastError(), "permutation launch");
}

// dst = the rows of src (x or dy, [T][H]) in expert order (the permutation's positions).
template <class T>
void to_expert_order(const T* src, const int32_t* position, const MoeCall& c, T* dst,
                     cudaStream_t stream) {
  MB_LAUNCH(expert_order_kernel<T>, static_cast<unsigned>(c.T), 128, 0, stream)
  (src, position, static_cast<int32_t>(c.k), c.H, dst);
  check(cudaGetLastError(), "expert-order copy launch");
}

template <class T>
void forward_typed(const MoeCall& c, void* workspace, cudaStream_t stream) {
  Carver w(workspace);
  const ForwardBuffers<T> b = carve_forward<T>(w, c);
  const Groups experts{b.perm.offsets, b.perm.tile_offsets, static_cast<int32_t>(c.E)};
  const Groups one{b.perm.one_group, b.perm.one_group_tiles, 1};
  const int64_t n = c.assignments();
  const int32_t E = static_cast<int32_t>(c.E), k = static_cast<int32_t>(c.k);

  const GemmKernels gemm = gemm_kernels().for_dtype<T>();
  StageTimer timer(stream, "forward", gemm);
  MB_LAUNCH(single_group_kernel, 1, 1, 0, stream)(c.T, b.perm.one_group, b.perm.one_group_tiles);
  MGroupedParams<T> router;
  router.a = {static_cast<const T*>(c.x), c.H, 0, nullptr};
  router.b = {static_cast<const T*>(c.router_w), c.H, 0, nullptr};
  router.n = c.E;
  router.k = c.H;
  router.groups = one;
  router.epi.out = b.logits;
  router.epi.ld = c.E;
  m_grouped_on<T, Major::K, Epi::Store>(router, stream, gemm.router());
  timer.mark("router GEMM");
  MB_LAUNCH(route_kernel<T>, static_cast<unsigned>(ceil_div(c.T, kRouteWarps)), 32 * kRouteWarps, 0,
            stream)
  (b.logits, c.T, E, k, c.attrs.norm_topk_prob != 0, b.ids, b.weights);
  timer.mark("routing");
  permute(c, b.ids, b.weights, b.perm, stream);
  timer.mark("permute");

  MGroupedParams<T> up;
  up.a = {static_cast<const T*>(c.x), c.H, 0, b.perm.sorted_token};
  if (gemm.tma) {  // x in expert order, copied whole by TMA; b.out is free until the down GEMM
    to_expert_order(static_cast<const T*>(c.x), b.perm.position, c, b.out, stream);
    up.a = {b.out, c.H, 0, nullptr};
    timer.mark("x in expert order");
  }
  up.b = {static_cast<const T*>(c.gate_up_w), c.H, 2 * c.I * c.H, nullptr};
  up.n = c.I;
  up.k = c.H;
  up.groups = experts;
  up.epi.inter = c.I;
  up.epi.activation = c.attrs.activation;
  up.epi.gate_up = static_cast<T*>(c.gate_up);  // training: the saved pre-activations
  up.epi.act = b.act;
  m_grouped_on<T, Major::K, Epi::SwigluForward>(up, stream, gemm, n);
  timer.mark("gate_up GEMM + SwiGLU");

  MGroupedParams<T> down;
  down.a = {b.act, c.I, 0, nullptr};
  down.b = {static_cast<const T*>(c.down_w), c.I, c.H * c.I, nullptr};
  down.n = c.H;
  down.k = c.I;
  down.groups = experts;
  down.epi.out = b.out;
  down.epi.ld = c.H;
  m_grouped_on<T, Major::K, Epi::Store>(down, stream, gemm, n);
  timer.mark("down GEMM");

  MB_LAUNCH(combine_kernel<T>, static_cast<unsigned>(c.T), 128, 0, stream)
  (b.out, b.perm.position, b.weights, k, c.H, static_cast<T*>(c.y));
  check(cudaGetLastError(), "combine launch");
  timer.mark("weighted un-permutation");
  timer.finish();
}

template <class T>
void backward_typed(const MoeCall& c, void* workspace, cudaStream_t stream) {
  Carver w(workspace);
  const BackwardBuffers<T> b = carve_backward<T>(w, c);
  const Permutation& perm = b.perm;
  const Groups experts{perm.offsets, perm.tile_offsets, static_cast<int32_t>(c.E)};
  const Groups one{perm.one_group, perm.one_group_tiles, 1};
  const int64_t n = c.assignments(), Ep = padded_experts(c.E);
  const int32_t E = static_cast<int32_t>(c.E), k = static_cast<int32_t>(c.k);
  const GemmKernels gemm = gemm_kernels().for_dtype<T>();
  StageTimer timer(stream, "backward", gemm);
  // An expert weight gradient: Σ over each expert's rows of aᵀ ⊗ b → out [E][m][n_cols].
  auto weight_gradient = [&](const Operand<T>& a, const Operand<T>& b_rows, int64_t m,
                             int64_t n_cols, void* out, const char* stage) {
    KGroupedParams<T> p;
    p.a = a;
    p.b = b_rows;
    p.m = p.m_store = m;
    p.n = n_cols;
    p.groups = experts;
    p.out = static_cast<T*>(out);
    p.accumulate = c.accumulate;
    k_grouped_on(p, stream, gemm, n);
    timer.mark(stage);
  };
  MB_LAUNCH(single_group_kernel, 1, 1, 0, stream)(c.T, perm.one_group, perm.one_group_tiles);
  permute(c, c.topk_ids, c.topk_weights, perm, stream);
  timer.mark("permute");

  // The TMA kernels read dy and x in expert order, copied into drows while it is free: dy for
  // d(act) and d(down_w) (both before the dx rows GEMM writes drows), x after the dx
  // un-permutation for d(gate_up_w).
  const T* dy = static_cast<const T*>(c.dy);
  const int32_t* dy_rows = perm.sorted_token;
  if (gemm.tma) {
    to_expert_order(dy, perm.position, c, b.drows, stream);
    dy = b.drows;
    dy_rows = nullptr;
    timer.mark("dy in expert order");
  }

  // d(act)/w = dy[token] · down_w (down_w [H, I] is [K, N]) + the SwiGLU backward (in the GEMM's
  // epilogue, or on the TMA path a kernel of its own after the GEMM stored d(act)/w).
  MGroupedParams<T> dact;
  dact.a = {dy, c.H, 0, dy_rows};
  dact.b = {static_cast<const T*>(c.down_w), c.I, c.H * c.I, nullptr};
  dact.n = c.I;
  dact.k = c.H;
  dact.b_rows = c.H;
  dact.groups = experts;
  dact.epi.inter = c.I;
  dact.epi.activation = c.attrs.activation;
  dact.epi.gate_up = static_cast<T*>(c.gate_up);
  dact.epi.act = b.act_weighted;
  dact.epi.dgate_up = b.dgate_up;
  dact.epi.row_weight = perm.sorted_weight;
  dact.epi.partial = b.partial;
  int64_t dweight_parts = ceil_div(c.I, gemm.bn);  // per row
  if (gemm.tma) {
    dact.epi.out = b.act_weighted;
    dact.epi.ld = c.I;
    m_grouped_on<T, Major::MN, Epi::Store>(dact, stream, gemm, n);
    timer.mark("d(act) GEMM");
    MB_LAUNCH(swiglu_backward_kernel<T>, static_cast<unsigned>(ceil_div(n, 8)), 256, 0, stream)
    (b.act_weighted, static_cast<const T*>(c.gate_up), perm.sorted_weight, n, c.I,
     c.attrs.activation, b.dgate_up, b.partial);
    check(cudaGetLastError(), "SwiGLU backward launch");
    dweight_parts = 1;
    timer.mark("SwiGLU bwd");
  } else {
    m_grouped_on<T, Major::MN, Epi::SwigluBackward>(dact, stream, gemm);
    timer.mark("d(act) GEMM + SwiGLU bwd");
  }

  if (c.ddown_w)  // Σ_rows dy[token]ᵀ ⊗ w·act  →  [H, I] per expert
    weight_gradient({dy, c.H, 0, dy_rows}, {b.act_weighted, c.I, 0, nullptr}, c.H, c.I, c.ddown_w,
                    "d(down_w) GEMM");
  MB_LAUNCH(dweight_kernel, static_cast<unsigned>(ceil_div(n, 256)), 256, 0, stream)
  (b.partial, perm.position, n, dweight_parts, b.dweights);
  MB_LAUNCH(route_backward_kernel<T>, static_cast<unsigned>(ceil_div(c.T, kRouteWarps)),
            32 * kRouteWarps, 0, stream)
  (static_cast<const T*>(c.router_logits), c.topk_ids, c.topk_weights, b.dweights, c.drouter_logits,
   c.T, E, static_cast<int32_t>(Ep), k, c.attrs.norm_topk_prob != 0, b.dlogits);
  check(cudaGetLastError(), "routing backward launch");
  timer.mark("d(weight) + routing bwd");

  // The router: dx part (f32, added by the un-permutation) and d(router_w).
  MGroupedParams<T> rdx;
  rdx.a = {b.dlogits, Ep, 0, nullptr};
  rdx.b = {static_cast<const T*>(c.router_w), c.H, 0, nullptr};
  rdx.n = c.H;
  rdx.k = Ep;
  rdx.b_rows = c.E;
  rdx.groups = one;
  rdx.epi.out = b.dx_router;
  rdx.epi.ld = c.H;
  m_grouped_on<T, Major::MN, Epi::StoreF32>(rdx, stream, gemm.router());
  timer.mark("router dx GEMM");
  if (c.drouter_w) {
    KGroupedParams<T> dwr;
    dwr.a = {b.dlogits, Ep, 0, nullptr};
    dwr.b = {static_cast<const T*>(c.x), c.H, 0, nullptr};
    dwr.m = Ep;
    dwr.m_store = c.E;
    dwr.n = c.H;
    dwr.groups = one;
    dwr.out = static_cast<T*>(c.drouter_w);
    dwr.accumulate = c.accumulate;
    if (gemm.wgmma && b.router_chunks > 1) {
      MB_LAUNCH(split_rows_kernel, 1, 256, 0, stream)
      (c.T, kRouterSplitRows, b.router_chunks, b.router_offsets);
      dwr.groups = Groups{b.router_offsets, nullptr, b.router_chunks};
      dwr.out_f32 = b.router_parts;
      k_grouped_on(dwr, stream, gemm.router());
      const int64_t count = c.E * c.H;
      MB_LAUNCH(sum_parts_kernel<T>, static_cast<unsigned>(ceil_div(count, 256)), 256, 0, stream)
      (b.router_parts, b.router_chunks, count, c.accumulate, static_cast<T*>(c.drouter_w));
      check(cudaGetLastError(), "d(router_w) split launch");
    } else {
      k_grouped_on(dwr, stream, gemm.router());
    }
  }
  timer.mark("d(router_w) GEMM");

  // dx rows = d(gate ‖ up) · gate_up_w (gate_up_w [2I, H] is [K, N]); then the sum per token.
  MGroupedParams<T> drows;
  drows.a = {b.dgate_up, 2 * c.I, 0, nullptr};
  drows.b = {static_cast<const T*>(c.gate_up_w), c.H, 2 * c.I * c.H, nullptr};
  drows.n = c.H;
  drows.k = 2 * c.I;
  drows.b_rows = 2 * c.I;
  drows.groups = experts;
  drows.epi.out = b.drows;
  drows.epi.ld = c.H;
  m_grouped_on<T, Major::MN, Epi::Store>(drows, stream, gemm, n);
  timer.mark("dx rows GEMM");
  MB_LAUNCH(combine_backward_kernel<T>, static_cast<unsigned>(c.T), 128, 0, stream)
  (b.drows, perm.position, k, c.H, b.dx_router, static_cast<T*>(c.dx));
  check(cudaGetLastError(), "un-permutation launch");
  timer.mark("dx un-permutation");

  if (c.dgate_up_w) {  // Σ_rows d(gate ‖ up)ᵀ ⊗ x[token]  →  [2I, H] per expert
    Operand<T> x_rows{static_cast<const T*>(c.x), c.H, 0, perm.sorted_token};
    if (gemm.tma) {
      to_expert_order(static_cast<const T*>(c.x), perm.position, c, b.drows, stream);
      x_rows = {b.drows, c.H, 0, nullptr};
      timer.mark("x in expert order");
    }
    weight_gradient({b.dgate_up, 2 * c.I, 0, nullptr}, x_rows, 2 * c.I, c.H, c.dgate_up_w,
                    "d(gate_up_w) GEMM");
  }
  timer.finish();
}

}  // namespace

namespace {
// One entry call: checks, the workspace against what the pass carves, then the typed pass.
template <class Carve, class Run>
void run_pass(const hk_call& call, const MoeCall& c, Carve&& carve, Run&& run) {
  if (c.T == 0) return;
  Carver need(nullptr);
  carve(need);  // the buffers' bytes do not depend on bf16 vs f16
  if (call.workspace_size < need.used() || !call.workspace)
    fail(HK_STATUS_INVALID_ARGUMENT, "megablocks cuda: the workspace is smaller than asked for");
  run(static_cast<cudaStream_t>(call.stream));
}
}  // namespace

void forward(const hk_call& call) {
  const MoeCall c = parse_forward(call, HK_DEVICE_CUDA);
  check_layout(c, {c.x, c.router_w, c.gate_up_w, c.down_w, c.y, c.router_logits, c.gate_up});
  run_pass(
      call, c, [&](Carver& w) { carve_forward<__nv_bfloat16>(w, c); },
      [&](cudaStream_t stream) {
        if (c.dtype == HK_DTYPE_BF16)
          forward_typed<__nv_bfloat16>(c, call.workspace, stream);
        else
          forward_typed<__half>(c, call.workspace, stream);
      });
}

void backward(const hk_call& call) {
  const MoeCall c = parse_backward(call, HK_DEVICE_CUDA);
  check_layout(c, {c.x, c.dy, c.router_w, c.gate_up_w, c.down_w, c.router_logits, c.gate_up, c.dx,
                   c.drouter_w, c.dgate_up_w, c.ddown_w});
  run_pass(
      call, c, [&](Carver& w) { carve_backward<__nv_bfloat16>(w, c); },
      [&](cudaStream_t stream) {
        if (c.dtype == HK_DTYPE_BF16)
          backward_typed<__nv_bfloat16>(c, call.workspace, stream);
        else
          backward_typed<__half>(c, call.workspace, stream);
      });
}

size_t workspace(const hk_call& call, uint32_t pass) {
  Carver need(nullptr);
  if (pass == HK_PASS_BACKWARD) {
    const MoeCall c = parse_backward(call, HK_DEVICE_CUDA);
    carve_backward<__nv_bfloat16>(need, c);
  } else {
    const MoeCall c = parse_forward(call, HK_DEVICE_CUDA);
    carve_forward<__nv_bfloat16>(need, c);
  }
  return need.used();
}

}  // namespace megablocks::cuda
