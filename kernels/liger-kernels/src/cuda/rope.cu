// cuda/rope.cu — half-rotation RoPE on q and k in one launch, forward and backward.
//
// One block per token (b, s). Thread t owns pack j = t mod P of the first half of head_dim
// (P = half / pack width) and its partner pack in the second half, for heads t / P, t / P + T/P,
// ... across q's heads then k's: cos/sin for its columns are loaded once into registers and reused
// for every head. 16-byte packs when aligned, scalar otherwise. In place (y == x) is fine: each
// element is read and written by the same thread.
#include "cuda/common.cuh"
#include "liger/cuda_ops.h"

namespace liger::cuda {
namespace {

template <class T, int N>
__global__ void rope_kernel(RopeArgs a, int pairs, bool cos_f32_packed) {
  const int64_t b = blockIdx.x / a.seq, s = blockIdx.x % a.seq;
  const int half = static_cast<int>(a.head_dim / 2);
  const int j = threadIdx.x % pairs, slot = threadIdx.x / pairs, slots = blockDim.x / pairs;
  if (slot >= slots) return;
  const int64_t row =
      a.positions ? load_index(a.positions, a.positions_dt, b * a.positions_batch_stride + s)
                  : b * a.cos_batch_stride + s;
  const int c0 = j * N;
  float c1[N], c2[N], s1[N], s2[N];
  bool loaded = false;
  if constexpr (N % 4 == 0) {
    if (cos_f32_packed) {  // f32 tables, 16-byte aligned: N floats as N/4 float4 loads
      const float* cp = static_cast<const float*>(a.cos) + row * a.head_dim + c0;
      const float* sp = static_cast<const float*>(a.sin) + row * a.head_dim + c0;
#pragma unroll
      for (int i = 0; i < N; i += 4) {
        const float4 a1 = *reinterpret_cast<const float4*>(cp + i);
        const float4 a2 = *reinterpret_cast<const float4*>(cp + half + i);
        const float4 b1 = *reinterpret_cast<const float4*>(sp + i);
        const float4 b2 = *reinterpret_cast<const float4*>(sp + half + i);
        c1[i] = a1.x, c1[i + 1] = a1.y, c1[i + 2] = a1.z, c1[i + 3] = a1.w;
        c2[i] = a2.x, c2[i + 1] = a2.y, c2[i + 2] = a2.z, c2[i + 3] = a2.w;
        s1[i] = b1.x, s1[i + 1] = b1.y, s1[i + 2] = b1.z, s1[i + 3] = b1.w;
        s2[i] = b2.x, s2[i + 1] = b2.y, s2[i + 2] = b2.z, s2[i + 3] = b2.w;
      }
      loaded = true;
    }
  }
  if (!loaded) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      c1[i] = load_dt(a.cos, a.cos_dt, row * a.head_dim + c0 + i);
      c2[i] = load_dt(a.cos, a.cos_dt, row * a.head_dim + half + c0 + i);
      s1[i] = load_dt(a.sin, a.cos_dt, row * a.head_dim + c0 + i);
      s2[i] = load_dt(a.sin, a.cos_dt, row * a.head_dim + half + c0 + i);
    }
  }
  if (a.backward) {  // transpose: swap the roles so one formula serves both directions
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const float t = s1[i];
      s1[i] = -s2[i];
      s2[i] = -t;
    }
  }
  const int64_t total = a.q.heads + a.k.heads;
  for (int64_t h = slot; h < total; h += slots) {
    const bool is_q = h < a.q.heads;
    const RopeTensor& t = is_q ? a.q : a.k;
    const int64_t hh = is_q ? h : h - a.q.heads;
    const T* x = static_cast<const T*>(t.x) + b * t.x_strides[0] + s * t.x_strides[1] +
                 hh * t.x_strides[2] + c0;
    T* y =
        static_cast<T*>(t.y) + b * t.y_strides[0] + s * t.y_strides[1] + hh * t.y_strides[2] + c0;
    const Pack<T, N> x1 = ld<T, N>(x), x2 = ld<T, N>(x + half);
    Pack<T, N> y1, y2;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const float a1 = to_f32(x1.e[i]), a2 = to_f32(x2.e[i]);
      y1.e[i] = from_f32<T>(a1 * c1[i] - a2 * s1[i]);
      y2.e[i] = from_f32<T>(a2 * c2[i] + a1 * s2[i]);
    }
    st<T, N>(y, y1);
    st<T, N>(y + half, y2);
  }
}

bool strides_ok(const RopeTensor& t, int n) {
  return aligned16(t.x) && aligned16(t.y) && t.x_strides[0] % n == 0 && t.x_strides[1] % n == 0 &&
         t.x_strides[2] % n == 0 && t.y_strides[0] % n == 0 && t.y_strides[1] % n == 0 &&
         t.y_strides[2] % n == 0;
}

template <class T, int N>
int launch(const RopeArgs& a, cudaStream_t s) {
  const int pairs = static_cast<int>(a.head_dim / 2 / N);
  const int64_t want = static_cast<int64_t>(pairs) * (a.q.heads + a.k.heads);
  int threads = static_cast<int>(want < 256 ? (want + 31) / 32 * 32 : 256);
  threads = threads / pairs * pairs;  // whole slots only
  if (threads == 0) threads = pairs;  // pairs > 256 cannot happen below 1024 threads
  // float4 table loads need N % 4 == 0 and 16-byte aligned rows of f32.
  const bool cos_f32_packed = N % 4 == 0 && a.cos_dt == Dt::F32 && aligned16(a.cos) &&
                              aligned16(a.sin) && a.head_dim % 4 == 0;
  rope_kernel<T, N>
      <<<static_cast<unsigned>(a.batch * a.seq), threads, 0, s>>>(a, pairs, cos_f32_packed);
  return last_error();
}

}  // namespace

int rope(const RopeArgs& a, void* stream) {
  if (a.batch * a.seq == 0 || a.q.heads + a.k.heads == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  LIGER_DISPATCH_FLOAT(a.dt, T, {
    constexpr int N = 16 / sizeof(T);
    const bool vec =
        (a.head_dim / 2) % N == 0 && strides_ok(a.q, N) && (a.k.heads == 0 || strides_ok(a.k, N));
    return vec ? launch<T, N>(a, s) : launch<T, 1>(a, s);
  });
}

}  // namespace liger::cuda
