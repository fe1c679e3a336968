// cuda/cross_entropy.cu — cross-entropy on given logits, loss and gradient in one launch.
//
// Pass 1 streams a row once with an online softmax (running max and Kahan-compensated sum of exp,
// rescaled once per 16-byte pack when the max grows), plus Σz for label smoothing; the partial
// (max, sum) pairs are merged in double into lse. Pass 2 writes the gradient, in place when
// grad == logits. Ignored rows skip pass 1 and write zeros. Mean's divisor is counted on the device
// by a tiny kernel before, and the scalar loss summed by one block after, in a fixed order: no
// host synchronisation, deterministic results.
//
// One 256-thread block per row, four per SM (measured on the H200, docs/performance.md): one
// pass (softmax only, or the gradient from a given lse) streams at 94–100% of copy bandwidth.
// Both passes in one call re-read the row from DRAM (528 rows in flight never fit L2); a variant
// that kept each row in the shared memory of a cluster of blocks, reading it from DRAM once, ran
// slower (3.80 ms against 3.46 ms at 16384 × 151936 bf16: per-block latency with ~38 KiB a block)
// and was dropped (commit 5d5cde3 has it).
#include <cfloat>

#include "cuda/ce_launch.h"
#include "cuda/common.cuh"
#include "liger/cuda_ops.h"

namespace liger::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kU = 4;  // 16-byte packs in flight per thread

// 2^x on the special-function unit, denormal results flushed to zero (terms below 2^-126 of the
// row maximum cannot change an f32 sum that already holds 1).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <bool kCap>
__device__ __forceinline__ float capped(float x, float cap) {
  if constexpr (kCap)
    return cap * tanhf(x / cap);
  else
    return x;
}

// Merges (m2, s2) into (m, s): s scaled to the larger max. An empty side has m = -inf. The sums
// are double; the scale factors are f32 (the side that holds the maximum is scaled by exactly 1,
// the other's relative error ~1e-7 is of a smaller term) — a double exp per merge would cost
// microseconds per row.
__device__ __forceinline__ void merge_d(float& m, double& s, float m2, double s2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) return;
  s = (m == -INFINITY ? 0.0
       : m == mn      ? s
                      : s * ex2((m - mn) * kLog2e)) +
      (m2 == -INFINITY ? 0.0
       : m2 == mn      ? s2
                       : s2 * ex2((m2 - mn) * kLog2e));
  m = mn;
}

// One running softmax denominator: max m and Σ exp(z − m) as a Kahan pair (s, comp). A confident
// row is 1 + many terms far below f32's half ulp of 1, which plain accumulation drops (≈1e-3
// relative error in a 1e-3 loss).
struct OnlineSum {
  float m = -INFINITY, s = 0, comp = 0;
};

// Adds one pack of logits to a running sum (and Σz to sz when smoothing).
template <bool kCap, class T, int N>
__device__ __forceinline__ void add_pack(OnlineSum& a, float& sz, const Pack<T, N>& v, bool smooth,
                                         float cap) {
  float z[N], pm = -INFINITY;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    z[i] = capped<kCap>(to_f32(v.e[i]), cap);
    pm = fmaxf(pm, z[i]);
  }
  if (smooth)
#pragma unroll
    for (int i = 0; i < N; ++i) sz += z[i];
  if (pm > a.m) {  // rare once the row's maximum has been seen
    const float f = a.m == -INFINITY ? 0.0f : ex2((a.m - pm) * kLog2e);
    a.s *= f;
    a.comp *= f;
    a.m = pm;
  }
  if (a.m == -INFINITY) return;  // a pack of -inf logits (masked vocabulary) adds 0
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float y = ex2((z[i] - a.m) * kLog2e) - a.comp;
    const float t = a.s + y;
    a.comp = (t - a.s) - y;
    a.s = t;
  }
}

// Streams the `packs` packs of a row (thread-strided) into kU independent running sums — the
// compensated update is a chain of four dependent adds per element, and one chain per thread
// would bound the stream by latency — and returns them merged.
template <bool kCap, int kThreads, int N, class T>
__device__ __forceinline__ void stream_stats(const T* x, int64_t packs, bool smooth, float cap,
                                             float& m, double& sd, float& sz) {
  OnlineSum acc[kU];
  sz = 0;
  for (int64_t base = threadIdx.x; base < packs; base += kU * kThreads) {
    Pack<T, N> v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (base + u * kThreads < packs) v[u] = ld<T, N>(x + (base + u * kThreads) * N);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t k = base + u * kThreads;
      if (k >= packs) break;
      add_pack<kCap>(acc[u], sz, v[u], smooth, cap);
    }
  }
  m = acc[0].m;
  sd = static_cast<double>(acc[0].s) - acc[0].comp;
#pragma unroll
  for (int u = 1; u < kU; ++u)
    merge_d(m, sd, acc[u].m, static_cast<double>(acc[u].s) - acc[u].comp);
}

// Block-wide merge of every thread's (m, sd, sz) in a fixed order; every thread gets the result.
// Combined in double: the row holding a confident prediction has s ≈ 1 + 1e-3, and ten f32
// merges near 1 would cost ~1e-7 each on a ~1e-3 loss.
template <int kThreads>
__device__ __forceinline__ void block_merge(float& m, double& sd, float& sz) {
  __shared__ float sm_m[32], sm_z[32];
  __shared__ double sm_s[32];
  auto warp_merge = [&] {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      merge_d(m, sd, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, sd, o));
      sz += __shfl_xor_sync(0xffffffffu, sz, o);
    }
  };
  warp_merge();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sm_m[warp] = m, sm_s[warp] = sd, sm_z[warp] = sz;
  __syncthreads();
  if (warp == 0) {
    m = lane < kThreads / 32 ? sm_m[lane] : -INFINITY;
    sd = lane < kThreads / 32 ? sm_s[lane] : 0.0;
    sz = lane < kThreads / 32 ? sm_z[lane] : 0.0f;
    warp_merge();
    if (lane == 0) sm_m[0] = m, sm_s[0] = sd, sm_z[0] = sz;
  }
  __syncthreads();
  m = sm_m[0], sd = sm_s[0], sz = sm_z[0];
}

// The per-row outputs of pass 1 from the merged (m, sd, sz); returns lse. zt: the target's
// (capped) logit.
__device__ __forceinline__ void write_row_stats(const CeRowsP& p, int64_t r, float m, double sd,
                                                float sz, float zt) {
  // lse − z_t as (m − z_t) + log s: exact 0 + log s when the target is the max, so a confident
  // prediction keeps its small loss instead of the rounding of lse (~1e-6).
  const float ls = static_cast<float>(log(sd)), l = m + ls;
  const float eps = p.label_smoothing, zl = p.z_loss_scale * l * l;
  if (p.row_loss)
    p.row_loss[r] = (1 - eps) * ((m - zt) + ls) + eps * ((m - sz / p.vocab) + ls) + zl;
  if (p.row_z) p.row_z[r] = zl;
  if (p.lse) p.lse[r] = l;
}

__device__ __forceinline__ void write_skipped_row(const CeRowsP& p, int64_t r, bool bad) {
  if (p.row_loss) p.row_loss[r] = bad ? NAN : 0.0f;
  if (p.row_z) p.row_z[r] = 0;
  if (p.lse) p.lse[r] = 0;
}

// What pass 2 needs of a row. The gradient uses exp((z − m) − log s), not exp(z − lse): the same
// value without the rounding of lse (which is ~1e-6 at lse ≈ 17). From a given lse: m = lse,
// log s = 0.
struct GradRow {
  float gm, gls2, zfac, unif, hit, cap;
  int64_t target;
};

__device__ __forceinline__ GradRow grad_row(const CeRowsP& p, int64_t r, int64_t target, float lse,
                                            float gm, float gls) {
  const float scale =
      (p.grad_scale ? *p.grad_scale : 1.0f) * (p.dloss ? p.dloss[p.dloss_per_row ? r : 0] : 1.0f);
  GradRow g;
  g.gm = gm, g.gls2 = gls * kLog2e, g.cap = p.softcap, g.target = target;
  g.zfac = (1 + 2 * p.z_loss_scale * lse) * scale;
  g.unif = p.label_smoothing / p.vocab * scale, g.hit = (1 - p.label_smoothing) * scale;
  return g;
}

// d(loss)/d(logits) of pack pk.
template <bool kCap, class T, int N>
__device__ __forceinline__ Pack<T, N> grad_pack(const GradRow& g, const Pack<T, N>& v, int64_t pk) {
  float d[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float z = capped<kCap>(to_f32(v.e[i]), g.cap);
    d[i] = ex2(fmaf(z - g.gm, kLog2e, -g.gls2)) * g.zfac - g.unif;
    if (pk * N + i == g.target) d[i] -= g.hit;
    if constexpr (kCap) {
      const float t = z / g.cap;
      d[i] *= 1 - t * t;
    }
  }
  Pack<T, N> out;
#pragma unroll
  for (int i = 0; i < N; ++i) out.e[i] = from_f32<T>(d[i]);
  return out;
}

template <class T, int N>
__device__ __forceinline__ Pack<T, N> zero_pack() {
  Pack<T, N> out;
#pragma unroll
  for (int i = 0; i < N; ++i) out.e[i] = from_f32<T>(0.0f);
  return out;
}

// One block per row. kCap: softcap > 0 (a template flag so the plain case carries no
// per-element branch).
template <class T, int N, int kThreads, bool kCap>
__global__ void __launch_bounds__(kThreads, 1024 / kThreads) ce_rows_kernel(CeRowsP p) {
  __shared__ float sh_lse, sh_m, sh_ls;
  const int64_t r = blockIdx.x;
  const T* x = static_cast<const T*>(p.logits) + r * p.logits_stride;
  const int64_t target = load_index(p.labels, p.labels_dt, r * p.labels_stride);
  const bool ignored = target == p.ignore_index;
  const bool bad = !ignored && (target < 0 || target >= p.vocab);
  const int64_t packs = p.vocab / N;
  float lse = 0, gm = 0, gls = 0;
  if (p.lse_in) {
    lse = ignored || bad ? 0.0f : p.lse_in[r];
    gm = lse;
  } else if (!ignored && !bad) {
    // The target's logit is loaded now so its latency hides behind the stream.
    const float zt = threadIdx.x == 0 ? capped<kCap>(to_f32(x[target]), p.softcap) : 0.0f;
    float m, sz;
    double sd;
    stream_stats<kCap, kThreads, N>(x, packs, p.label_smoothing > 0, p.softcap, m, sd, sz);
    block_merge<kThreads>(m, sd, sz);
    if (threadIdx.x == 0) {
      write_row_stats(p, r, m, sd, sz, zt);
      sh_lse = m + static_cast<float>(log(sd)), sh_m = m, sh_ls = static_cast<float>(log(sd));
    }
    __syncthreads();
    lse = sh_lse, gm = sh_m, gls = sh_ls;
  } else if (threadIdx.x == 0) {
    write_skipped_row(p, r, bad);
  }
  if (!p.grad) return;
  T* gout = static_cast<T*>(p.grad) + r * p.grad_stride;
  const GradRow g = grad_row(p, r, target, lse, gm, gls);
  // Backwards: the end of the row, read last by pass 1 (so still in L2), comes first. The stores
  // may alias the loads (in place), so the compiler cannot hoist the next iteration's loads by
  // itself: kU packs are loaded explicitly.
  for (int64_t base = threadIdx.x; base < packs; base += kU * kThreads) {
    Pack<T, N> v[kU];
    if (!ignored && !bad) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t k = base + u * kThreads;
        if (k < packs) v[u] = ld<T, N>(x + (packs - 1 - k) * N);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t k = base + u * kThreads;
      if (k >= packs) break;
      const int64_t pk = packs - 1 - k;
      st<T, N>(gout + pk * N,
               ignored || bad ? zero_pack<T, N>() : grad_pack<kCap, T, N>(g, v[u], pk));
    }
  }
}

__global__ void inv_divisor_kernel(const void* labels, IndexDt dt, int64_t stride, int64_t n,
                                   int64_t ignore, float override_divisor, float* inv) {
  __shared__ float red[32];
  float c = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    c += load_index(labels, dt, i * stride) != ignore ? 1.0f : 0.0f;
  c = group_sum<1024>(c, red);
  if (threadIdx.x == 0) *inv = 1.0f / (override_divisor > 0 ? override_divisor : fmaxf(c, 1.0f));
}

__global__ void sum_scaled_kernel(const float* in, int64_t n, const float* inv, float* out) {
  __shared__ float red[32];
  float t = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) t += in[i];
  t = group_sum<1024>(t, red);
  if (threadIdx.x == 0) *out = t * (inv ? *inv : 1.0f);
}

template <class T, int N>
__global__ void scale_kernel(T* m, int64_t rows, int64_t cols, int64_t stride, const float* f,
                             bool per_row) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float s = per_row ? f[r] : f[0];
    for (int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * N; c < cols;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x * N) {
      Pack<T, N> v = ld<T, N>(m + r * stride + c);
#pragma unroll
      for (int i = 0; i < N; ++i) v.e[i] = from_f32<T>(to_f32(v.e[i]) * s);
      st<T, N>(m + r * stride + c, v);
    }
  }
}

__global__ void f32_to_kernel(const float* in, void* out, Dt dt, int64_t n, bool accumulate) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store_dt(out, dt, i, in[i] + (accumulate ? load_dt(out, dt, i) : 0.0f));
}

}  // namespace

namespace {

template <class T, int N>
int launch_streaming(const CeRowsP& p, cudaStream_t s) {
  const unsigned grid = static_cast<unsigned>(p.rows);
  if (p.softcap > 0)
    ce_rows_kernel<T, N, 256, true><<<grid, 256, 0, s>>>(p);
  else
    ce_rows_kernel<T, N, 256, false><<<grid, 256, 0, s>>>(p);
  return last_error();
}

}  // namespace

int launch_ce_rows(const CeRowsP& p, void* stream) {
  if (p.rows == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  LIGER_DISPATCH_FLOAT(p.dt, T, {
    constexpr int N = 16 / sizeof(T);
    const bool vec = p.vocab % N == 0 && aligned16(p.logits) && p.logits_stride % N == 0 &&
                     (!p.grad || (aligned16(p.grad) && p.grad_stride % N == 0));
    return vec ? launch_streaming<T, N>(p, s) : launch_streaming<T, 1>(p, s);
  });
}

int launch_inv_divisor(const void* labels, IndexDt dt, int64_t stride, int64_t n, int64_t ignore,
                       float override_divisor, float* inv, void* stream) {
  inv_divisor_kernel<<<1, 1024, 0, static_cast<cudaStream_t>(stream)>>>(
      labels, dt, stride, n, ignore, override_divisor, inv);
  return last_error();
}

int launch_sum_scaled(const float* in, int64_t n, const float* inv, float* out, void* stream) {
  sum_scaled_kernel<<<1, 1024, 0, static_cast<cudaStream_t>(stream)>>>(in, n, inv, out);
  return last_error();
}

int launch_scale(const Rows& m, const float* factor, bool per_row, void* stream) {
  if (m.rows == 0 || m.cols == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  LIGER_DISPATCH_FLOAT(m.dt, T, {
    constexpr int N = 16 / sizeof(T);
    const bool vec = rows_vectorizable(m, N);
    const int64_t packs = m.cols / (vec ? N : 1);
    const unsigned gx =
        static_cast<unsigned>((packs + 255) / 256 < 1024 ? (packs + 255) / 256 : 1024);
    const dim3 grid(gx, static_cast<unsigned>(m.rows < 65535 ? m.rows : 65535));
    if (vec)
      scale_kernel<T, N><<<grid, 256, 0, s>>>(static_cast<T*>(m.data), m.rows, m.cols, m.row_stride,
                                              factor, per_row);
    else
      scale_kernel<T, 1><<<grid, 256, 0, s>>>(static_cast<T*>(m.data), m.rows, m.cols, m.row_stride,
                                              factor, per_row);
    return last_error();
  });
}

int launch_f32_to(const float* in, void* out, Dt dt, int64_t n, bool accumulate, void* stream) {
  if (n == 0) return 0;
  const int64_t blocks = (n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096;
  f32_to_kernel<<<static_cast<unsigned>(blocks), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      in, out, dt, n, accumulate);
  return last_error();
}

// ---- the public cross-entropy launchers ---------------------------------------------------------
namespace {
struct CeWorkspace {
  float* inv;
  float* row_loss;
  float* row_z;
};
CeWorkspace carve(void* ws, int64_t rows) {
  char* base = static_cast<char*>(ws);
  return {reinterpret_cast<float*>(base), reinterpret_cast<float*>(base + 256),
          reinterpret_cast<float*>(base + 256 + 4 * rows)};
}
}  // namespace

size_t cross_entropy_workspace_bytes(int64_t rows) {
  return 256 + 8 * static_cast<size_t>(rows > 0 ? rows : 0);
}

int cross_entropy_fwd(const CrossEntropyArgs& a, void* stream) {
  const CeWorkspace ws = carve(a.workspace, a.logits.rows);
  const bool none = a.reduction == Reduction::None;
  if (a.reduction == Reduction::Mean) {
    if (int e = launch_inv_divisor(a.labels, a.labels_dt, a.labels_stride, a.logits.rows,
                                   a.ignore_index, a.mean_divisor, ws.inv, stream))
      return e;
  }
  CeRowsP p{};
  p.logits = a.logits.data, p.logits_stride = a.logits.row_stride;
  p.grad = a.dlogits.data, p.grad_stride = a.dlogits.row_stride, p.dt = a.logits.dt;
  p.rows = a.logits.rows, p.vocab = a.logits.cols;
  p.labels = a.labels, p.labels_dt = a.labels_dt, p.labels_stride = a.labels_stride;
  const bool loss = a.loss != nullptr && a.lse_in == nullptr;
  p.row_loss = !loss ? nullptr : none ? a.loss : ws.row_loss;
  p.row_z = !loss ? nullptr : none ? a.z_loss : (a.z_loss ? ws.row_z : nullptr);
  p.lse = a.lse_in ? nullptr : a.lse;
  p.lse_in = a.lse_in;
  p.dloss = a.dloss, p.dloss_per_row = none;
  p.grad_scale = a.reduction == Reduction::Mean ? ws.inv : nullptr;
  p.ignore_index = a.ignore_index, p.label_smoothing = a.label_smoothing;
  p.z_loss_scale = a.z_loss_scale, p.softcap = a.softcap;
  if (int e = launch_ce_rows(p, stream)) return e;
  if (none || !loss) return 0;
  const float* inv = a.reduction == Reduction::Mean ? ws.inv : nullptr;
  if (int e = launch_sum_scaled(ws.row_loss, a.logits.rows, inv, a.loss, stream)) return e;
  if (a.z_loss) return launch_sum_scaled(ws.row_z, a.logits.rows, inv, a.z_loss, stream);
  return 0;
}

int cross_entropy_scale(const CrossEntropyScale& a, void* stream) {
  return launch_scale(a.dlogits, a.dloss, a.reduction == Reduction::None, stream);
}

int scale_rows(const Rows& m, const float* factor, void* stream) {
  return launch_scale(m, factor, false, stream);
}

}  // namespace liger::cuda
