// Decode GEMV: y[m, n] = x[m, :]·W[n, :] (+ b[n]) for M ≤ 64 rows of x (decode_kernels.h).
//
// 16-bit weights: one block of 8 warps per 16 rows of W, the K dimension split over the warps, and
// the products on tensor cores with W as the 16-row operand and x as the 8-column one
// (mma.sync.m16n8k16; one n-tile per 8 rows of x: 1, 2, 4 or 8). Every lane loads 16 bytes of a W
// row and the matching 16 bytes of x: the k order inside a 32-wide chunk is permuted identically
// for both operands, which a dot product does not notice, so no shared-memory staging is needed.
// The block prefetches its rows of W into L2 and loads its first chunks into registers before
// waiting on the previous kernel (PDL): weights depend on no kernel, so the weight stream runs
// while the predecessor finishes and only x is read after the wait. The eight warps' partial sums
// are added in a fixed order (deterministic). Optional: an RMSNorm prologue (x = rms_norm(residual
// + delta), normalised into shared memory by every block, the sum written back by block 0) and a
// SwiGLU epilogue (gate and up rows in the same block, out = round(silu(gate))·up as ops::act_mul).
// f32 weights: one warp per row on CUDA cores (correct, not tuned; tests and f32 models).
#include <algorithm>
#include <map>
#include <mutex>

#include "hk/error.h"
#include "ops/decode/decode_common.cuh"
#include "ops/decode/gemv_args.cuh"

namespace hk::decode {
namespace detail {

void allow_dynamic_smem(const void* kernel, size_t bytes) {
  // the limit set so far per kernel: raised again when a later launch needs more
  static std::mutex mutex;
  static std::map<const void*, size_t> raised;
  if (bytes <= 48 * 1024) return;
  std::lock_guard<std::mutex> lock(mutex);
  size_t& limit = raised[kernel];
  if (bytes <= limit) return;
  limit = std::max<size_t>(bytes, 100 * 1024);
  HK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(limit)));
}

int device_sm_count() {
  static int cached[64] = {};
  int d = 0;
  HK_CUDA_CHECK(cudaGetDevice(&d));
  if (d < 0 || d >= 64) return 132;
  if (cached[d] == 0) {
    int n = 0;
    HK_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, d));
    cached[d] = std::max(n, 1);
  }
  return cached[d];
}

bool device_is_sm90_or_later() {
  static const bool yes = [] {
    int d = 0, major = 0;
    if (cudaGetDevice(&d) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess)
      return false;
    return major >= 9;
  }();
  return yes;
}

}  // namespace detail

int64_t gemv_preferred_max_rows() {
  static const int64_t rows = [] {
    const char* v = std::getenv("HK_DECODE_GEMV_MAX_ROWS");
    const int64_t r = v ? std::atoll(v) : kGemvPreferredMaxRows;
    return std::clamp<int64_t>(r, 0, kGemvMaxRows);
  }();
  return rows;
}

bool pdl_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("HK_DECODE_PDL");
    if (v && (std::string(v) == "0" || std::string(v) == "off")) return false;
    return detail::device_is_sm90_or_later();
  }();
  return on;
}

namespace {
using namespace detail;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMmaRows = 16;  // W rows per block (one m-tile)
constexpr int kF32Rows = kWarps;
constexpr int kXPad = 32;  // shared x rows padded by 64 bytes: conflict-free 16-byte reads

// Prefetches `rows` rows of k elements starting at `w` into L2 (all threads of the block).
template <class T>
__device__ __forceinline__ void prefetch_rows(const T* w, int rows, int k) {
  const int64_t bytes = int64_t(rows) * k * int64_t(sizeof(T));
  const char* base = reinterpret_cast<const char*>(w);
  for (int64_t off = int64_t(threadIdx.x) * 128; off < bytes; off += int64_t(kThreads) * 128)
    prefetch_l2(base + off);
}

// x = rms_norm(residual + delta) into shared memory rows of k + kXPad (16-bit types).
template <class T>
__device__ void norm_prologue(const GemvArgs& a, T* xs) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int stride = a.k + kXPad;
  for (int row = warp; row < a.m; row += kWarps) {
    const T* res = static_cast<const T*>(a.prologue.residual) + row * a.prologue.residual_stride;
    const T* del = a.prologue.delta
                       ? static_cast<const T*>(a.prologue.delta) + row * a.prologue.delta_stride
                       : nullptr;
    T* out = a.prologue.residual_out && a.prologue.delta && blockIdx.x == 0
                 ? static_cast<T*>(a.prologue.residual_out) + row * a.prologue.residual_out_stride
                 : nullptr;
    T* xr = xs + row * stride;
    float ss = 0.0f;
    for (int i = lane * 8; i < a.k; i += 256) {
      uint4 v = load_ro16(res + i);
      if (del) {
        const uint4 d = load_ro16(del + i);
        v.x = pack2<T>(lane_value<T>(v, 0) + lane_value<T>(d, 0),
                       lane_value<T>(v, 1) + lane_value<T>(d, 1));
        v.y = pack2<T>(lane_value<T>(v, 2) + lane_value<T>(d, 2),
                       lane_value<T>(v, 3) + lane_value<T>(d, 3));
        v.z = pack2<T>(lane_value<T>(v, 4) + lane_value<T>(d, 4),
                       lane_value<T>(v, 5) + lane_value<T>(d, 5));
        v.w = pack2<T>(lane_value<T>(v, 6) + lane_value<T>(d, 6),
                       lane_value<T>(v, 7) + lane_value<T>(d, 7));
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float f = lane_value<T>(v, e);
        ss += f * f;
      }
      *reinterpret_cast<uint4*>(xr + i) = v;
      if (out) *reinterpret_cast<uint4*>(out + i) = v;
    }
    ss = warp_sum(ss);
    const float r = rsqrtf(ss / static_cast<float>(a.k) + a.prologue.eps);
    const T* w = static_cast<const T*>(a.prologue.norm_weight);
    for (int i = lane * 8; i < a.k; i += 256) {
      const uint4 v = *reinterpret_cast<const uint4*>(xr + i);
      const uint4 wv = load_ro16(w + i);
      float y[8];
#pragma unroll
      for (int e = 0; e < 8; ++e)
        y[e] = round_as<T>(lane_value<T>(v, e) * r) * lane_value<T>(wv, e);
      uint4 o;
      o.x = pack2<T>(y[0], y[1]);
      o.y = pack2<T>(y[2], y[3]);
      o.z = pack2<T>(y[4], y[5]);
      o.w = pack2<T>(y[6], y[7]);
      *reinterpret_cast<uint4*>(xr + i) = o;
    }
  }
}

// NT n-tiles of 8 x rows; kPair: segments 0/1 are gate/up with a SwiGLU epilogue.
template <class T, int NT, bool kPrologue, bool kPair>
__global__ void __launch_bounds__(kThreads) gemv_mma_kernel(const GemvArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kSets = kPair ? 2 : 1;
  // 32-wide k chunks loaded ahead per warp (fewer when many x rows take registers)
  constexpr int U = (kPair || NT >= 4) ? 2 : 4;
  const int tile = blockIdx.x;
  const int s = kPair ? 0 : segment_of(a, tile);
  const int r0 = (tile - a.tile_begin[s]) * kMmaRows;
  const int n = a.n[s], k = a.k;
  const T* w0 = static_cast<const T*>(a.w[s]) + int64_t(r0) * k;
  const T* w1 = kPair ? static_cast<const T*>(a.w[1]) + int64_t(r0) * k : nullptr;
  const int rows_here = min(kMmaRows, n - r0);
  prefetch_rows(w0, rows_here, k);
  if constexpr (kPair) prefetch_rows(w1, rows_here, k);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const bool lo_ok = g < rows_here, hi_ok = g + 8 < rows_here;
  const T* wlo = w0 + int64_t(g) * k + t * 8;
  const T* whi = w0 + int64_t(g + 8) * k + t * 8;
  const T* ulo = kPair ? w1 + int64_t(g) * k + t * 8 : nullptr;
  const T* uhi = kPair ? w1 + int64_t(g + 8) * k + t * 8 : nullptr;
  const int chunks = k / 32;
  uint4 A[kSets][U][2];
  auto load_weights = [&](int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * kWarps;
      const bool ok = c < chunks;
      const int off = c * 32;
      A[0][u][0] = ok && lo_ok ? load_stream16(wlo + off) : zero16();
      A[0][u][1] = ok && hi_ok ? load_stream16(whi + off) : zero16();
      if constexpr (kPair) {
        A[kSets - 1][u][0] = ok && lo_ok ? load_stream16(ulo + off) : zero16();
        A[kSets - 1][u][1] = ok && hi_ok ? load_stream16(uhi + off) : zero16();
      }
    }
  };
  // The weights depend on no kernel: the first chunks are in flight before the wait.
  load_weights(warp);
  grid_wait();
  grid_launch_dependents();

  T* xs = reinterpret_cast<T*>(smem);
  const size_t xs_bytes = kPrologue ? (size_t(a.m) * (k + kXPad) * sizeof(T) + 15) / 16 * 16 : 0;
  float* red = reinterpret_cast<float*>(smem + xs_bytes);
  if constexpr (kPrologue) {
    norm_prologue<T>(a, xs);
    __syncthreads();
  }

  const T* xrow[NT];
  bool x_ok[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int row = nt * 8 + g;
    x_ok[nt] = row < a.m;
    const int safe = x_ok[nt] ? row : 0;
    xrow[nt] = kPrologue ? xs + safe * (k + kXPad) + t * 8
                         : static_cast<const T*>(a.x) + safe * a.x_stride + t * 8;
  }
  float acc[kSets][NT][4];
#pragma unroll
  for (int q = 0; q < kSets; ++q)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[q][nt][r] = 0.0f;

  for (int c0 = warp; c0 < chunks; c0 += kWarps * U) {
    if (c0 != warp) load_weights(c0);
    uint4 B[U][NT];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * kWarps;
      const bool ok = c < chunks;
      const int off = c * 32;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if (ok && x_ok[nt])
          B[u][nt] = kPrologue ? *reinterpret_cast<const uint4*>(xrow[nt] + off)
                               : load_ro16(xrow[nt] + off);
        else
          B[u][nt] = zero16();
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int q = 0; q < kSets; ++q)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          mma16816<T>(acc[q][nt], A[q][u][0].x, A[q][u][1].x, A[q][u][0].y, A[q][u][1].y,
                      B[u][nt].x, B[u][nt].y);
          mma16816<T>(acc[q][nt], A[q][u][0].z, A[q][u][1].z, A[q][u][0].w, A[q][u][1].w,
                      B[u][nt].z, B[u][nt].w);
        }
  }

  // red[warp][set][nt][reg][lane]
  constexpr int kPerWarp = kSets * NT * 4 * 32;
#pragma unroll
  for (int q = 0; q < kSets; ++q)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        red[warp * kPerWarp + ((q * NT + nt) * 4 + r) * 32 + lane] = acc[q][nt][r];
  __syncthreads();
  for (int i = threadIdx.x; i < NT * 4 * 32; i += kThreads) {
    float sum[kSets];
#pragma unroll
    for (int q = 0; q < kSets; ++q) {
      sum[q] = 0.0f;
      for (int w = 0; w < kWarps; ++w) sum[q] += red[w * kPerWarp + q * NT * 4 * 32 + i];
    }
    const int l = i & 31, r = (i >> 5) & 3, nt = i >> 7;
    const int row = (l >> 2) + (r >= 2 ? 8 : 0);
    const int col = nt * 8 + (l & 3) * 2 + (r & 1);
    const int j = r0 + row;
    if (col >= a.m || row >= rows_here) continue;
    store_output<T, kPair>(a, s, col, j, sum);
  }
}

// f32: one warp per W row (pair: the gate row and the up row), lanes over k in float4.
template <bool kPair>
__global__ void __launch_bounds__(kThreads) gemv_f32_kernel(const GemvArgs a) {
  const int tile = blockIdx.x;
  const int s = kPair ? 0 : segment_of(a, tile);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = (tile - a.tile_begin[s]) * kF32Rows;
  const int n = a.n[s], k = a.k;
  const int rows_here = min(kF32Rows, n - r0);
  prefetch_rows(static_cast<const float*>(a.w[s]) + int64_t(r0) * k, rows_here, k);
  if constexpr (kPair)
    prefetch_rows(static_cast<const float*>(a.w[1]) + int64_t(r0) * k, rows_here, k);
  grid_wait();
  grid_launch_dependents();
  const int j = r0 + warp;
  if (warp >= rows_here) return;
  const float* wr = static_cast<const float*>(a.w[s]) + int64_t(j) * k;
  const float* ur = kPair ? static_cast<const float*>(a.w[1]) + int64_t(j) * k : nullptr;
  const float* x = static_cast<const float*>(a.x);
  float acc[kGemvMaxRowsF32], accu[kGemvMaxRowsF32];
#pragma unroll
  for (int m = 0; m < kGemvMaxRowsF32; ++m) acc[m] = accu[m] = 0.0f;
  for (int i = lane * 4; i < k; i += 128) {
    const uint4 wb = load_stream16(wr + i);
    const float4 wv = *reinterpret_cast<const float4*>(&wb);
    float4 uv = make_float4(0.f, 0.f, 0.f, 0.f);
    if constexpr (kPair) {
      const uint4 ub = load_stream16(ur + i);
      uv = *reinterpret_cast<const float4*>(&ub);
    }
#pragma unroll
    for (int m = 0; m < kGemvMaxRowsF32; ++m) {
      if (m < a.m) {
        const float4 xv = __ldg(reinterpret_cast<const float4*>(x + m * a.x_stride + i));
        acc[m] += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
        if constexpr (kPair) accu[m] += uv.x * xv.x + uv.y * xv.y + uv.z * xv.z + uv.w * xv.w;
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kGemvMaxRowsF32; ++m) {
    if (m >= a.m) break;
    float v = warp_sum(acc[m]);
    if constexpr (!kPair) {
      if (lane == 0) {
        if (a.bias[s]) v += static_cast<const float*>(a.bias[s])[j];
        static_cast<float*>(a.out[s])[m * a.out_stride[s] + j] = v;
      }
    } else {
      float u = warp_sum(accu[m]);
      if (lane == 0) {
        if (a.bias[0]) v += static_cast<const float*>(a.bias[0])[j];
        if (a.bias[1]) u += static_cast<const float*>(a.bias[1])[j];
        static_cast<float*>(a.out[0])[m * a.out_stride[0] + j] = silu(v) * u;
      }
    }
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <class T, int NT, bool kPrologue, bool kPair>
void launch_mma(const GemvArgs& a, int tiles, Stream stream) {
  constexpr int kSets = kPair ? 2 : 1;
  const size_t xs_bytes = kPrologue ? (size_t(a.m) * (a.k + kXPad) * sizeof(T) + 15) / 16 * 16 : 0;
  const size_t smem = xs_bytes + size_t(kWarps) * kSets * NT * 4 * 32 * sizeof(float);
  auto kernel = gemv_mma_kernel<T, NT, kPrologue, kPair>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  launch(kernel, dim3(tiles), dim3(kThreads), smem, stream, a);
}

template <class T, bool kPrologue, bool kPair>
void launch_mma_nt(const GemvArgs& a, int tiles, Stream stream) {
  if (a.m <= 8)
    launch_mma<T, 1, kPrologue, kPair>(a, tiles, stream);
  else if (a.m <= 16)
    launch_mma<T, 2, kPrologue, kPair>(a, tiles, stream);
  else if (a.m <= 32)
    launch_mma<T, 4, kPrologue, kPair>(a, tiles, stream);
  else
    launch_mma<T, 8, kPrologue, kPair>(a, tiles, stream);
}

template <class T>
void launch_mma_dispatch(const GemvArgs& a, int tiles, bool prologue, bool pair, Stream stream) {
  if (prologue) {
    if (pair)
      launch_mma_nt<T, true, true>(a, tiles, stream);
    else
      launch_mma_nt<T, true, false>(a, tiles, stream);
  } else {
    if (pair)
      launch_mma_nt<T, false, true>(a, tiles, stream);
    else
      launch_mma_nt<T, false, false>(a, tiles, stream);
  }
}

// HK_DECODE_GEMV=mma|bulk: the 16-bit gemv that GemvKernel::Auto means (read once).
GemvKernel requested_kernel() {
  static const GemvKernel kernel = [] {
    const char* v = std::getenv("HK_DECODE_GEMV");
    const std::string s = v ? v : "";
    if (s.empty() || s == "auto") return GemvKernel::Auto;
    if (s == "mma") return GemvKernel::Mma;
    if (s == "bulk") return GemvKernel::Bulk;
    throw InvalidArgument("HK_DECODE_GEMV='" + s +
                          "' is not a decode gemv kernel: use mma, bulk or auto (or unset it)");
  }();
  return kernel;
}

// The staged gemv's groups a block where it serves (0: the mma.sync gemv), unless mma is asked
// for; asked for by name (GemvParams::kernel) where it cannot serve, the reason is thrown. The
// reason is a string made only then, not on every launch.
int bulk_groups_to_use(const GemvParams& p) {
  const GemvKernel k = p.kernel == GemvKernel::Auto ? requested_kernel() : p.kernel;
  if (k == GemvKernel::Mma) return 0;
  if (p.kernel != GemvKernel::Bulk) return bulk_groups(p, nullptr);
  std::string why;
  const int groups = bulk_groups(p, &why);
  if (groups == 0)
    throw Unsupported("decode gemv: the shared-memory-staged kernel cannot serve this call: " +
                      why);
  return groups;
}

}  // namespace

std::string gemv_kernel_unsupported(const GemvParams& p) {
  std::string why;
  if (p.kernel == GemvKernel::Bulk) bulk_groups(p, &why);
  return why;
}

std::string gemv_unsupported(const GemvParams& p) {
  const bool f32 = p.dtype == DType::F32;
  if (p.dtype != DType::BF16 && p.dtype != DType::F16 && !f32)
    return std::string("dtype ") + dtype_name(p.dtype) + " (decode gemv takes bf16, f16 or f32)";
  const int64_t max_rows = f32 ? kGemvMaxRowsF32 : kGemvMaxRows;
  if (p.m < 1 || p.m > max_rows)
    return "batch of " + std::to_string(p.m) + " rows (decode gemv takes 1 to " +
           std::to_string(max_rows) + " for this dtype)";
  const int64_t vec = f32 ? 4 : 8;
  if (p.k <= 0 || p.k % (f32 ? 4 : 32) != 0)
    return "in_features " + std::to_string(p.k) + " is not a multiple of " +
           std::to_string(f32 ? 4 : 32);
  if (p.k > (int64_t(1) << 30)) return "in_features too large";
  if (p.num_segments < 1 || p.num_segments > 3) return "1 to 3 weights per launch";
  if (p.epilogue == GemvEpilogue::SiluMul &&
      (p.num_segments != 2 || p.segments[0].n != p.segments[1].n))
    return "the SwiGLU epilogue needs gate and up of one size";
  for (int s = 0; s < p.num_segments; ++s) {
    const GemvSegment& g = p.segments[s];
    if (g.n <= 0 || g.n > (int64_t(1) << 30) || !g.weight || !g.out) return "empty weight";
    if (!aligned16(g.weight)) return "weight not 16-byte aligned";
  }
  if (p.has_prologue) {
    if (f32) return "the fused RMSNorm prologue takes 16-bit dtypes";
    const GemvPrologue& q = p.prologue;
    if (!q.residual || !q.norm_weight) return "prologue without residual or norm weight";
    if (size_t(p.m) * (p.k + kXPad) * 2 > 64 * 1024) return "prologue rows exceed 64 KB";
    if (!aligned16(q.residual) || q.residual_stride % vec != 0 || !aligned16(q.norm_weight) ||
        (q.delta && (!aligned16(q.delta) || q.delta_stride % vec != 0)) ||
        (q.residual_out && (!aligned16(q.residual_out) || q.residual_out_stride % vec != 0)))
      return "prologue tensors not 16-byte aligned rows";
  } else if (!p.x || !aligned16(p.x) || p.x_stride % vec != 0) {
    return "x rows not 16-byte aligned";
  }
  return "";
}

void gemv(const GemvParams& p, Stream stream) {
  const std::string why = gemv_unsupported(p);
  if (!why.empty()) throw Unsupported("decode gemv: " + why);
  const bool pair = p.epilogue == GemvEpilogue::SiluMul;
  const bool f32 = p.dtype == DType::F32;
  if (const int groups = f32 ? 0 : bulk_groups_to_use(p); groups > 0) {
    gemv_bulk(p, groups, stream);
    return;
  }
  const GemvArgs a = gemv_args(p, f32 ? kF32Rows : kMmaRows);
  const int tiles = a.tile_begin[a.num_segments];
  if (f32) {
    if (pair)
      launch(gemv_f32_kernel<true>, dim3(tiles), dim3(kThreads), 0, stream, a);
    else
      launch(gemv_f32_kernel<false>, dim3(tiles), dim3(kThreads), 0, stream, a);
  } else if (p.dtype == DType::BF16) {
    launch_mma_dispatch<__nv_bfloat16>(a, tiles, p.has_prologue, pair, stream);
  } else {
    launch_mma_dispatch<__half>(a, tiles, p.has_prologue, pair, stream);
  }
}

}  // namespace hk::decode
