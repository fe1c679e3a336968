// cuda/cross_entropy.cu — cross-entropy on given logits, loss and gradient in one launch.
//
// Pass 1 streams a row once with an online softmax (running max and Kahan-compensated sum of exp,
// rescaled once per 16-byte pack when the max grows), plus Σz for label smoothing; the partial
// (max, sum) pairs are merged in double into lse. Pass 2 writes the gradient, in place when
// grad == logits. Ignored rows skip pass 1 and write zeros. Mean's divisor is counted on the device
// by a tiny kernel before, and the scalar loss summed by one block after, in a fixed order: no
// host synchronisation, deterministic results.
//
// Two kernels (measured on the H200: docs/performance.md):
//  * ce_rows_kernel — one 256-thread block per row, four per SM. For one pass (softmax only, or
//    the gradient from a given lse) it streams at 93–95% of copy bandwidth. Both passes in it
//    re-read the row from DRAM (528 rows in flight never fit L2).
//  * ce_rows_cluster_kernel (sm_90) — both passes with the row read from DRAM once: a cluster of
//    `split` blocks owns a row, each block copies its slice into shared memory (all of it in
//    flight at once), and the blocks exchange their (max, sum) through distributed shared memory.
#include <cooperative_groups.h>

#include <cfloat>

#include "cuda/ce_launch.h"
#include "cuda/common.cuh"
#include "liger/cuda_ops.h"

namespace liger::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kClusterThreads = 256, kClusterBlocksPerSm = 5;

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

// Streams packs [begin, end) of a row (thread-strided) into kU independent running sums — the
// compensated update is a chain of four dependent adds per element, and one chain per thread
// would bound the stream by latency — and returns them merged.
template <bool kCap, int kThreads, int N, class T>
__device__ __forceinline__ void stream_stats(const T* x, int64_t begin, int64_t end, bool smooth,
                                             float cap, float& m, double& sd, float& sz) {
  OnlineSum acc[kU];
  sz = 0;
  for (int64_t base = begin + threadIdx.x; base < end; base += kU * kThreads) {
    Pack<T, N> v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (base + u * kThreads < end) v[u] = ld<T, N>(x + (base + u * kThreads) * N);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t k = base + u * kThreads;
      if (k >= end) break;
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
    stream_stats<kCap, kThreads, N>(x, 0, packs, p.label_smoothing > 0, p.softcap, m, sd, sz);
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

// Both passes, the row crossing DRAM once: blockIdx.x / split is the row, the cluster rank its
// slice of packs. Each block keeps its slice in shared memory; after the block merge, the blocks
// of the cluster read each other's (m, s, Σz) through distributed shared memory and merge them in
// rank order (the same result in every block). Two cluster barriers: the partials are published,
// and (at the end, after the gradient is written) no block exits while another may still read
// its shared memory.
template <class T, int N, bool kCap>
__global__ void __launch_bounds__(kClusterThreads, kClusterBlocksPerSm)
    ce_rows_cluster_kernel(CeRowsP p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ uint4 slice_raw[];
  Pack<T, N>* const slice = reinterpret_cast<Pack<T, N>*>(slice_raw);
  __shared__ float part_m, part_z;
  __shared__ double part_s;
  cg::cluster_group cluster = cg::this_cluster();
  const int split = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t r = blockIdx.x / split;
  const T* x = static_cast<const T*>(p.logits) + r * p.logits_stride;
  const int64_t target = load_index(p.labels, p.labels_dt, r * p.labels_stride);
  const bool ignored = target == p.ignore_index;
  const bool bad = !ignored && (target < 0 || target >= p.vocab);
  const int64_t packs = p.vocab / N, per = (packs + split - 1) / split;
  const int64_t begin = rank * per < packs ? rank * per : packs;
  const int64_t end = begin + per < packs ? begin + per : packs;
  T* gout = static_cast<T*>(p.grad) + r * p.grad_stride;
  if (ignored || bad) {  // uniform over the cluster: no barrier is skipped by half of it
    if (rank == 0 && threadIdx.x == 0) write_skipped_row(p, r, bad);
    for (int64_t k = begin + threadIdx.x; k < end; k += kClusterThreads)
      st<T, N>(gout + k * N, zero_pack<T, N>());
    return;
  }
  const float zt =
      rank == 0 && threadIdx.x == 0 ? capped<kCap>(to_f32(x[target]), p.softcap) : 0.0f;
  // The whole slice is requested at once with asynchronous copies straight into shared memory
  // (no registers held), so each block has all of its ~38 KiB in flight: a thread's handful of
  // packs streamed through registers would leave the SM latency-bound.
  const int64_t n = end - begin;
  for (int64_t k = threadIdx.x; k < n; k += kClusterThreads) {
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(slice + k));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(x + (begin + k) * N)
                 : "memory");
  }
  asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
  __syncthreads();
  OnlineSum acc[kU];
  float sz = 0;
  const bool smooth = p.label_smoothing > 0;
  for (int64_t base = threadIdx.x; base < n; base += kU * kClusterThreads) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t k = base + u * kClusterThreads;
      if (k < n) add_pack<kCap>(acc[u], sz, slice[k], smooth, p.softcap);
    }
  }
  float m = acc[0].m;
  double sd = static_cast<double>(acc[0].s) - acc[0].comp;
#pragma unroll
  for (int u = 1; u < kU; ++u)
    merge_d(m, sd, acc[u].m, static_cast<double>(acc[u].s) - acc[u].comp);
  block_merge<kClusterThreads>(m, sd, sz);
  if (threadIdx.x == 0) part_m = m, part_s = sd, part_z = sz;
  cluster.sync();
  // Warp 0 reads the split partials in parallel (lane b from rank b: one remote latency, not
  // split of them in a row) and merges them in rank order with shuffles; the block gets the
  // result through shared memory.
  __shared__ float row_m, row_z;
  __shared__ double row_s;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    m = -INFINITY, sd = 0, sz = 0;
    if (lane < split) {
      m = *cluster.map_shared_rank(&part_m, lane);
      sd = *cluster.map_shared_rank(&part_s, lane);
      sz = *cluster.map_shared_rank(&part_z, lane);
    }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {  // lane 0 ends with ranks 0..31 merged in order
      const float m2 = __shfl_down_sync(0xffffffffu, m, o);
      const double s2 = __shfl_down_sync(0xffffffffu, sd, o);
      const float z2 = __shfl_down_sync(0xffffffffu, sz, o);
      if (lane % (2 * o) == 0) merge_d(m, sd, m2, s2), sz += z2;
    }
    if (lane == 0) row_m = m, row_s = sd, row_z = sz;
  }
  __syncthreads();
  m = row_m, sd = row_s, sz = row_z;
  const float ls = static_cast<float>(log(sd));
  if (rank == 0 && threadIdx.x == 0) write_row_stats(p, r, m, sd, sz, zt);
  const GradRow g = grad_row(p, r, target, m + ls, m, ls);
  for (int64_t k = begin + threadIdx.x; k < end; k += kClusterThreads)
    st<T, N>(gout + k * N, grad_pack<kCap, T, N>(g, slice[k - begin], k));
  cluster.sync();  // late, so its latency overlaps the gradient pass: no block has exited early
#endif
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

// The kernel for both passes in one call, from the H200 benchmark (ce_rows_inplace[streaming] and
// [cluster] in bench/kernels/liger_bench; docs/performance.md).
constexpr CeShape kDefaultCeShape = CeShape::Streaming;

template <class T, int N>
int launch_streaming(const CeRowsP& p, cudaStream_t s) {
  const unsigned grid = static_cast<unsigned>(p.rows);
  if (p.softcap > 0)
    ce_rows_kernel<T, N, 256, true><<<grid, 256, 0, s>>>(p);
  else
    ce_rows_kernel<T, N, 256, false><<<grid, 256, 0, s>>>(p);
  return last_error();
}

// Cluster size and shared-memory slice for a row of `packs` 16-byte packs, or 0 when the row is
// too wide (or the device has no clusters): the smallest portable cluster (2, 4, 8) whose slices
// fit kClusterBlocksPerSm blocks per SM.
struct ClusterPlan {
  int split = 0;
  size_t slice_bytes = 0;
};
ClusterPlan plan_cluster(int64_t packs, size_t pack_bytes) {
  static int major[64] = {}, optin[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) dev = 0;
  if (major[dev] == 0) {
    cudaDeviceGetAttribute(&major[dev], cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&optin[dev], cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  }
  ClusterPlan plan;
  if (major[dev] < 9) return plan;
  // kClusterBlocksPerSm blocks per SM, each with its slice, static shared memory and reserve.
  const size_t budget = static_cast<size_t>(optin[dev]) / kClusterBlocksPerSm - 2048;
  for (int split : {2, 4, 8}) {
    const size_t bytes = static_cast<size_t>((packs + split - 1) / split) * pack_bytes;
    if (bytes <= budget) return {split, bytes};
  }
  return plan;
}

template <class T, int N>
int launch_cluster(const CeRowsP& p, const ClusterPlan& plan, cudaStream_t s) {
  auto* kernel =
      p.softcap > 0 ? ce_rows_cluster_kernel<T, N, true> : ce_rows_cluster_kernel<T, N, false>;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(plan.slice_bytes)))
    return static_cast<int>(e);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(p.rows * plan.split));
  cfg.blockDim = dim3(kClusterThreads);
  cfg.dynamicSmemBytes = plan.slice_bytes;
  cfg.stream = s;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(plan.split);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return static_cast<int>(cudaLaunchKernelEx(&cfg, kernel, p));
}

}  // namespace

int launch_ce_rows_shaped(const CeRowsP& p, CeShape shape, void* stream) {
  if (p.rows == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  LIGER_DISPATCH_FLOAT(p.dt, T, {
    constexpr int N = 16 / sizeof(T);
    const bool vec = p.vocab % N == 0 && aligned16(p.logits) && p.logits_stride % N == 0 &&
                     (!p.grad || (aligned16(p.grad) && p.grad_stride % N == 0));
    if (shape == CeShape::Cluster && vec && p.grad && !p.lse_in) {
      const ClusterPlan plan = plan_cluster(p.vocab / N, 16);
      if (plan.split > 0) return launch_cluster<T, N>(p, plan, s);
    }
    return vec ? launch_streaming<T, N>(p, s) : launch_streaming<T, 1>(p, s);
  });
}

int launch_ce_rows(const CeRowsP& p, void* stream) {
  return launch_ce_rows_shaped(p, kDefaultCeShape, stream);
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
