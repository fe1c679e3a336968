// The small per-step decode kernels (decode_kernels.h): q/k RMSNorm + rotary + KV-cache write in
// one launch, rotary tables from device positions, the greedy pick with the generation
// bookkeeping, and the position advance of host-sampled steps.
//
// qk_rope_cache: one block per (head, row) over the q, k and v heads of the fused q/k/v output;
// thread j owns the rotary pair (j, j + D/2). Rounding as the unfused layers: the norm output is
// rounded to the dtype (ops::rms_norm), the rotation is computed in f32 from it and rounded once
// (ops::rotary_embedding), with cos/sin = cos/sin(position·inv_freq) in f32 as ops::rotary_tables.
// greedy: blocks scan slices of a row and the last block of the row (atomic counter, reset by it)
// reduces the slices' bests; the order is (value, then lowest index), so ties go to the lowest
// index (torch.argmax) whatever the schedule.
#include <algorithm>
#include <cmath>

#include "hk/error.h"
#include "ops/decode/decode_common.cuh"

namespace hk::decode {
namespace {
using namespace detail;

struct RopeArgs {
  int heads_q = 0, heads_kv = 0, head_dim = 0;
  void* qkv = nullptr;
  int64_t qkv_stride = 0;
  int head_offset = 0;  // first head handled (heads_q when q is left alone)
  const void* q_norm = nullptr;
  const void* k_norm = nullptr;
  float eps = 0.0f;
  bool rotate = true;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  float theta = 0.0f, scaling = 1.0f;
  const int32_t* cache_index = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  int64_t c_bs = 0, c_rs = 0, capacity = 0;
};

template <class T>
__global__ void qk_rope_cache_kernel(const RopeArgs a) {
  __shared__ float partial[32];
  const int head = blockIdx.x + a.head_offset, b = blockIdx.y;
  const int D = a.head_dim, half = D / 2, j = threadIdx.x;
  const bool on = j < half;
  const int kind = head < a.heads_q ? 0 : head < a.heads_q + a.heads_kv ? 1 : 2;  // q, k, v
  const void* norm = kind == 0 ? a.q_norm : kind == 1 ? a.k_norm : nullptr;
  // Weights and the frequency depend on no kernel: read before the wait. Everything the step's
  // kernels write (q/k/v, positions, cache rows) is read after it, in one round trip.
  float w1 = 1.0f, w2 = 1.0f, freq = 0.0f;
  if (on && norm) {
    w1 = to_f32(static_cast<const T*>(norm)[j]);
    w2 = to_f32(static_cast<const T*>(norm)[j + half]);
  }
  if (on && kind != 2 && a.rotate) freq = inverse_frequency(a.inv_freq, a.theta, j, D);
  grid_wait();
  grid_launch_dependents();
  T* src = static_cast<T*>(a.qkv) + int64_t(b) * a.qkv_stride + int64_t(head) * D;
  float x1 = on ? to_f32(src[j]) : 0.0f, x2 = on ? to_f32(src[j + half]) : 0.0f;
  const int32_t position = kind != 2 && a.rotate ? a.positions[b] : 0;
  const int64_t cache_row = kind != 0 ? a.cache_index[b] : 0;
  if (norm) {  // block-uniform
    float ss = warp_sum(x1 * x1 + x2 * x2);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    if (lane == 0) partial[warp] = ss;
    __syncthreads();
    ss = 0.0f;
    for (int w = 0; w < warps; ++w) ss += partial[w];
    const float r = rsqrtf(ss / static_cast<float>(D) + a.eps);
    if (on) {
      x1 = round_as<T>(round_as<T>(x1 * r) * w1);
      x2 = round_as<T>(round_as<T>(x2 * r) * w2);
    }
  }
  if (!on) return;
  if (kind != 2 && a.rotate) {
    const float angle = static_cast<float>(position) * freq;
    const float c = cosf(angle) * a.scaling, s = sinf(angle) * a.scaling;
    const float y1 = x1 * c - x2 * s;
    const float y2 = x2 * c + x1 * s;
    x1 = y1;
    x2 = y2;
  }
  T* dst = src;
  if (kind != 0) {
    if (cache_row < 0 || cache_row >= a.capacity) return;  // the host sizes the cache
    T* cache = static_cast<T*>(kind == 1 ? a.k_cache : a.v_cache);
    const int kv_head = head - a.heads_q - (kind == 2 ? a.heads_kv : 0);
    dst = cache + int64_t(b) * a.c_bs + cache_row * a.c_rs + int64_t(kv_head) * D;
  }
  dst[j] = from_f32<T>(x1);
  dst[j + half] = from_f32<T>(x2);
}

__global__ void rope_tables_kernel(const int32_t* positions, int head_dim, const float* inv_freq,
                                   float theta, float scaling, float* cos, float* sin) {
  grid_wait();
  grid_launch_dependents();
  const int b = blockIdx.x, half = head_dim / 2;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    const int f = d < half ? d : d - half;
    const float angle =
        static_cast<float>(positions[b]) * inverse_frequency(inv_freq, theta, f, head_dim);
    cos[int64_t(b) * head_dim + d] = cosf(angle) * scaling;
    sin[int64_t(b) * head_dim + d] = sinf(angle) * scaling;
  }
}

struct GreedyArgs {
  int vocab = 0, blocks_per_row = 1;
  bool vector_loads = false;  // rows 16-byte aligned: read 16 bytes at a time
  const void* logits = nullptr;
  int64_t stride = 0;
  int64_t* tokens = nullptr;
  int32_t* done = nullptr;
  const int64_t* eos = nullptr;
  int num_eos = 0;
  int64_t pad = 0;
  int32_t* positions = nullptr;
  int32_t* lengths = nullptr;
  float* pv = nullptr;
  int32_t* pi = nullptr;
  int32_t* counters = nullptr;
};

// The better of two candidates: larger value, then smaller index; index -1 = none.
__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
  if (oi < 0) return;
  if (i < 0 || ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__device__ void block_best(float& v, int& i) {
  __shared__ float sv[32];
  __shared__ int si[32];
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    better(v, i, ov, oi);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x >> 5); ++w) better(v, i, sv[w], si[w]);
  }
  __syncthreads();
}

template <class T>
__global__ void __launch_bounds__(256) greedy_kernel(const GreedyArgs a) {
  grid_wait();
  grid_launch_dependents();
  constexpr int V = 16 / sizeof(T);
  const int b = blockIdx.y, p = blockIdx.x;
  // chunks are whole vectors, so only the row's end can leave a scalar tail
  const int chunk = ((a.vocab + a.blocks_per_row - 1) / a.blocks_per_row + V - 1) / V * V;
  const int lo = p * chunk, hi = min(a.vocab, lo + chunk);
  const T* row = static_cast<const T*>(a.logits) + int64_t(b) * a.stride;
  float v = -INFINITY;
  int i = -1;
  int scalar_from = lo;
  if (a.vector_loads) {
    const int vec_hi = lo + max(0, hi - lo) / V * V;
    for (int x = lo + int(threadIdx.x) * V; x < vec_hi; x += int(blockDim.x) * V) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(row + x));
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < V; ++k) better(v, i, to_f32(e[k]), x + k);
    }
    scalar_from = vec_hi;
  }
  for (int x = scalar_from + threadIdx.x; x < hi; x += blockDim.x) better(v, i, to_f32(row[x]), x);
  block_best(v, i);
  if (a.blocks_per_row > 1) {
    __shared__ int is_last;
    if (threadIdx.x == 0) {
      a.pv[b * a.blocks_per_row + p] = v;
      a.pi[b * a.blocks_per_row + p] = i;
      __threadfence();
      is_last = atomicAdd(&a.counters[b], 1) == a.blocks_per_row - 1;
    }
    __syncthreads();
    if (!is_last) return;  // block-uniform
    __threadfence();
    // The partials in parallel, one L2 round trip: thread 0 reading them in turn took ~20 µs at
    // batch 1 (74 partials; ncu on the H200).
    v = -INFINITY;
    i = -1;
    for (int q = threadIdx.x; q < a.blocks_per_row; q += blockDim.x)
      better(v, i, __ldcg(a.pv + b * a.blocks_per_row + q),
             __ldcg(a.pi + b * a.blocks_per_row + q));
    block_best(v, i);
    if (threadIdx.x == 0) a.counters[b] = 0;
  }
  if (threadIdx.x != 0) return;
  const bool finished = a.done[b] != 0;
  const int64_t token = finished ? a.pad : (i < 0 ? 0 : i);
  if (!finished)
    for (int e = 0; e < a.num_eos; ++e)
      if (token == a.eos[e]) a.done[b] = 1;
  a.tokens[b] = token;
  a.positions[b] += 1;
  a.lengths[b] += 1;
}

__global__ void advance_kernel(int32_t* positions, int32_t* lengths, int batch) {
  grid_wait();
  grid_launch_dependents();
  for (int b = threadIdx.x; b < batch; b += blockDim.x) {
    positions[b] += 1;
    lengths[b] += 1;
  }
}

int block_for_half(int64_t head_dim) {
  const int half = static_cast<int>(head_dim / 2);
  return std::max(32, (half + 31) / 32 * 32);
}

}  // namespace

void qk_rope_cache(const QkRopeCacheParams& p, Stream stream) {
  if (p.head_dim <= 0 || p.head_dim % 2 != 0 || p.head_dim > 2048)
    throw Unsupported("decode qk_rope_cache: head_dim " + std::to_string(p.head_dim));
  if (p.dtype != DType::BF16 && p.dtype != DType::F16 && p.dtype != DType::F32)
    throw Unsupported(std::string("decode qk_rope_cache: dtype ") + dtype_name(p.dtype));
  RopeArgs a;
  a.heads_q = static_cast<int>(p.heads_q);
  a.heads_kv = static_cast<int>(p.heads_kv);
  a.head_dim = static_cast<int>(p.head_dim);
  a.qkv = p.qkv;
  a.qkv_stride = p.qkv_stride;
  a.head_offset = p.process_q ? 0 : a.heads_q;
  a.q_norm = p.q_norm_weight;
  a.k_norm = p.k_norm_weight;
  a.eps = p.eps;
  a.rotate = p.rotate;
  a.positions = p.positions;
  a.inv_freq = p.inv_freq;
  a.theta = p.rope_theta;
  a.scaling = p.attention_scaling;
  a.cache_index = p.cache_index;
  a.k_cache = p.k_cache;
  a.v_cache = p.v_cache;
  a.c_bs = p.cache_batch_stride;
  a.c_rs = p.cache_row_stride;
  a.capacity = p.capacity;
  const int heads = a.heads_q + 2 * a.heads_kv - a.head_offset;
  const dim3 grid(static_cast<unsigned>(heads), static_cast<unsigned>(p.batch));
  const dim3 block(static_cast<unsigned>(block_for_half(p.head_dim)));
  switch (p.dtype) {
    case DType::BF16:
      return launch(qk_rope_cache_kernel<__nv_bfloat16>, grid, block, 0, stream, a);
    case DType::F16:
      return launch(qk_rope_cache_kernel<__half>, grid, block, 0, stream, a);
    default:
      return launch(qk_rope_cache_kernel<float>, grid, block, 0, stream, a);
  }
}

void rope_tables(const int32_t* positions, int64_t batch, int64_t head_dim, const float* inv_freq,
                 float rope_theta, float attention_scaling, float* cos, float* sin, Stream stream) {
  launch(rope_tables_kernel, dim3(static_cast<unsigned>(batch)),
         dim3(static_cast<unsigned>(std::min<int64_t>(256, (head_dim + 31) / 32 * 32))), 0, stream,
         positions, static_cast<int>(head_dim), inv_freq, rope_theta, attention_scaling, cos, sin);
}

int greedy_blocks_per_row(int64_t batch, int64_t vocab) {
  // ~8 blocks an SM: the scan is one pass over the logits, bound by how many loads are in flight
  const int64_t target = 8 * int64_t(detail::device_sm_count());
  const int64_t per_row = std::max<int64_t>(1, target / std::max<int64_t>(batch, 1));
  return static_cast<int>(std::clamp<int64_t>(per_row, 1, std::max<int64_t>(1, vocab / 2048)));
}

void greedy(const GreedyParams& p, Stream stream) {
  if (p.vocab <= 0 || p.vocab > (int64_t(1) << 30))
    throw Unsupported("decode greedy: vocabulary of " + std::to_string(p.vocab));
  GreedyArgs a;
  a.vocab = static_cast<int>(p.vocab);
  a.blocks_per_row = std::max(1, p.blocks_per_row);
  a.logits = p.logits;
  a.stride = p.logits_stride;
  a.tokens = p.tokens;
  a.done = p.done;
  a.eos = p.eos;
  a.num_eos = p.num_eos;
  a.pad = p.pad_id;
  a.positions = p.positions;
  a.lengths = p.lengths;
  a.pv = p.partial_values;
  a.pi = p.partial_indices;
  a.counters = p.counters;
  a.vector_loads = reinterpret_cast<uintptr_t>(p.logits) % 16 == 0 &&
                   (p.logits_stride * static_cast<int64_t>(dtype_size(p.dtype))) % 16 == 0;
  if (a.blocks_per_row > 1 && (!a.pv || !a.pi || !a.counters))
    throw InvalidArgument("decode greedy: several blocks per row need the partial buffers");
  const dim3 grid(static_cast<unsigned>(a.blocks_per_row), static_cast<unsigned>(p.batch));
  switch (p.dtype) {
    case DType::BF16:
      return launch(greedy_kernel<__nv_bfloat16>, grid, dim3(256), 0, stream, a);
    case DType::F16:
      return launch(greedy_kernel<__half>, grid, dim3(256), 0, stream, a);
    case DType::F32:
      return launch(greedy_kernel<float>, grid, dim3(256), 0, stream, a);
    default:
      throw Unsupported(std::string("decode greedy: dtype ") + dtype_name(p.dtype));
  }
}

void advance(int32_t* positions, int32_t* lengths, int64_t batch, Stream stream) {
  launch(advance_kernel, dim3(1),
         dim3(static_cast<unsigned>(std::min<int64_t>(1024, (batch + 31) / 32 * 32))), 0, stream,
         positions, lengths, static_cast<int>(batch));
}

}  // namespace hk::decode
