// CUDA rotary position embedding: the cos/sin tables, the rotation and its transpose (backward).
//
// Tables follow Transformers' default rope in f32: inv_freq[i] = 1 / theta^(2i/D), freqs = pos ·
// inv_freq duplicated on both halves, cos/sin scaled by `attention_scaling`.
// The rotation uses one block per token (b, s): the block reads that token's cos/sin rows once
// (they stay in L1) and rotates all heads. A thread owns VEC consecutive elements of the first half
// and the matching ones of the second half, so y may alias x (each pair is read before written).
// VEC covers 16 bytes of x when the last dim is contiguous and aligned; otherwise VEC = 1 with
// full strides. Math in f32, one rounding. Not here: interleaved (GPT-J) layout, partial rotary.
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

// VEC consecutive f32 table values; 16-byte loads when VEC is a multiple of 4 (the caller checks
// alignment for VEC > 1).
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
__global__ void rotary_kernel(const T* x, Strides4 xs, T* y, Strides4 ys,
                              const float* __restrict__ cos, const float* __restrict__ sin,
                              int64_t cos_batch_stride, int64_t cos_seq_stride, int64_t B,
                              int64_t S, int64_t H, int64_t D, bool backward) {
  const int64_t half = D / 2, groups = half / VEC;
  // A block walks tokens (b, s) with a grid stride; per token it rotates every head.
  for (int64_t token = blockIdx.x; token < B * S; token += gridDim.x) {
    const int64_t b = token / S, s = token - b * S;
    const float* c = cos + b * cos_batch_stride + s * cos_seq_stride;
    const float* sn = sin + b * cos_batch_stride + s * cos_seq_stride;
    const T* xt = x + b * xs.s[0] + s * xs.s[1];
    T* yt = y + b * ys.s[0] + s * ys.s[1];
    for (int64_t t = threadIdx.x; t < H * groups; t += blockDim.x) {
      const int64_t h = t / groups, i0 = (t - h * groups) * VEC;
      const T* xh = xt + h * xs.s[2];
      T* yh = yt + h * ys.s[2];
      float x1[VEC], x2[VEC];
      if constexpr (VEC > 1) {
        const Vec<T, VEC> a = *reinterpret_cast<const Vec<T, VEC>*>(xh + i0);
        const Vec<T, VEC> bv = *reinterpret_cast<const Vec<T, VEC>*>(xh + half + i0);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          x1[k] = to_f32(a.v[k]);
          x2[k] = to_f32(bv.v[k]);
        }
      } else {
        x1[0] = to_f32(xh[i0 * xs.s[3]]);
        x2[0] = to_f32(xh[(half + i0) * xs.s[3]]);
      }
      float c1[VEC], c2[VEC], s1[VEC], s2[VEC];
      load_table<VEC>(c + i0, c1);
      load_table<VEC>(c + half + i0, c2);
      load_table<VEC>(sn + i0, s1);
      load_table<VEC>(sn + half + i0, s2);
      Vec<T, VEC> o1, o2;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        // forward:  y1 = x1·c1 − x2·s1,  y2 = x2·c2 + x1·s2
        // backward: dx1 = dy1·c1 + dy2·s2, dx2 = dy2·c2 − dy1·s1
        const float y1 = backward ? x1[k] * c1[k] + x2[k] * s2[k] : x1[k] * c1[k] - x2[k] * s1[k];
        const float y2 = backward ? x2[k] * c2[k] - x1[k] * s1[k] : x2[k] * c2[k] + x1[k] * s2[k];
        o1.v[k] = from_f32<T>(y1);
        o2.v[k] = from_f32<T>(y2);
      }
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
  const int64_t half = D / 2;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(B * S, int64_t(sm_count()) * 16));
  const cudaStream_t s = native(stream);
  dispatch_float(x.dtype, name, [&](auto tag) {
    using T = decltype(tag);
    constexpr int VEC = static_cast<int>(16 / sizeof(T));
    bool wide = x.strides[3] == 1 && y.strides[3] == 1 && half % VEC == 0 &&
                aligned_to(x.ptr(), 16) && aligned_to(y.ptr(), 16) && aligned_to(cv.ptr(), 16) &&
                aligned_to(sv.ptr(), 16);
    for (int d = 0; d < 3; ++d) wide = wide && xs.s[d] % VEC == 0 && ys.s[d] % VEC == 0;
    const int64_t groups = wide ? half / VEC : half;
    const int threads = static_cast<int>(std::min<int64_t>(256, (H * groups + 31) / 32 * 32));
    if (wide) {
      rotary_kernel<T, VEC><<<grid, threads, 0, s>>>(
          static_cast<const T*>(x.ptr()), xs, static_cast<T*>(y.ptr()), ys, cv.data_as<float>(),
          sv.data_as<float>(), cos_bs, cos_ss, B, S, H, D, backward);
    } else {
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
