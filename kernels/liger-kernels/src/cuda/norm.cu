// cuda/norm.cu — RMSNorm and LayerNorm, forward and backward, for rows of any width.
//
// Design (memory-bound: each row is read once and written once):
//  * A group of G threads owns a row: G = 32 (one warp, shuffles only) when the row fits in
//    32 threads × 4 packs of 16 bytes (H ≤ 1024 in bf16), else G = 256 (the block). The row
//    stays in registers as packed 16-bit values between the reduction and the write.
//  * Operands that are not 16-byte aligned or whose width is not a multiple of the pack use the
//    "loop" kernels: one block per row, scalar accesses, the row re-read from L1/L2.
//  * Short RMSNorm rows (Qwen3's per-head q_norm/k_norm: 128 bf16 elements) would leave half a
//    warp idle with one row in flight per warp, so rows of 8 or 16 packs go to the "rows"
//    kernels: a group of G = 8 or 16 lanes owns a row (its weight slice stays in registers) and
//    each thread keeps kRowsInFlight rows of loads in flight. The row sums reduce in the same
//    lane order as the warp kernels (lanes past the row added zeros there), so the forward's
//    values are unchanged.
//  * Backward is persistent (a fixed grid of 2 blocks per SM striding over rows): each thread
//    accumulates d(weight) (and d(bias)) for its own columns in f32 registers, the block
//    combines its groups in shared memory in a fixed order and writes one partial row to the
//    workspace; a second small kernel sums the partial rows in order. No atomics, deterministic.
// LayerNorm is a runtime flag of the same kernels (uniform branch), not a second copy.

#include "cuda/common.cuh"
#include "liger/cuda_ops.h"

namespace liger::cuda {
namespace {

constexpr int kThreads = 256;

// Programmatic dependent launch (sm_90): a grid launched with programmatic stream serialization
// may start while the previous kernel of the stream is finishing. It waits for that kernel (and
// its memory) before touching memory, and lets the next kernel start launching at once — its
// blocks take SMs as ours retire. No-ops on older architectures and for ordinary launches.
__device__ __forceinline__ void pdl_wait_and_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

struct NormP {
  const void* x;
  void* y;  // forward output / backward dx
  const void* dy;
  int64_t rows, cols, x_stride, y_stride, dy_stride;
  const void* w;
  Dt w_dt;
  const void* b;
  Dt b_dt;
  float* mean_out;
  float* rstd_out;
  const float* mean_in;
  const float* rstd_in;
  float eps, offset;
  bool layer_norm, llama_round, want_param_grad;
  bool w_packed, b_packed;  // weight / bias have x's dtype and 16-byte alignment
  float* partials;          // [gridDim.x][cols] (×2 for LayerNorm: dw then db)
};

// ---- register-resident kernels ------------------------------------------------------------------
// Persistent: a group strides over rows; before reducing row r it asks L2 for row r + stride, so
// the memory pipe stays busy through the reduction and the write (warps would otherwise load,
// compute and store in lockstep waves).
template <class T, int G, int V>
__global__ void __launch_bounds__(kThreads) norm_fwd_vec(NormP p) {
  constexpr int N = 16 / sizeof(T);
  __shared__ float red[32];
  const int gpb = kThreads / G, group = threadIdx.x / G, lane = threadIdx.x % G;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * gpb;
  // G == 256: one group per block, so every thread sees the same trip count (group_sum syncs).
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * gpb + group; r < p.rows; r += stride) {
    const T* x = static_cast<const T*>(p.x) + r * p.x_stride;
    Pack<T, N> xv[V];
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t c = (static_cast<int64_t>(v) * G + lane) * N;
      if (c < p.cols) xv[v] = ld<T, N>(x + c);
    }
    if (r + stride < p.rows) {
      const T* nx = static_cast<const T*>(p.x) + (r + stride) * p.x_stride;
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const int64_t c = (static_cast<int64_t>(v) * G + lane) * N;
        if (c < p.cols && (c * sizeof(T)) % 128 == 0) prefetch_l2(nx + c);
      }
    }
    float mean = 0, s = 0;
    if (p.layer_norm) {
#pragma unroll
      for (int v = 0; v < V; ++v)
        if ((static_cast<int64_t>(v) * G + lane) * N < p.cols)
#pragma unroll
          for (int i = 0; i < N; ++i) s += to_f32(xv[v].e[i]);
      mean = group_sum<G>(s, red) / p.cols;
      s = 0;
    }
#pragma unroll
    for (int v = 0; v < V; ++v)
      if ((static_cast<int64_t>(v) * G + lane) * N < p.cols)
#pragma unroll
        for (int i = 0; i < N; ++i) {
          const float d = to_f32(xv[v].e[i]) - mean;
          s += d * d;
        }
    const float rstd = rsqrtf(group_sum<G>(s, red) / p.cols + p.eps);
    if (lane == 0) {
      if (p.rstd_out) p.rstd_out[r] = rstd;
      if (p.mean_out) p.mean_out[r] = mean;
    }
    T* y = static_cast<T*>(p.y) + r * p.y_stride;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t c = (static_cast<int64_t>(v) * G + lane) * N;
      if (c >= p.cols) continue;
      Pack<T, N> out;
      float w[N], bias[N] = {};
      load_run<T, N>(p.w, p.w_dt, c, p.w_packed, w);
      if (p.layer_norm && p.b) load_run<T, N>(p.b, p.b_dt, c, p.b_packed, bias);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        float h = (to_f32(xv[v].e[i]) - mean) * rstd;
        float o;
        if (p.layer_norm) {
          o = h * w[i] + bias[i];
        } else {
          if (p.llama_round) h = round_as<T>(h);
          o = h * (p.offset + w[i]);
        }
        out.e[i] = from_f32<T>(o);
      }
      st<T, N>(y + c, out);
    }
  }
}

// RMSNorm forward when a row fits one warp (H ≤ 32·4·N): persistent, each warp strides over rows
// with the next row's loads issued before the current row is reduced and written (two rows of
// registers), so every warp keeps a row in flight. The weight is re-read per row (an L1 hit):
// keeping it in registers too would spill. Four 256-thread blocks per SM (≤ 64 registers).
// On the H200 at 16384 × 1024 bf16 it runs at a same-size cudaMemcpy's rate (81% of the large-copy
// bandwidth); measured and dropped (commit history): a one-warp-per-row grid (63%), one small
// block per row with a pack per thread (78%), streaming or read-only cache hints (76–78%).
template <class T, bool kLlama, bool kWPacked>
__global__ void __launch_bounds__(kThreads, 4) rms_fwd_warp(NormP p) {
  constexpr int N = 16 / sizeof(T), V = 4;
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  int64_t r = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (r >= p.rows) return;
  auto load_row = [&](int64_t row, Pack<T, N>(&xv)[V]) {
    const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t c = (static_cast<int64_t>(v) * 32 + lane) * N;
      if (c < p.cols) xv[v] = ld<T, N>(x + c);
    }
  };
  pdl_wait_and_release();
  Pack<T, N> cur[V], nxt[V];
  load_row(r, cur);
  for (; r < p.rows; r += warps) {
    if (r + warps < p.rows) load_row(r + warps, nxt);
    float s = 0;
#pragma unroll
    for (int v = 0; v < V; ++v)
      if ((static_cast<int64_t>(v) * 32 + lane) * N < p.cols)
#pragma unroll
        for (int i = 0; i < N; ++i) {
          const float d = to_f32(cur[v].e[i]);
          s += d * d;
        }
    const float rstd = rsqrtf(warp_sum(s) / p.cols + p.eps);
    if (lane == 0 && p.rstd_out) p.rstd_out[r] = rstd;
    T* y = static_cast<T*>(p.y) + r * p.y_stride;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t c = (static_cast<int64_t>(v) * 32 + lane) * N;
      if (c >= p.cols) continue;
      float w[N];
      load_run<T, N>(p.w, p.w_dt, c, kWPacked, w);
      Pack<T, N> out;
#pragma unroll
      for (int i = 0; i < N; ++i) {
        float h = to_f32(cur[v].e[i]) * rstd;
        if (kLlama) h = round_as<T>(h);
        out.e[i] = from_f32<T>(h * (p.offset + w[i]));
      }
      st<T, N>(y + c, out);
    }
#pragma unroll
    for (int v = 0; v < V; ++v) cur[v] = nxt[v];
  }
}

// Sum over an aligned group of G lanes (G a power of two ≤ 32); every lane of the warp must
// call it (xor partners stay inside the group).
template <int G>
__device__ __forceinline__ float lanes_sum(float v) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// rstd of a row held as one pack per lane of a G-lane group (every lane calls it; `live` false
// for a lane past the last row, which then contributes nothing).
template <class T, int N, int G>
__device__ __forceinline__ float pack_row_rstd(const Pack<T, N>& x, bool live, int64_t cols,
                                               float eps) {
  float s = 0;
  if (live)
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const float d = to_f32(x.e[i]);
      s += d * d;
    }
  return rsqrtf(lanes_sum<G>(s) / cols + eps);
}

constexpr int kRowsInFlight = 4;

// RMSNorm forward for rows of exactly G packs (G = 8 or 16): a G-lane group owns a row; the
// groups stride over rows kRowsInFlight at a time (all loads first, then reduce and write).
template <class T, int G, bool kLlama>
__global__ void __launch_bounds__(kThreads) rms_fwd_rows(NormP p) {
  constexpr int N = 16 / sizeof(T), U = kRowsInFlight;
  const int lane = threadIdx.x % G;
  const int64_t group = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / G;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * (kThreads / G);
  const int64_t c = static_cast<int64_t>(lane) * N;
  pdl_wait_and_release();  // (the weight may have just been updated by the optimizer)
  float w[N];
  load_run<T, N>(p.w, p.w_dt, c, p.w_packed, w);
  for (int64_t r0 = group; r0 < p.rows; r0 += groups * U) {
    Pack<T, N> xv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t r = r0 + u * groups;
      if (r < p.rows) xv[u] = ld<T, N>(static_cast<const T*>(p.x) + r * p.x_stride + c);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t r = r0 + u * groups;
      const bool live = r < p.rows;
      const float rstd = pack_row_rstd<T, N, G>(xv[u], live, p.cols, p.eps);
      if (!live) continue;
      if (lane == 0 && p.rstd_out) p.rstd_out[r] = rstd;
      Pack<T, N> out;
#pragma unroll
      for (int i = 0; i < N; ++i) {
        float h = to_f32(xv[u].e[i]) * rstd;
        if (kLlama) h = round_as<T>(h);
        out.e[i] = from_f32<T>(h * (p.offset + w[i]));
      }
      st<T, N>(static_cast<T*>(p.y) + r * p.y_stride + c, out);
    }
  }
}

// Writes this block's f32 partial sums of a per-column quantity: the G-thread groups' register
// accumulators are combined in shared memory (group order fixed) into partials[blockIdx.x].
template <int G, int V, int N>
__device__ void write_partials(const float (&acc)[V][N], float* out, int64_t cols, float* smem) {
  const int gpb = kThreads / G, group = threadIdx.x / G, lane = threadIdx.x % G;
  if (gpb == 1) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t c = (static_cast<int64_t>(v) * G + lane) * N;
      if (c < cols)
#pragma unroll
        for (int i = 0; i < N; ++i) out[c + i] = acc[v][i];
    }
    return;
  }
  __syncthreads();
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int64_t c = (static_cast<int64_t>(v) * G + lane) * N;
    if (c < cols)
#pragma unroll
      for (int i = 0; i < N; ++i) smem[group * cols + c + i] = acc[v][i];
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    float t = 0;
    for (int g = 0; g < gpb; ++g) t += smem[g * cols + c];
    out[c] = t;
  }
}

// kLN is a template flag here (not a runtime one as elsewhere) so RMSNorm's backward does not
// carry LayerNorm's d(bias) accumulators: it keeps the kernel at ≤ 128 registers, 2 blocks/SM.
template <class T, int G, int V, bool kLN>
__global__ void __launch_bounds__(kThreads, kLN ? 1 : 2) norm_bwd_vec(NormP p) {
  constexpr int N = 16 / sizeof(T);
  extern __shared__ float smem[];  // [gpb][cols] when G == 32
  __shared__ float red[32];
  const int gpb = kThreads / G, group = threadIdx.x / G, lane = threadIdx.x % G;
  float dw[V][N] = {}, db[V][kLN ? N : 1] = {};
  pdl_wait_and_release();
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * gpb + group; r < p.rows;
       r += static_cast<int64_t>(gridDim.x) * gpb) {
    // G == 256: the whole block iterates the same rows, so the bound is uniform.
    const int64_t next = r + static_cast<int64_t>(gridDim.x) * gpb;
    // Start the next row's bytes towards L2 (see norm_fwd_vec), before this row's loads, while
    // no packs are live (keeps the kernel within 128 registers).
    if (next < p.rows) {
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const int64_t c = (static_cast<int64_t>(v) * G + lane) * N;
        if (c < p.cols && (c * sizeof(T)) % 128 == 0) {
          prefetch_l2(static_cast<const T*>(p.x) + next * p.x_stride + c);
          prefetch_l2(static_cast<const T*>(p.dy) + next * p.dy_stride + c);
        }
      }
    }
    const T* x = static_cast<const T*>(p.x) + r * p.x_stride;
    const T* dy = static_cast<const T*>(p.dy) + r * p.dy_stride;
    Pack<T, N> xv[V], gv[V];
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t c = (static_cast<int64_t>(v) * G + lane) * N;
      if (c < p.cols) {
        xv[v] = ld<T, N>(x + c);
        gv[v] = ld<T, N>(dy + c);
      }
    }
    float mean = 0, rstd;
    if (p.rstd_in) {
      rstd = p.rstd_in[r];
      if (kLN) mean = p.mean_in[r];
    } else {
      float s = 0;
      if (kLN) {
#pragma unroll
        for (int v = 0; v < V; ++v)
          if ((static_cast<int64_t>(v) * G + lane) * N < p.cols)
#pragma unroll
            for (int i = 0; i < N; ++i) s += to_f32(xv[v].e[i]);
        mean = group_sum<G>(s, red) / p.cols;
        s = 0;
      }
#pragma unroll
      for (int v = 0; v < V; ++v)
        if ((static_cast<int64_t>(v) * G + lane) * N < p.cols)
#pragma unroll
          for (int i = 0; i < N; ++i) {
            const float d = to_f32(xv[v].e[i]) - mean;
            s += d * d;
          }
      rstd = rsqrtf(group_sum<G>(s, red) / p.cols + p.eps);
    }
    // g = dy·w' (w' = offset + w for RMS); c1 = mean(g) (LayerNorm only), c2 = mean(g·x̂).
    float s1 = 0, s2 = 0;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t c = (static_cast<int64_t>(v) * G + lane) * N;
      if (c < p.cols) {
        float w[N];
        load_run<T, N>(p.w, p.w_dt, c, p.w_packed, w);
#pragma unroll
        for (int i = 0; i < N; ++i) {
          const float g = to_f32(gv[v].e[i]) * ((kLN ? 0.0f : p.offset) + w[i]);
          const float h = (to_f32(xv[v].e[i]) - mean) * rstd;
          s1 += g;
          s2 += g * h;
        }
      }
    }
    const float c1 = kLN ? group_sum<G>(s1, red) / p.cols : 0.0f;
    const float c2 = group_sum<G>(s2, red) / p.cols;
    T* dx = static_cast<T*>(p.y) + r * p.y_stride;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t c = (static_cast<int64_t>(v) * G + lane) * N;
      if (c >= p.cols) continue;
      Pack<T, N> out;
      float w[N];
      load_run<T, N>(p.w, p.w_dt, c, p.w_packed, w);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const float d = to_f32(gv[v].e[i]), h = (to_f32(xv[v].e[i]) - mean) * rstd;
        out.e[i] = from_f32<T>(rstd * (d * ((kLN ? 0.0f : p.offset) + w[i]) - c1 - h * c2));
        dw[v][i] += d * (p.llama_round ? round_as<T>(h) : h);
        if constexpr (kLN) db[v][i] += d;
      }
      st<T, N>(dx + c, out);
    }
  }
  if (!p.want_param_grad) return;
  write_partials<G, V, N>(dw, p.partials + static_cast<int64_t>(blockIdx.x) * p.cols, p.cols, smem);
  if constexpr (kLN)
    write_partials<G, V, N>(db, p.partials + static_cast<int64_t>(gridDim.x + blockIdx.x) * p.cols,
                            p.cols, smem);
}

// RMSNorm backward for rows of exactly G packs (see rms_fwd_rows): persistent like
// norm_bwd_vec, kRowsInFlight rows of x and dy loaded before any is reduced; each thread keeps
// d(weight) for its N columns in f32 and the block writes one partial row.
template <class T, int G>
__global__ void __launch_bounds__(kThreads, 2) rms_bwd_rows(NormP p) {
  constexpr int N = 16 / sizeof(T), U = kRowsInFlight;
  extern __shared__ float smem[];  // [kThreads / G][cols]
  const int lane = threadIdx.x % G;
  const int64_t group = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / G;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * (kThreads / G);
  const int64_t c = static_cast<int64_t>(lane) * N;
  float dw[1][N] = {};
  pdl_wait_and_release();
  float w[N];
  load_run<T, N>(p.w, p.w_dt, c, p.w_packed, w);
#pragma unroll
  for (int i = 0; i < N; ++i) w[i] += p.offset;
  for (int64_t r0 = group; r0 < p.rows; r0 += groups * U) {
    Pack<T, N> xv[U], gv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t r = r0 + u * groups;
      if (r < p.rows) {
        xv[u] = ld<T, N>(static_cast<const T*>(p.x) + r * p.x_stride + c);
        gv[u] = ld<T, N>(static_cast<const T*>(p.dy) + r * p.dy_stride + c);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t r = r0 + u * groups;
      const bool live = r < p.rows;
      float rstd = 1.0f;
      if (p.rstd_in) {
        if (live) rstd = p.rstd_in[r];
      } else {
        rstd = pack_row_rstd<T, N, G>(xv[u], live, p.cols, p.eps);
      }
      float s2 = 0;
      if (live)
#pragma unroll
        for (int i = 0; i < N; ++i) s2 += to_f32(gv[u].e[i]) * w[i] * (to_f32(xv[u].e[i]) * rstd);
      const float c2 = lanes_sum<G>(s2) / p.cols;
      if (!live) continue;
      Pack<T, N> out;
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const float d = to_f32(gv[u].e[i]), h = to_f32(xv[u].e[i]) * rstd;
        out.e[i] = from_f32<T>(rstd * (d * w[i] - h * c2));
        dw[0][i] += d * (p.llama_round ? round_as<T>(h) : h);
      }
      st<T, N>(static_cast<T*>(p.y) + r * p.y_stride + c, out);
    }
  }
  if (!p.want_param_grad) return;
  write_partials<G, 1, N>(dw, p.partials + static_cast<int64_t>(blockIdx.x) * p.cols, p.cols, smem);
}

// ---- scalar kernels (any alignment, any width) --------------------------------------------------
template <class T>
__global__ void __launch_bounds__(kThreads) norm_fwd_loop(NormP p) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + r * p.x_stride;
  float mean = 0, s = 0;
  if (p.layer_norm) {
    for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) s += to_f32(x[c]);
    mean = group_sum<kThreads>(s, red) / p.cols;
    s = 0;
  }
  for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) {
    const float d = to_f32(x[c]) - mean;
    s += d * d;
  }
  const float rstd = rsqrtf(group_sum<kThreads>(s, red) / p.cols + p.eps);
  if (threadIdx.x == 0) {
    if (p.rstd_out) p.rstd_out[r] = rstd;
    if (p.mean_out) p.mean_out[r] = mean;
  }
  T* y = static_cast<T*>(p.y) + r * p.y_stride;
  for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) {
    float h = (to_f32(x[c]) - mean) * rstd, o;
    if (p.layer_norm) {
      o = h * load_dt(p.w, p.w_dt, c) + (p.b ? load_dt(p.b, p.b_dt, c) : 0.0f);
    } else {
      if (p.llama_round) h = round_as<T>(h);
      o = h * (p.offset + load_dt(p.w, p.w_dt, c));
    }
    y[c] = from_f32<T>(o);
  }
}

// Persistent; accumulates parameter grads straight into this block's partial row (each column
// belongs to one thread, so plain read-modify-write).
template <class T>
__global__ void __launch_bounds__(kThreads) norm_bwd_loop(NormP p) {
  __shared__ float red[32];
  float* pw = p.partials + static_cast<int64_t>(blockIdx.x) * p.cols;
  float* pb = p.partials + static_cast<int64_t>(gridDim.x + blockIdx.x) * p.cols;
  if (p.want_param_grad)
    for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) {
      pw[c] = 0;
      if (p.layer_norm) pb[c] = 0;
    }
  const float off = p.layer_norm ? 0.0f : p.offset;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const T* x = static_cast<const T*>(p.x) + r * p.x_stride;
    const T* dy = static_cast<const T*>(p.dy) + r * p.dy_stride;
    float mean = 0, rstd;
    if (p.rstd_in) {
      rstd = p.rstd_in[r];
      if (p.layer_norm) mean = p.mean_in[r];
    } else {
      float s = 0;
      if (p.layer_norm) {
        for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) s += to_f32(x[c]);
        mean = group_sum<kThreads>(s, red) / p.cols;
        s = 0;
      }
      for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) {
        const float d = to_f32(x[c]) - mean;
        s += d * d;
      }
      rstd = rsqrtf(group_sum<kThreads>(s, red) / p.cols + p.eps);
    }
    float s1 = 0, s2 = 0;
    for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) {
      const float g = to_f32(dy[c]) * (off + load_dt(p.w, p.w_dt, c));
      s1 += g;
      s2 += g * (to_f32(x[c]) - mean) * rstd;
    }
    const float c1 = p.layer_norm ? group_sum<kThreads>(s1, red) / p.cols : 0.0f;
    const float c2 = group_sum<kThreads>(s2, red) / p.cols;
    T* dx = static_cast<T*>(p.y) + r * p.y_stride;
    for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) {
      const float d = to_f32(dy[c]), h = (to_f32(x[c]) - mean) * rstd;
      if (p.want_param_grad) {
        pw[c] += d * (p.llama_round ? round_as<T>(h) : h);
        if (p.layer_norm) pb[c] += d;
      }
      dx[c] = from_f32<T>(rstd * (d * (off + load_dt(p.w, p.w_dt, c)) - c1 - h * c2));
    }
  }
}

// out[c] (+)= Σ_b partials[b][c]. A 32×32 block owns 32 columns: thread (x, y) sums the rows
// b ≡ y (mod 32) of column x (coalesced 128-byte rows), then row y = 0 adds the 32 partial sums in
// order — deterministic, and the ~2·SM partial rows are read by cols/32 blocks in parallel.
__global__ void __launch_bounds__(1024)
    sum_partials(const float* partials, int64_t nparts, int64_t cols, void* out, Dt out_dt,
                 bool accumulate) {
  __shared__ float acc[32][33];
  pdl_wait_and_release();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float t = 0;
  if (c < cols)
    for (int64_t b = threadIdx.y; b < nparts; b += 32) t += partials[b * cols + c];
  acc[threadIdx.y][threadIdx.x] = t;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  float sum = 0;
  for (int y = 0; y < 32; ++y) sum += acc[y][threadIdx.x];
  if (accumulate) sum += load_dt(out, out_dt, c);
  store_dt(out, out_dt, c, sum);
}

enum class Path { Rows8, Rows16, Warp, Block, Loop };

template <class T>
Path choose_path(const NormP& p) {
  constexpr int N = 16 / sizeof(T);
  const bool vec = aligned16(p.x) && aligned16(p.y) && p.cols % N == 0 && p.x_stride % N == 0 &&
                   p.y_stride % N == 0 && (!p.dy || (aligned16(p.dy) && p.dy_stride % N == 0));
  if (vec && !p.layer_norm && p.cols == 8 * N) return Path::Rows8;
  if (vec && !p.layer_norm && p.cols == 16 * N) return Path::Rows16;
  if (vec && p.cols <= 32 * 4 * N) return Path::Warp;  // (w_packed set by the launchers)
  if (vec && p.cols <= kThreads * 4 * N) return Path::Block;
  return Path::Loop;
}

int64_t bwd_grid(int64_t rows, int64_t cols) {
  // Rows per block for the warp path is 8; using the smaller bound keeps one formula for the
  // workspace size whatever path runs.
  const int64_t most = 2 * static_cast<int64_t>(sm_count());
  return rows < most ? (rows > 0 ? rows : 1) : most;
}

// Persistent forward grid: as many blocks as fit on the chip at once (never more than the work).
template <class K>
unsigned fwd_grid(int64_t blocks_needed, K kernel) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0) != cudaSuccess ||
      per_sm < 1)
    per_sm = 1;
  const int64_t most = static_cast<int64_t>(per_sm) * sm_count();
  return static_cast<unsigned>(blocks_needed < most ? blocks_needed : most);
}

// Launches with programmatic stream serialization where the device has it (sm_90+): the kernel
// must call pdl_wait_and_release() before touching memory a predecessor may write.
template <class K, class... Args>
void launch_pdl(K kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args... args) {
  if (compute_capability_major() < 9) {
    kernel<<<grid, block, smem, s>>>(args...);
    return;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  cudaLaunchKernelEx(&cfg, kernel, args...);
}

template <class T>
void set_packed(NormP& p) {
  p.w_packed = p.w_dt == dt_of<T>() && aligned16(p.w);
  p.b_packed = p.b != nullptr && p.b_dt == dt_of<T>() && aligned16(p.b);
}

template <class T>
int launch_fwd(NormP p, cudaStream_t s) {
  if (p.rows == 0) return 0;
  set_packed<T>(p);
  const Path path = choose_path<T>(p);
  if (path == Path::Rows8 || path == Path::Rows16) {
    const int g = path == Path::Rows8 ? 8 : 16;
    const int64_t blocks =
        (p.rows + (kThreads / g) * kRowsInFlight - 1) / ((kThreads / g) * kRowsInFlight);
    auto launch = [&](auto kernel) {
      launch_pdl(kernel, fwd_grid(blocks, kernel), kThreads, 0, s, p);
    };
    if (path == Path::Rows8)
      p.llama_round ? launch(rms_fwd_rows<T, 8, true>) : launch(rms_fwd_rows<T, 8, false>);
    else
      p.llama_round ? launch(rms_fwd_rows<T, 16, true>) : launch(rms_fwd_rows<T, 16, false>);
    return last_error();
  }
  switch (path) {
    case Path::Warp: {
      const int64_t blocks = (p.rows + 7) / 8;
      if (!p.layer_norm) {
        auto launch = [&](auto kernel) {
          launch_pdl(kernel, fwd_grid(blocks, kernel), kThreads, 0, s, p);
        };
        if (p.llama_round)
          p.w_packed ? launch(rms_fwd_warp<T, true, true>) : launch(rms_fwd_warp<T, true, false>);
        else
          p.w_packed ? launch(rms_fwd_warp<T, false, true>) : launch(rms_fwd_warp<T, false, false>);
        break;
      }
      norm_fwd_vec<T, 32, 4><<<fwd_grid(blocks, norm_fwd_vec<T, 32, 4>), kThreads, 0, s>>>(p);
      break;
    }
    case Path::Block:
      norm_fwd_vec<T, kThreads, 4>
          <<<fwd_grid(p.rows, norm_fwd_vec<T, kThreads, 4>), kThreads, 0, s>>>(p);
      break;
    default:
      norm_fwd_loop<T><<<p.rows, kThreads, 0, s>>>(p);
  }
  return last_error();
}

template <class T>
int launch_bwd(NormP p, void* dw, Dt dw_dt, void* db, Dt db_dt, bool accumulate, cudaStream_t s) {
  if (p.rows == 0) return 0;
  set_packed<T>(p);
  const int64_t grid = bwd_grid(p.rows, p.cols);
  p.want_param_grad = dw != nullptr || db != nullptr;
  switch (choose_path<T>(p)) {
    case Path::Rows8:
      launch_pdl(rms_bwd_rows<T, 8>, grid, kThreads, (kThreads / 8) * p.cols * sizeof(float), s, p);
      break;
    case Path::Rows16:
      launch_pdl(rms_bwd_rows<T, 16>, grid, kThreads, (kThreads / 16) * p.cols * sizeof(float), s,
                 p);
      break;
    case Path::Warp: {
      const size_t smem = (kThreads / 32) * p.cols * sizeof(float);
      if (p.layer_norm)
        norm_bwd_vec<T, 32, 4, true><<<grid, kThreads, smem, s>>>(p);
      else
        launch_pdl(norm_bwd_vec<T, 32, 4, false>, grid, kThreads, smem, s, p);
      break;
    }
    case Path::Block:
      if (p.layer_norm)
        norm_bwd_vec<T, kThreads, 4, true><<<grid, kThreads, 0, s>>>(p);
      else
        norm_bwd_vec<T, kThreads, 4, false><<<grid, kThreads, 0, s>>>(p);
      break;
    default:
      norm_bwd_loop<T><<<grid, kThreads, 0, s>>>(p);
  }
  if (int e = last_error()) return e;
  const unsigned blocks = static_cast<unsigned>((p.cols + 31) / 32);
  const dim3 threads(32, 32);
  if (dw)
    launch_pdl(sum_partials, blocks, threads, 0, s, static_cast<const float*>(p.partials), grid,
               p.cols, dw, dw_dt, accumulate);
  if (db)
    sum_partials<<<blocks, threads, 0, s>>>(p.partials + grid * p.cols, grid, p.cols, db, db_dt,
                                            accumulate);
  return last_error();
}

}  // namespace

namespace {
// One attribute of the current device, read once per device (launchers ask on every call); at
// least 1, so a failed query reads as "one SM" / "capability 1.x" (no sm_90 features).
template <cudaDeviceAttr kAttr>
int cached_device_attribute() {
  static int cached[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) dev = 0;
  if (cached[dev] == 0) {
    int n = 0;
    cudaDeviceGetAttribute(&n, kAttr, dev);
    cached[dev] = n > 0 ? n : 1;
  }
  return cached[dev];
}
}  // namespace

int sm_count() {
  return cached_device_attribute<cudaDevAttrMultiProcessorCount>();
}
int compute_capability_major() {
  return cached_device_attribute<cudaDevAttrComputeCapabilityMajor>();
}

size_t rms_norm_bwd_workspace_bytes(int64_t rows, int64_t cols) {
  return static_cast<size_t>(bwd_grid(rows, cols) * cols) * sizeof(float);
}
size_t layer_norm_bwd_workspace_bytes(int64_t rows, int64_t cols) {
  return 2 * rms_norm_bwd_workspace_bytes(rows, cols);
}

int rms_norm_fwd(const RmsNormFwd& a, void* stream) {
  NormP p{};
  p.x = a.x.data, p.y = a.y.data, p.rows = a.x.rows, p.cols = a.x.cols;
  p.x_stride = a.x.row_stride, p.y_stride = a.y.row_stride;
  p.w = a.w.data, p.w_dt = a.w.dt, p.rstd_out = a.rstd, p.eps = a.eps, p.offset = a.offset;
  p.llama_round = a.mode == CastMode::Llama;
  LIGER_DISPATCH_FLOAT(a.x.dt, T, return launch_fwd<T>(p, static_cast<cudaStream_t>(stream)));
}

int rms_norm_bwd(const RmsNormBwd& a, void* stream) {
  NormP p{};
  p.x = a.x.data, p.y = a.dx.data, p.dy = a.dy.data, p.rows = a.x.rows, p.cols = a.x.cols;
  p.x_stride = a.x.row_stride, p.y_stride = a.dx.row_stride, p.dy_stride = a.dy.row_stride;
  p.w = a.w.data, p.w_dt = a.w.dt, p.rstd_in = a.rstd, p.eps = a.eps, p.offset = a.offset;
  p.llama_round = a.mode == CastMode::Llama;
  p.partials = static_cast<float*>(a.workspace);
  LIGER_DISPATCH_FLOAT(a.x.dt, T,
                       return launch_bwd<T>(p, a.dw.data, a.dw.dt, nullptr, Dt::F32,
                                            a.accumulate_dw, static_cast<cudaStream_t>(stream)));
}

int layer_norm_fwd(const LayerNormFwd& a, void* stream) {
  NormP p{};
  p.x = a.x.data, p.y = a.y.data, p.rows = a.x.rows, p.cols = a.x.cols;
  p.x_stride = a.x.row_stride, p.y_stride = a.y.row_stride;
  p.w = a.w.data, p.w_dt = a.w.dt, p.b = a.b.data, p.b_dt = a.b.dt;
  p.mean_out = a.mean, p.rstd_out = a.rstd, p.eps = a.eps, p.layer_norm = true;
  LIGER_DISPATCH_FLOAT(a.x.dt, T, return launch_fwd<T>(p, static_cast<cudaStream_t>(stream)));
}

int layer_norm_bwd(const LayerNormBwd& a, void* stream) {
  NormP p{};
  p.x = a.x.data, p.y = a.dx.data, p.dy = a.dy.data, p.rows = a.x.rows, p.cols = a.x.cols;
  p.x_stride = a.x.row_stride, p.y_stride = a.dx.row_stride, p.dy_stride = a.dy.row_stride;
  p.w = a.w.data, p.w_dt = a.w.dt, p.eps = a.eps, p.layer_norm = true;
  if (a.mean && a.rstd) p.mean_in = a.mean, p.rstd_in = a.rstd;
  p.partials = static_cast<float*>(a.workspace);
  LIGER_DISPATCH_FLOAT(a.x.dt, T,
                       return launch_bwd<T>(p, a.dw.data, a.dw.dt, a.db.data, a.db.dt, a.accumulate,
                                            static_cast<cudaStream_t>(stream)));
}

}  // namespace liger::cuda
