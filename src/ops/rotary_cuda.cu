// CUDA rotary position embedding: the cos/sin tables, the rotation and its transpose (backward).
//
// Tables follow Transformers' default rope in f32: inv_freq[i] = 1 / theta^(2i/D), freqs = pos ·
// inv_freq duplicated on both halves, cos/sin scaled by `attention_scaling`.
// Two rotation kernels. The dense one (x and y contiguous in the last dim, 16-byte aligned, half a
// multiple of the 16-byte pack) gives each thread one 16-byte pack of the first half and its
// partner in the second half, loads that pack's cos/sin once per token and reuses them for
// several heads of the token, with 2 × 4 independent 16-byte loads in flight per thread. The
// general one takes any strides with scalar accesses. In both, one thread reads both halves of a
// pair before writing them, so y may alias x. Math in f32, one rounding. Not here: interleaved
// (GPT-J) layout, partial rotary.
#include "ops/cuda_common.cuh"
#include "ops/cuda_ops.h"

namespace hk::ops::cuda {
namespace {
using namespace detail;

struct Strides4 {
  int64_t s[4];
};
Strides4 strides4(const TensorView& v) {
  return {{v.strides[0], v.strides[1], v.strides[2], v.strides[3]}};
}

// VEC consecutive f32 table values (general kernel); 16-byte loads when VEC is a multiple of 4 (the
// caller checks alignment for VEC > 1).
template <int VEC>
__device__ __forceinline__ void load_table(const float* __restrict__ p, float (&out)[VEC]) {
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
      const float4 v = reinterpret_cast<const float4*>(p)[q];
      out[4 * q] = v.x;
      out[4 * q + 1] = v.y;
      out[4 * q + 2] = v.z;
      out[4 * q + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = p[k];
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(256, 4)
    rotary_kernel(const T* x, Strides4 xs, T* y, Strides4 ys, const float* __restrict__ cos,
                  const float* __restrict__ sin, int64_t cos_batch_stride, int64_t cos_seq_stride,
                  int64_t B, int64_t S, int64_t H, int64_t D, bool backward) {
  constexpr int kTokens = 2;  // tokens per step: both tokens' loads are issued before any math
  const int64_t half = D / 2, groups = half / VEC, tokens = B * S;
  // A block walks pairs of tokens (b, s) with a grid stride; per token it rotates every head.
  for (int64_t t0 = int64_t(blockIdx.x) * kTokens; t0 < tokens;
       t0 += int64_t(gridDim.x) * kTokens) {
    const int n = t0 + 1 < tokens ? 2 : 1;
    for (int64_t t = threadIdx.x; t < H * groups; t += blockDim.x) {
      const int64_t h = t / groups, i0 = (t - h * groups) * VEC;
      // Raw storage vectors (packed 16-bit values use half the registers of floats).
      Vec<T, VEC> x1[kTokens], x2[kTokens];
#pragma unroll
      for (int u = 0; u < kTokens; ++u) {
        if (u >= n) break;
        const int64_t token = t0 + u, b = token / S, s = token - b * S;
        const T* xh = x + b * xs.s[0] + s * xs.s[1] + h * xs.s[2];
        if constexpr (VEC > 1) {
          x1[u] = *reinterpret_cast<const Vec<T, VEC>*>(xh + i0);
          x2[u] = *reinterpret_cast<const Vec<T, VEC>*>(xh + half + i0);
        } else {
          x1[u].v[0] = xh[i0 * xs.s[3]];
          x2[u].v[0] = xh[(half + i0) * xs.s[3]];
        }
      }
#pragma unroll
      for (int u = 0; u < kTokens; ++u) {
        if (u >= n) break;
        const int64_t token = t0 + u, b = token / S, s = token - b * S;
        const float* c = cos + b * cos_batch_stride + s * cos_seq_stride;
        const float* sn = sin + b * cos_batch_stride + s * cos_seq_stride;
        // Tables in chunks of up to 4 values (one 16-byte load each) to keep registers low.
        constexpr int C = VEC % 4 == 0 ? 4 : VEC;
        Vec<T, VEC> o1, o2;
#pragma unroll
        for (int q = 0; q < VEC / C; ++q) {
          float c1[C], c2[C], s1[C], s2[C];
          load_table<C>(c + i0 + q * C, c1);
          load_table<C>(c + half + i0 + q * C, c2);
          load_table<C>(sn + i0 + q * C, s1);
          load_table<C>(sn + half + i0 + q * C, s2);
#pragma unroll
          for (int e = 0; e < C; ++e) {
            const int k = q * C + e;
            // forward:  y1 = x1·c1 − x2·s1,  y2 = x2·c2 + x1·s2
            // backward: dx1 = dy1·c1 + dy2·s2, dx2 = dy2·c2 − dy1·s1
            const float a1 = to_f32(x1[u].v[k]), a2 = to_f32(x2[u].v[k]);
            const float y1 = backward ? a1 * c1[e] + a2 * s2[e] : a1 * c1[e] - a2 * s1[e];
            const float y2 = backward ? a2 * c2[e] - a1 * s1[e] : a2 * c2[e] + a1 * s2[e];
            o1.v[k] = from_f32<T>(y1);
            o2.v[k] = from_f32<T>(y2);
          }
        }
        T* yh = y + b * ys.s[0] + s * ys.s[1] + h * ys.s[2];
        if constexpr (VEC > 1) {
          *reinterpret_cast<Vec<T, VEC>*>(yh + i0) = o1;
          *reinterpret_cast<Vec<T, VEC>*>(yh + half + i0) = o2;
        } else {
          yh[i0 * ys.s[3]] = o1.v[0];
          yh[(half + i0) * ys.s[3]] = o2.v[0];
        }
      }
    }
  }
}

// Splits a flat token index into (batch, position) with 32-bit division when it fits (64-bit
// division is a long software sequence).
__device__ __forceinline__ void split_token(int64_t token, int64_t S, int64_t& b, int64_t& s) {
  if (token <= 0xffffffffLL && S <= 0xffffffffLL) {
    const uint32_t t = static_cast<uint32_t>(token), n = static_cast<uint32_t>(S);
    const uint32_t q = t / n;
    b = q;
    s = t - q * n;
  } else {
    b = token / S;
    s = token - b * S;
  }
}

// Two results rounded to the storage type with one paired conversion for 16-bit types.
__device__ __forceinline__ void store_pair(float* out, float a, float b) {
  out[0] = a;
  out[1] = b;
}
__device__ __forceinline__ void store_pair(__half* out, float a, float b) {
  *reinterpret_cast<__half2*>(out) = __floats2half2_rn(a, b);
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* out, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(a, b);
}

// 16-byte accesses of x and y with the evict-first (streaming) hint: each byte is touched once,
// and keeping it out of L2's way keeps the cos/sin rows resident for the other batches that reuse
// them (x and y stream ~8 × the L2 size between two uses of a table row at [8, 4096, 32, 128]).
template <class T, int VEC>
__device__ __forceinline__ Vec<T, VEC> load_streaming(const T* p) {
  static_assert(sizeof(Vec<T, VEC>) == sizeof(int4), "16-byte packs only");
  const int4 raw = __ldcs(reinterpret_cast<const int4*>(p));
  Vec<T, VEC> v;
  memcpy(&v, &raw, sizeof(v));
  return v;
}
template <class T, int VEC>
__device__ __forceinline__ void store_streaming(T* p, const Vec<T, VEC>& v) {
  int4 raw;
  memcpy(&raw, &v, sizeof(raw));
  __stcs(reinterpret_cast<int4*>(p), raw);
}

// Dense fast path: x and y contiguous in the last dim, 16-byte aligned, half a multiple of VEC.
// Thread layout inside a block: (token slot, head slot, pack j), pack fastest. A thread owns the
// VEC-element pack j of the first half and its partner in the second half (rotate_half needs no
// shuffles), loads that pack's cos/sin once per token as float4s and reuses them for heads
// hs, hs + head_slots, ... of the token; U heads' x packs are loaded before any is rotated, so each
// thread keeps 2·U independent 16-byte loads in flight. One tile of tokens per block (no grid
// stride: a thread's stores would otherwise sit between two tokens' loads). Each (token, head,
// pack) is read and written by one thread, reads first, so y may alias x.
// Heads per batch of loads, and resident 256-thread blocks per SM the register budget is sized
// for. 16-bit types hold 32 f32 table values per thread: with 4 heads of x that is 128 registers
// for bf16 and 104 for f16 (ptxas, sm_90a, no spills), so 2 blocks/SM (at 3 blocks/SM, 80
// registers, they spill even with 2 heads); f32 holds 16 table values, 80 registers, 3 blocks/SM.
// Either way 64-96 KB of x loads are in flight per SM, about twice what H200's bandwidth-latency
// product needs.
template <class T>
constexpr int kDenseHeadsPerStep = 4;
template <class T>
constexpr int kDenseBlocksPerSm = sizeof(T) == 4 ? 3 : 2;
constexpr int kDenseThreads = 256;

template <class T, int VEC, class Index, bool kBackward>
__global__ void __launch_bounds__(kDenseThreads, kDenseBlocksPerSm<T>)
    rotary_dense_kernel(const T* x, Strides4 xs, T* y, Strides4 ys, const float* __restrict__ cos,
                        const float* __restrict__ sin, int64_t cos_batch_stride, int64_t tokens,
                        int64_t S, int H, int D, int pairs, int head_slots, int tokens_per_block) {
  constexpr int U = kDenseHeadsPerStep<T>;
  static_assert(VEC % 4 == 0, "the dense path loads the tables as float4");
  const int half = D / 2;
  const int j = threadIdx.x % pairs, slot = threadIdx.x / pairs;
  const int hs = slot % head_slots, tl = slot / head_slots;
  if (tl >= tokens_per_block) return;
  const int c0 = j * VEC;
  const int64_t token = int64_t(blockIdx.x) * tokens_per_block + tl;
  if (token >= tokens) return;
  int64_t b, s;
  split_token(token, S, b, s);
  const float* cp = cos + b * cos_batch_stride + s * D + c0;
  const float* sp = sin + b * cos_batch_stride + s * D + c0;
  float c1[VEC], c2[VEC], s1[VEC], s2[VEC];
#pragma unroll
  for (int q = 0; q < VEC; q += 4) {
    const float4 a1 = *reinterpret_cast<const float4*>(cp + q);
    const float4 a2 = *reinterpret_cast<const float4*>(cp + half + q);
    const float4 b1 = *reinterpret_cast<const float4*>(sp + q);
    const float4 b2 = *reinterpret_cast<const float4*>(sp + half + q);
    c1[q] = a1.x, c1[q + 1] = a1.y, c1[q + 2] = a1.z, c1[q + 3] = a1.w;
    c2[q] = a2.x, c2[q + 1] = a2.y, c2[q + 2] = a2.z, c2[q + 3] = a2.w;
    s1[q] = b1.x, s1[q + 1] = b1.y, s1[q + 2] = b1.z, s1[q + 3] = b1.w;
    s2[q] = b2.x, s2[q + 1] = b2.y, s2[q + 2] = b2.z, s2[q + 3] = b2.w;
  }
  if constexpr (kBackward) {
    // A compile-time choice: a run-time branch here would wait for the table loads before the x
    // loads are issued. rotate_halfᵀ: dx1 = dy1·c1 + dy2·s2, dx2 = dy2·c2 − dy1·s1 is the forward
    // formula with s1 ← −s2 and s2 ← −s1 (negation is exact, so the results match the direct
    // formula).
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float t = s1[k];
      s1[k] = -s2[k];
      s2[k] = -t;
    }
  }
  const T* xt = x + (Index(b) * Index(xs.s[0]) + Index(s) * Index(xs.s[1]) + c0);
  T* yt = y + (Index(b) * Index(ys.s[0]) + Index(s) * Index(ys.s[1]) + c0);
  for (int h0 = hs; h0 < H; h0 += U * head_slots) {
    Vec<T, VEC> x1[U], x2[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int h = h0 + u * head_slots;
      if (h < H) {
        const T* xh = xt + Index(h) * Index(xs.s[2]);
        x1[u] = load_streaming<T, VEC>(xh);
        x2[u] = load_streaming<T, VEC>(xh + half);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int h = h0 + u * head_slots;
      if (h < H) {
        Vec<T, VEC> o1, o2;
#pragma unroll
        for (int k = 0; k < VEC; k += 2) {
          float y1[2], y2[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float a1 = to_f32(x1[u].v[k + e]), a2 = to_f32(x2[u].v[k + e]);
            y1[e] = a1 * c1[k + e] - a2 * s1[k + e];
            y2[e] = a2 * c2[k + e] + a1 * s2[k + e];
          }
          store_pair(&o1.v[k], y1[0], y1[1]);
          store_pair(&o2.v[k], y2[0], y2[1]);
        }
        T* yh = yt + Index(h) * Index(ys.s[2]);
        store_streaming<T, VEC>(yh, o1);
        store_streaming<T, VEC>(yh + half, o2);
      }
    }
  }
}

__global__ void rotary_tables_kernel(const void* __restrict__ pos, bool pos_i64, int64_t pos_bs,
                                     int64_t pos_ss, float* __restrict__ cos, Strides4 cs,
                                     float* __restrict__ sin, Strides4 ss, int64_t Bc, int64_t S,
                                     int64_t D, float theta, float scaling) {
  const int64_t n = Bc * S * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % D, bs = i / D, s = bs % S, b = bs / S;
    const int64_t half = D / 2;
    const int64_t f = d < half ? d : d - half;
    const float inv_freq = 1.0f / powf(theta, static_cast<float>(2 * f) / static_cast<float>(D));
    const float p = static_cast<float>(load_index(pos, pos_i64, b * pos_bs + s * pos_ss));
    const float angle = p * inv_freq;
    cos[b * cs.s[0] + s * cs.s[1] + d * cs.s[2]] = cosf(angle) * scaling;
    sin[b * ss.s[0] + s * ss.s[1] + d * ss.s[2]] = sinf(angle) * scaling;
  }
}

// Whether every element offset of the view (strides ≥ 0) fits in an int32.
bool offsets_fit_int32(const TensorView& v) {
  int64_t last = 0;
  for (int d = 0; d < v.ndim; ++d) {
    if (v.strides[d] < 0) return false;
    last += (v.shape[d] - 1) * v.strides[d];
  }
  return last < 2147483647LL;
}

void run_rotary(const TensorView& x, const TensorView& cos, const TensorView& sin,
                const TensorView& y, bool backward, Stream stream) {
  const char* name = backward ? "rotary_embedding_backward" : "rotary_embedding";
  require_float(name, x.dtype);
  if (x.dtype != y.dtype) throw InvalidArgument(std::string(name) + ": x and y dtypes differ");
  if (cos.dtype != DType::F32 || sin.dtype != DType::F32)
    throw InvalidArgument(std::string(name) + ": cos/sin must be f32");
  if (x.ndim != 4 || cos.ndim != 3)
    throw InvalidArgument(std::string(name) + ": expected x [B, S, H, D] and cos/sin [B|1, S, D]");
  if (x.numel() == 0) return;
  DeviceGuard guard(x.device);
  const int64_t B = x.shape[0], S = x.shape[1], H = x.shape[2], D = x.shape[3];
  if (D % 2 != 0) throw InvalidArgument(std::string(name) + ": head_dim must be even");
  Tensor keep_cos, keep_sin;
  const TensorView cv = contiguous_input(cos, keep_cos, stream);
  const TensorView sv = contiguous_input(sin, keep_sin, stream);
  const int64_t cos_bs = cv.shape[0] == 1 ? 0 : S * D;
  const int64_t cos_ss = D;
  const Strides4 xs = strides4(x), ys = strides4(y);
  const int64_t half = D / 2, tokens = B * S;
  const cudaStream_t s = native(stream);
  dispatch_float(x.dtype, name, [&](auto tag) {
    using T = decltype(tag);
    constexpr int VEC = static_cast<int>(16 / sizeof(T));
    bool dense = x.strides[3] == 1 && y.strides[3] == 1 && half % VEC == 0 &&
                 half / VEC <= kDenseThreads && H < (int64_t(1) << 30) && D < (int64_t(1) << 30) &&
                 aligned_to(x.ptr(), 16) && aligned_to(y.ptr(), 16) && aligned_to(cv.ptr(), 16) &&
                 aligned_to(sv.ptr(), 16);
    for (int d = 0; d < 3; ++d) dense = dense && xs.s[d] % VEC == 0 && ys.s[d] % VEC == 0;
    if (dense) {
      // Head slots so each thread rotates about U heads per token (one batch of loads), then as
      // many tokens per block as fill kDenseThreads threads.
      const int pairs = static_cast<int>(half / VEC);
      constexpr int U = kDenseHeadsPerStep<T>;
      int64_t head_slots = (H + U - 1) / U;
      head_slots = std::max<int64_t>(1, std::min<int64_t>(head_slots, kDenseThreads / pairs));
      const int64_t per_token = pairs * head_slots;
      const int64_t tokens_per_block = std::max<int64_t>(1, kDenseThreads / per_token);
      const int threads = static_cast<int>(per_token * tokens_per_block);
      const int64_t tiles = (tokens + tokens_per_block - 1) / tokens_per_block;
      const unsigned grid = checked_grid_x(tiles, name);
      auto launch = [&](auto index_tag) {
        using Index = decltype(index_tag);
        const auto kernel = backward ? rotary_dense_kernel<T, VEC, Index, true>
                                     : rotary_dense_kernel<T, VEC, Index, false>;
        kernel<<<grid, threads, 0, s>>>(
            static_cast<const T*>(x.ptr()), xs, static_cast<T*>(y.ptr()), ys, cv.data_as<float>(),
            sv.data_as<float>(), cos_bs, tokens, S, static_cast<int>(H), static_cast<int>(D), pairs,
            static_cast<int>(head_slots), static_cast<int>(tokens_per_block));
      };
      // 32-bit element offsets when every offset of x and y fits: fewer registers per address.
      if (offsets_fit_int32(x) && offsets_fit_int32(y))
        launch(int32_t{});
      else
        launch(int64_t{});
    } else {
      // General strided path: one resident wave (8 blocks of ≤ 256 threads per SM), scalar
      // accesses with full strides.
      const unsigned grid =
          static_cast<unsigned>(std::min<int64_t>((tokens + 1) / 2, int64_t(sm_count()) * 8));
      const int threads = static_cast<int>(std::min<int64_t>(256, (H * half + 31) / 32 * 32));
      rotary_kernel<T, 1><<<grid, threads, 0, s>>>(
          static_cast<const T*>(x.ptr()), xs, static_cast<T*>(y.ptr()), ys, cv.data_as<float>(),
          sv.data_as<float>(), cos_bs, cos_ss, B, S, H, D, backward);
    }
    HK_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void rotary_tables(const TensorView& positions, int64_t head_dim, double theta,
                   float attention_scaling, const TensorView& cos, const TensorView& sin,
                   Stream stream) {
  if (cos.dtype != DType::F32 || sin.dtype != DType::F32)
    throw InvalidArgument("rotary_tables: cos/sin must be f32");
  if (positions.dtype != DType::I32 && positions.dtype != DType::I64)
    throw InvalidArgument("rotary_tables: positions must be i32 or i64");
  if (cos.numel() == 0) return;
  DeviceGuard guard(cos.device);
  const int64_t Bc = cos.shape[0], S = cos.shape[1], D = head_dim;
  const int64_t pos_bs = positions.ndim == 2 && positions.shape[0] > 1 ? positions.strides[0] : 0;
  const int64_t pos_ss = positions.strides[positions.ndim - 1];
  const int threads = 256;
  const int64_t n = Bc * S * D;
  rotary_tables_kernel<<<grid_for(n, threads, 16), threads, 0, native(stream)>>>(
      positions.ptr(), positions.dtype == DType::I64, pos_bs, pos_ss, cos.data_as<float>(),
      Strides4{{cos.strides[0], cos.strides[1], cos.strides[2], 0}}, sin.data_as<float>(),
      Strides4{{sin.strides[0], sin.strides[1], sin.strides[2], 0}}, Bc, S, D,
      static_cast<float>(theta), attention_scaling);
  HK_CUDA_CHECK_LAUNCH();
}

void rotary_embedding(const TensorView& x, const TensorView& cos, const TensorView& sin,
                      const TensorView& y, Stream stream) {
  run_rotary(x, cos, sin, y, false, stream);
}

void rotary_embedding_backward(const TensorView& dy, const TensorView& cos, const TensorView& sin,
                               const TensorView& dx, Stream stream) {
  run_rotary(dy, cos, sin, dx, true, stream);
}

}  // namespace hk::ops::cuda
