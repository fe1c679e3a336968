// cuda/cross_entropy.cu — cross-entropy on given logits, loss and gradient in one launch.
//
// One 512-thread block per row (two resident per SM). Pass 1 streams the row once with an online
// softmax (per-thread running max and sum of exp, rescaled once per 16-byte pack), plus Σz for
// label smoothing; the block combines the partial (max, sum) pairs into lse. Pass 2 re-reads the
// row — backwards, so the most recently read bytes (still in L2) come first — and writes the
// gradient, in place when grad == logits. Ignored rows skip pass 1 and write zeros. Mean's divisor
// is counted on the device by a tiny kernel before, and the scalar loss summed by one block after,
// in a fixed order: no host synchronisation, deterministic results.
#include <cfloat>

#include "cuda/ce_launch.h"
#include "cuda/common.cuh"
#include "liger/cuda_ops.h"

namespace liger::cuda {
namespace {

// 512 threads, 2 blocks per SM: one block's reduction or tail overlaps the other's streaming.
constexpr int kCeThreads = 512;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float capped(float x, float cap) {
  return cap > 0 ? cap * tanhf(x / cap) : x;
}

// Merges (m2, s2) into (m, s): s scaled to the larger max. An empty side has m = -inf.
__device__ __forceinline__ void merge_d(float& m, double& s, float m2, double s2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) return;
  s = (m == -INFINITY ? 0.0 : s * exp(static_cast<double>(m) - mn)) +
      (m2 == -INFINITY ? 0.0 : s2 * exp(static_cast<double>(m2) - mn));
  m = mn;
}

template <class T, int N>
__global__ void __launch_bounds__(kCeThreads, 2) ce_rows_kernel(CeRowsP p) {
  __shared__ float sm_m[32], sm_z[32];
  __shared__ double sm_s[32];
  __shared__ float sh_lse, sh_m, sh_ls;
  const int64_t r = blockIdx.x;
  const T* x = static_cast<const T*>(p.logits) + r * p.logits_stride;
  const int64_t target = load_index(p.labels, p.labels_dt, r * p.labels_stride);
  const bool ignored = target == p.ignore_index;
  const bool bad = !ignored && (target < 0 || target >= p.vocab);
  const int64_t packs = p.vocab / N;
  const bool smooth = p.label_smoothing > 0;
  // The gradient uses exp((z − m) − log s), not exp(z − lse): the same value without the
  // rounding of lse (which is ~1e-6 at lse ≈ 17). From a given lse: m = lse, log s = 0.
  float lse = 0, gm = 0, gls = 0;
  if (p.lse_in) {
    lse = ignored || bad ? 0.0f : p.lse_in[r];
    gm = lse;
  } else if (!ignored && !bad) {
    // s: Σ exp(z − m), Kahan-compensated (comp): a confident row is 1 + many terms far below
    // f32's half ulp of 1, which plain accumulation drops (≈1e-3 relative error in a 1e-3 loss).
    float m = -INFINITY, s = 0, comp = 0, sz = 0;
    constexpr int kU = 4;  // packs in flight per thread
    for (int64_t base = threadIdx.x; base < packs; base += kU * kCeThreads) {
      Pack<T, N> v[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u)
        if (base + u * kCeThreads < packs) v[u] = ld<T, N>(x + (base + u * kCeThreads) * N);
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (base + u * kCeThreads >= packs) break;
        float z[N], pm = -INFINITY;
#pragma unroll
        for (int i = 0; i < N; ++i) {
          z[i] = capped(to_f32(v[u].e[i]), p.softcap);
          pm = fmaxf(pm, z[i]);
          if (smooth) sz += z[i];
        }
        const float mn = fmaxf(m, pm);
        const float f = m == -INFINITY ? 0.0f : exp2f((m - mn) * kLog2e);
        s *= f;
        comp *= f;
#pragma unroll
        for (int i = 0; i < N; ++i) {
          const float y = exp2f((z[i] - mn) * kLog2e) - comp;
          const float t = s + y;
          comp = (t - s) - y;
          s = t;
        }
        m = mn;
      }
    }
    // Combine the threads' (m, s) in double: the row holding a confident prediction has
    // s ≈ 1 + 1e-3, and ten f32 merges near 1 would cost ~1e-7 each on a ~1e-3 loss.
    double sd = static_cast<double>(s) - comp;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      merge_d(m, sd, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, sd, o));
      sz += __shfl_xor_sync(0xffffffffu, sz, o);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) sm_m[warp] = m, sm_s[warp] = sd, sm_z[warp] = sz;
    __syncthreads();
    if (warp == 0) {
      m = lane < kCeThreads / 32 ? sm_m[lane] : -INFINITY;
      sd = lane < kCeThreads / 32 ? sm_s[lane] : 0.0;
      sz = lane < kCeThreads / 32 ? sm_z[lane] : 0.0f;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        merge_d(m, sd, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, sd, o));
        sz += __shfl_xor_sync(0xffffffffu, sz, o);
      }
      if (lane == 0) {
        // lse − z_t as (m − z_t) + log s: exact 0 + log s when the target is the max, so a
        // confident prediction keeps its small loss instead of the rounding of lse (~1e-6).
        const float ls = static_cast<float>(log(sd)), l = m + ls;
        const float zt = capped(to_f32(x[target]), p.softcap);
        const float eps = p.label_smoothing, zl = p.z_loss_scale * l * l;
        if (p.row_loss)
          p.row_loss[r] = (1 - eps) * ((m - zt) + ls) + eps * ((m - sz / p.vocab) + ls) + zl;
        if (p.row_z) p.row_z[r] = zl;
        if (p.lse) p.lse[r] = l;
        sh_lse = l, sh_m = m, sh_ls = ls;
      }
    }
    __syncthreads();
    lse = sh_lse, gm = sh_m, gls = sh_ls;
  } else if (threadIdx.x == 0) {
    if (p.row_loss) p.row_loss[r] = bad ? NAN : 0.0f;
    if (p.row_z) p.row_z[r] = 0;
    if (p.lse) p.lse[r] = 0;
  }
  if (!p.grad) return;
  T* g = static_cast<T*>(p.grad) + r * p.grad_stride;
  const float scale =
      (p.grad_scale ? *p.grad_scale : 1.0f) * (p.dloss ? p.dloss[p.dloss_per_row ? r : 0] : 1.0f);
  const float zfac = 1 + 2 * p.z_loss_scale * lse, unif = p.label_smoothing / p.vocab;
  const float hit = 1 - p.label_smoothing;
  // kU packs in flight per thread: the stores may alias the loads (in place), so the compiler
  // cannot hoist the next iteration's loads by itself.
  constexpr int kU = 4;
  for (int64_t base = threadIdx.x; base < packs; base += kU * kCeThreads) {
    Pack<T, N> v[kU];
    if (!ignored && !bad) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t k = base + u * kCeThreads;
        if (k < packs)
          v[u] = ld<T, N>(x + (packs - 1 - k) * N);  // backwards: L2-resident end first
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t k = base + u * kCeThreads;
      if (k >= packs) break;
      const int64_t pk = packs - 1 - k;
      Pack<T, N> out;
      if (ignored || bad) {
#pragma unroll
        for (int i = 0; i < N; ++i) out.e[i] = from_f32<T>(0.0f);
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i) {
          const float z = capped(to_f32(v[u].e[i]), p.softcap);
          float d = exp2f(((z - gm) - gls) * kLog2e) * zfac - unif;
          if (pk * N + i == target) d -= hit;
          if (p.softcap > 0) {
            const float t = z / p.softcap;
            d *= 1 - t * t;
          }
          out.e[i] = from_f32<T>(d * scale);
        }
      }
      st<T, N>(g + pk * N, out);
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

int launch_ce_rows(const CeRowsP& p, void* stream) {
  if (p.rows == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  LIGER_DISPATCH_FLOAT(p.dt, T, {
    constexpr int N = 16 / sizeof(T);
    const bool vec = p.vocab % N == 0 && aligned16(p.logits) && p.logits_stride % N == 0 &&
                     (!p.grad || (aligned16(p.grad) && p.grad_stride % N == 0));
    if (vec)
      ce_rows_kernel<T, N><<<static_cast<unsigned>(p.rows), kCeThreads, 0, s>>>(p);
    else
      ce_rows_kernel<T, 1><<<static_cast<unsigned>(p.rows), kCeThreads, 0, s>>>(p);
    return last_error();
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
