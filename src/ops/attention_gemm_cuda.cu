// Fast CUDA forward attention for inference: batched cuBLAS GEMMs for prefill, one fused kernel
// for decode. Same numbers as the eager kernels in attention_cuda.cu (f32 scores and softmax,
// probabilities rounded to q's dtype before P·V, fully masked rows give zeros), much faster.
//
//  - decode (S ≤ kDecodeMaxQueries, T ≤ kDecodeMaxKeys): one block per (batch, query head, query
//    row). Warps split the visible keys for q·k (scores kept in shared memory), the block finds
//    max and sum, rounds each probability to the dtype, then warps split the keys again for P·V
//    and the partial rows are summed through shared memory. Only visible keys are read.
//  - everything else: scores f32 [b·Hq, S, T] = scale·Q·Kᵀ through cublasGemmBatchedEx, a masked
//    row softmax writing P in q's dtype (masked → 0), then out = P·V, written in place with out's
//    strides. The per-(batch, head) operand pointers are computed on the device (a GQA query head
//    h reads kv head h / (Hq/Hkv)), so nothing synchronises with the host. Causal prefill runs in
//    row blocks that multiply only the keys their rows can see; batches run in chunks so that the
//    score buffers stay under kScoreBudgetBytes.
// Masked keys are skipped by the softmax, but P·V still multiplies their zero probabilities with
// their V rows: V must be finite there (it is: padding positions hold computed values).
// Not here: flash-style tiling (no S·T buffer), backward, the `probs` output.
#include <cooperative_groups.h>
#include <cublas_v2.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "ops/attention_fast.h"
#include "ops/cuda_common.cuh"

namespace hk::ops::cuda {
namespace {
using namespace detail;
namespace cg = cooperative_groups;

constexpr int kMaxHeadDim = 256;
constexpr int64_t kDecodeMaxQueries = 4;
constexpr int64_t kDecodeMaxKeys = 7680;  // scores + partial rows within 48 KiB of shared memory
constexpr int kDecodeWarps = 16;          // a decode block is alone on its SM at batch 1: use it
constexpr int kKeyUnroll = 4;             // key rows a decode warp loads before reducing
constexpr int kSoftmaxWarps = 8;          // rows per block of the softmax kernel
constexpr size_t kScoreBudgetBytes = size_t(1) << 30;

struct Dims {
  int64_t B, S, T, Hq, Hkv, D;
};
struct Strides4 {
  int64_t s[4];
};
Strides4 strides4(const TensorView& v) {
  return {{v.strides[0], v.strides[1], v.strides[2], v.strides[3]}};
}
struct Mask {
  bool causal;
  const void* key_start;  // null = none
  bool key_start_i64;
};

// Visible keys of query row i of batch b: [first, last] (empty when first > last).
__device__ __forceinline__ void visible_keys(const Mask& mask, const Dims& d, int64_t b, int64_t i,
                                             int64_t& first, int64_t& last) {
  first = mask.key_start ? load_index(mask.key_start, mask.key_start_i64, b) : 0;
  first = max(first, int64_t(0));
  last = mask.causal ? min(d.T - d.S + i, d.T - 1) : d.T - 1;
}

// ---- decode -------------------------------------------------------------------------------------
template <class T, int DPL>  // DPL: head-dim elements per lane (D ≤ 32·DPL)
__global__ void __launch_bounds__(kDecodeWarps * 32)
    attention_decode_kernel(const T* __restrict__ q, Strides4 qs, const T* __restrict__ k,
                            Strides4 ks, const T* __restrict__ v, Strides4 vs, T* __restrict__ out,
                            Strides4 os, Dims dims, Mask mask, float scale) {
  extern __shared__ float smem[];
  float* partial = smem;                               // [kDecodeWarps][32·DPL]
  float* scratch = partial + kDecodeWarps * 32 * DPL;  // 32 floats
  float* probs = scratch + 32;                         // [T]
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t hk = h / (dims.Hq / dims.Hkv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T* out_row = out + b * os.s[0] + i * os.s[1] + h * os.s[2];

  int64_t first, last;
  visible_keys(mask, dims, b, i, first, last);
  if (first > last) {  // fully masked: zeros, not NaN
    for (int64_t d = threadIdx.x; d < dims.D; d += blockDim.x) out_row[d] = from_f32<T>(0.0f);
    return;
  }

  float qv[DPL];
  const T* q_row = q + b * qs.s[0] + i * qs.s[1] + h * qs.s[2];
#pragma unroll
  for (int t = 0; t < DPL; ++t) {
    const int64_t d = lane + 32 * t;
    qv[t] = d < dims.D ? to_f32(q_row[d]) : 0.0f;
  }
  // Each warp reads kKeyUnroll key rows before reducing, so their loads are in flight together.
  const T* k_head = k + b * ks.s[0] + hk * ks.s[2];
  for (int64_t j0 = first + warp * kKeyUnroll; j0 <= last; j0 += kDecodeWarps * kKeyUnroll) {
    float kv[kKeyUnroll][DPL];
#pragma unroll
    for (int u = 0; u < kKeyUnroll; ++u) {
      const T* k_row = k_head + min(j0 + u, last) * ks.s[1];
#pragma unroll
      for (int t = 0; t < DPL; ++t) {
        const int64_t d = lane + 32 * t;
        kv[u][t] = d < dims.D ? to_f32(k_row[d]) : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kKeyUnroll; ++u) {
      float dot = 0.0f;
#pragma unroll
      for (int t = 0; t < DPL; ++t) dot += qv[t] * kv[u][t];
      dot = warp_sum(dot);
      if (lane == 0 && j0 + u <= last) probs[j0 + u - first] = dot * scale;
    }
  }
  __syncthreads();

  const int64_t n = last - first + 1;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, probs[j]);
  m = block_max(m, scratch);
  if (m == -INFINITY) {  // only -inf scores (inf/NaN-free inputs never get here): like eager
    for (int64_t d = threadIdx.x; d < dims.D; d += blockDim.x) out_row[d] = from_f32<T>(0.0f);
    return;
  }
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += expf(probs[j] - m);
  sum = block_sum(sum, scratch);
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    probs[j] = round_as<T>(expf(probs[j] - m) * inv);
  __syncthreads();

  float acc[DPL] = {};
  const T* v_head = v + b * vs.s[0] + hk * vs.s[2];
#pragma unroll 4
  for (int64_t j = warp; j < n; j += kDecodeWarps) {
    const T* v_row = v_head + (first + j) * vs.s[1];
    const float p = probs[j];
#pragma unroll
    for (int t = 0; t < DPL; ++t) {
      const int64_t d = lane + 32 * t;
      if (d < dims.D) acc[t] += p * to_f32(v_row[d]);
    }
  }
#pragma unroll
  for (int t = 0; t < DPL; ++t) partial[warp * 32 * DPL + lane + 32 * t] = acc[t];
  __syncthreads();
  for (int64_t d = threadIdx.x; d < dims.D; d += blockDim.x) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) total += partial[w * 32 * DPL + d];
    out_row[d] = from_f32<T>(total);
  }
}

// Split decode for small grids (batch 1): a cluster of kClusterBlocks blocks per (batch, query
// head, query row), each taking a contiguous slice of the visible keys. The blocks exchange their
// maxima, then their sums, through distributed shared memory, so every probability is rounded
// exactly as in the single-block kernel; rank 0 sums the partial output rows.
constexpr int kClusterBlocks = 8;
constexpr int kClusterWarps = 8;
constexpr int64_t kClusterSliceKeys = 1024;  // keys per block: T ≤ 8192

template <class T, int DPL>
__global__ void __cluster_dims__(kClusterBlocks, 1, 1) __launch_bounds__(kClusterWarps * 32)
    attention_decode_cluster_kernel(const T* __restrict__ q, Strides4 qs, const T* __restrict__ k,
                                    Strides4 ks, const T* __restrict__ v, Strides4 vs,
                                    T* __restrict__ out, Strides4 os, Dims dims, Mask mask,
                                    float scale) {
  __shared__ float probs[kClusterSliceKeys];
  __shared__ float partial[kClusterWarps][32 * DPL];
  __shared__ float row_part[32 * DPL];
  __shared__ float scratch[32];
  __shared__ float stats[2];  // this block's max, then its sum of exp(s − global max)
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t h = blockIdx.y, b = blockIdx.z / dims.S, i = blockIdx.z % dims.S;
  const int64_t hk = h / (dims.Hq / dims.Hkv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T* out_row = out + b * os.s[0] + i * os.s[1] + h * os.s[2];

  int64_t first, last;
  visible_keys(mask, dims, b, i, first, last);
  if (first > last) {  // the same for every block of the cluster: all leave before any sync
    if (rank == 0)
      for (int64_t d = threadIdx.x; d < dims.D; d += blockDim.x) out_row[d] = from_f32<T>(0.0f);
    return;
  }
  const int64_t n_all = last - first + 1;
  const int64_t slice = (n_all + kClusterBlocks - 1) / kClusterBlocks;
  const int64_t my_first = first + rank * slice;
  const int64_t n = max(int64_t(0), min(slice, last + 1 - my_first));  // keys of this block

  float qv[DPL];
  const T* q_row = q + b * qs.s[0] + i * qs.s[1] + h * qs.s[2];
#pragma unroll
  for (int t = 0; t < DPL; ++t) {
    const int64_t d = lane + 32 * t;
    qv[t] = d < dims.D ? to_f32(q_row[d]) : 0.0f;
  }
  const T* k_head = k + b * ks.s[0] + hk * ks.s[2];
  for (int64_t j0 = warp * kKeyUnroll; j0 < n; j0 += kClusterWarps * kKeyUnroll) {
    float kv[kKeyUnroll][DPL];
#pragma unroll
    for (int u = 0; u < kKeyUnroll; ++u) {
      const T* k_row = k_head + (my_first + min(j0 + u, n - 1)) * ks.s[1];
#pragma unroll
      for (int t = 0; t < DPL; ++t) {
        const int64_t d = lane + 32 * t;
        kv[u][t] = d < dims.D ? to_f32(k_row[d]) : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kKeyUnroll; ++u) {
      float dot = 0.0f;
#pragma unroll
      for (int t = 0; t < DPL; ++t) dot += qv[t] * kv[u][t];
      dot = warp_sum(dot);
      if (lane == 0 && j0 + u < n) probs[j0 + u] = dot * scale;
    }
  }
  __syncthreads();

  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, probs[j]);
  m = block_max(m, scratch);
  if (threadIdx.x == 0) stats[0] = m;
  cluster.sync();
  m = -INFINITY;
  for (int r = 0; r < kClusterBlocks; ++r) m = fmaxf(m, cluster.map_shared_rank(stats, r)[0]);
  // All scores −inf (only with infinite inputs): every probability becomes 0, as in eager.
  float sum = 0.0f;
  if (m != -INFINITY)
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += expf(probs[j] - m);
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) stats[1] = sum;
  cluster.sync();
  sum = 0.0f;
  for (int r = 0; r < kClusterBlocks; ++r) sum += cluster.map_shared_rank(stats, r)[1];
  const float inv = m == -INFINITY ? 0.0f : 1.0f / sum;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    probs[j] = m == -INFINITY ? 0.0f : round_as<T>(expf(probs[j] - m) * inv);
  __syncthreads();

  float acc[DPL] = {};
  const T* v_head = v + b * vs.s[0] + hk * vs.s[2];
#pragma unroll 4
  for (int64_t j = warp; j < n; j += kClusterWarps) {
    const T* v_row = v_head + (my_first + j) * vs.s[1];
    const float p = probs[j];
#pragma unroll
    for (int t = 0; t < DPL; ++t) {
      const int64_t d = lane + 32 * t;
      if (d < dims.D) acc[t] += p * to_f32(v_row[d]);
    }
  }
#pragma unroll
  for (int t = 0; t < DPL; ++t) partial[warp][lane + 32 * t] = acc[t];
  __syncthreads();
  for (int64_t d = threadIdx.x; d < 32 * DPL; d += blockDim.x) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kClusterWarps; ++w) total += partial[w][d];
    row_part[d] = total;
  }
  cluster.sync();
  if (rank == 0) {
    for (int64_t d = threadIdx.x; d < dims.D; d += blockDim.x) {
      float total = 0.0f;
      for (int r = 0; r < kClusterBlocks; ++r) total += cluster.map_shared_rank(row_part, r)[d];
      out_row[d] = from_f32<T>(total);
    }
  }
  cluster.sync();  // no block may leave while rank 0 still reads its shared memory
}

// Escape hatches for measurements and bisection (read once): HK_ATTENTION_FAST=0 leaves every
// case to the eager kernels, HK_ATTENTION_CLUSTER_DECODE=0 keeps decode on one block per row.
bool env_flag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) != "0" : fallback;
}
bool cluster_decode_enabled() {
  static const bool enabled = env_flag("HK_ATTENTION_CLUSTER_DECODE", true);
  return enabled;
}
bool fast_path_enabled() {
  static const bool enabled = env_flag("HK_ATTENTION_FAST", true);
  return enabled;
}

template <class T, int DPL>
void launch_decode_for(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const Dims& dims, const Mask& mask, float scale,
                       cudaStream_t s) {
  // Too few rows to fill the GPU: split each row's keys over a cluster of blocks.
  if (cluster_decode_enabled() && dims.B * dims.Hq * dims.S < 2 * int64_t(sm_count()) &&
      dims.T <= kClusterBlocks * kClusterSliceKeys) {
    const dim3 grid(kClusterBlocks, static_cast<unsigned>(dims.Hq),
                    static_cast<unsigned>(dims.B * dims.S));
    attention_decode_cluster_kernel<T, DPL><<<grid, kClusterWarps * 32, 0, s>>>(
        q.data_as<T>(), strides4(q), k.data_as<T>(), strides4(k), v.data_as<T>(), strides4(v),
        out.data_as<T>(), strides4(out), dims, mask, scale);
    HK_CUDA_CHECK_LAUNCH();
    return;
  }
  const size_t smem = sizeof(float) * (kDecodeWarps * 32 * DPL + 32 + dims.T);
  const dim3 grid(static_cast<unsigned>(dims.S), static_cast<unsigned>(dims.Hq),
                  static_cast<unsigned>(dims.B));
  attention_decode_kernel<T, DPL><<<grid, kDecodeWarps * 32, smem, s>>>(
      q.data_as<T>(), strides4(q), k.data_as<T>(), strides4(k), v.data_as<T>(), strides4(v),
      out.data_as<T>(), strides4(out), dims, mask, scale);
  HK_CUDA_CHECK_LAUNCH();
}

void launch_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& out, const Dims& dims, const Mask& mask, float scale,
                   cudaStream_t s) {
  dispatch_float(q.dtype, "attention", [&](auto tag) {
    using T = decltype(tag);
    if (dims.D <= 64)
      launch_decode_for<T, 2>(q, k, v, out, dims, mask, scale, s);
    else if (dims.D <= 128)
      launch_decode_for<T, 4>(q, k, v, out, dims, mask, scale, s);
    else
      launch_decode_for<T, 8>(q, k, v, out, dims, mask, scale, s);
  });
}

// ---- prefill ------------------------------------------------------------------------------------
// One GEMM problem covers the query rows [i0, i0 + rows) of every (batch, head) of a batch chunk
// and the keys [0, keys): with causal masking, later keys are invisible to all of these rows.
struct Block {
  int64_t i0, rows, keys;
};

struct PointerArgs {
  const char *q, *k, *v;
  char* out;
  float* scores;
  char* probs;
  int64_t q0, q1, q2, k0, k2, v0, v2, o0, o1, o2;  // byte strides of the batch, seq, head dims
  int64_t Hq, group, mat_stride, elem, batch0, count, i0;  // mat_stride: elements per matrix
};

// Pointer arrays for the batched GEMMs, 6 × count: Q, K, scores, P, V, out.
__global__ void attention_pointers_kernel(PointerArgs a, void** ptrs) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= a.count) return;
  const int64_t b = a.batch0 + idx / a.Hq, h = idx % a.Hq, hk = h / a.group;
  const int64_t n = a.count;
  ptrs[0 * n + idx] = const_cast<char*>(a.q + b * a.q0 + a.i0 * a.q1 + h * a.q2);
  ptrs[1 * n + idx] = const_cast<char*>(a.k + b * a.k0 + hk * a.k2);
  ptrs[2 * n + idx] = a.scores + idx * a.mat_stride;
  ptrs[3 * n + idx] = a.probs + idx * a.mat_stride * a.elem;
  ptrs[4 * n + idx] = const_cast<char*>(a.v + b * a.v0 + hk * a.v2);
  ptrs[5 * n + idx] = a.out + b * a.o0 + a.i0 * a.o1 + h * a.o2;
}

// One warp per score row: P[j] = round(exp(s[j] − max)/sum) over the visible keys, 0 elsewhere.
// Rows are (batch, head, query i0 + r) for r < blk.rows, each blk.keys long.
template <class T>
__global__ void __launch_bounds__(kSoftmaxWarps * 32)
    attention_masked_softmax_kernel(const float* __restrict__ scores, T* __restrict__ probs,
                                    int64_t total_rows, int64_t mat_stride, Block blk, Dims dims,
                                    int64_t batch0, Mask mask) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kSoftmaxWarps + (threadIdx.x >> 5);
  if (row >= total_rows) return;
  const int64_t r = row % blk.rows, i = blk.i0 + r, b = batch0 + row / (blk.rows * dims.Hq);
  const int64_t offset = (row / blk.rows) * mat_stride + r * blk.keys;
  const float* s = scores + offset;
  T* p = probs + offset;
  int64_t first, last;
  visible_keys(mask, dims, b, i, first, last);
  last = min(last, blk.keys - 1);  // never cuts a visible key: blocks cover them (run_prefill)
  // Rows of a multiple of 4 keys start 16-byte aligned (mat_stride is a multiple of 8): move
  // them as float4 / 4-element vectors. Loop bounds may overshoot; each element is masked.
  const bool vec = (blk.keys & 3) == 0;
  MaxSum ms{-INFINITY, 0.0f};
  if (vec) {
    const float4* s4 = reinterpret_cast<const float4*>(s);
    for (int64_t c = first / 4 + lane; c <= last / 4; c += 32) {
      const float4 x = s4[c];
      const float xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (4 * c + e >= first && 4 * c + e <= last) ms = maxsum_add(ms, xs[e]);
    }
  } else {
    for (int64_t j = first + lane; j <= last; j += 32) ms = maxsum_add(ms, s[j]);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, ms.m, o),
                       __shfl_xor_sync(0xffffffffu, ms.s, o)};
    ms = maxsum_merge(ms, other);
  }
  const bool masked = ms.m == -INFINITY;  // fully masked (or only -inf scores): zeros, not NaN
  const float inv = masked ? 0.0f : 1.0f / ms.s;
  if (masked) last = -1;
  if (vec) {
    const float4* s4 = reinterpret_cast<const float4*>(s);
    Vec<T, 4>* p4 = reinterpret_cast<Vec<T, 4>*>(p);
    for (int64_t c = lane; c < blk.keys / 4; c += 32) {
      float xs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (4 * c + 3 >= first && 4 * c <= last) {
        const float4 x = s4[c];
        xs[0] = x.x;
        xs[1] = x.y;
        xs[2] = x.z;
        xs[3] = x.w;
      }
      Vec<T, 4> out;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t j = 4 * c + e;
        out.v[e] = from_f32<T>((j >= first && j <= last) ? expf(xs[e] - ms.m) * inv : 0.0f);
      }
      p4[c] = out;
    }
  } else {
    for (int64_t j = lane; j < blk.keys; j += 32) {
      const float pj = (j >= first && j <= last) ? expf(s[j] - ms.m) * inv : 0.0f;
      p[j] = from_f32<T>(pj);
    }
  }
}

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw RuntimeFailure(std::string("attention: cuBLAS call ") + what + " failed with status " +
                         std::to_string(static_cast<int>(status)) +
                         " (check that the GPU and driver support this dtype and shape)");
}
#define HK_ATTN_CUBLAS_CHECK(call) check_cublas((call), #call)

cudaDataType_t blas_type(DType dt) {
  return dt == DType::BF16 ? CUDA_R_16BF : dt == DType::F16 ? CUDA_R_16F : CUDA_R_32F;
}

// One cuBLAS handle per device, created on first use and kept for the process (leaked on purpose:
// no teardown order issues at exit). The mutex also serialises setStream + the GEMMs that follow.
std::mutex& blas_mutex() {
  static auto* m = new std::mutex();
  return *m;
}
cublasHandle_t blas_handle(int device) {
  static auto* handles = new std::map<int, cublasHandle_t>();
  auto it = handles->find(device);
  if (it != handles->end()) return it->second;
  cublasHandle_t h;
  HK_ATTN_CUBLAS_CHECK(cublasCreate(&h));
  HK_ATTN_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
  handles->emplace(device, h);
  return h;
}

// Leading dimension of the [seq, head_dim] matrix of one (batch, head): the seq stride, or
// head_dim when seq has one row (cuBLAS checks ld ≥ rows even then).
int64_t seq_ld(const TensorView& t) {
  return t.shape[1] > 1 ? t.strides[1] : t.shape[3];
}

// Causal prefill splits the queries into up to kMaxRowBlocks blocks of ≥ kMinBlockRows rows so
// that each block multiplies only the keys some of its rows can see (about 56% of the full
// S × T work with 8 blocks at S = T).
constexpr int64_t kMaxRowBlocks = 8;
constexpr int64_t kMinBlockRows = 128;

void run_prefill(const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& out, const Dims& dims, const Mask& mask, float scale,
                 Stream stream) {
  const cudaStream_t s = native(stream);
  const size_t es = dtype_size(q.dtype);
  const int64_t blocks =
      mask.causal ? std::clamp<int64_t>(dims.S / kMinBlockRows, 1, kMaxRowBlocks) : 1;
  const int64_t block_rows = (dims.S + blocks - 1) / blocks;
  // Each (batch, head) score matrix starts 32-byte aligned: cuBLAS cannot see the alignment of
  // pointer-array operands, and its fast kernels assume it.
  const int64_t mat_stride = (block_rows * dims.T + 7) / 8 * 8;
  const size_t per_batch = size_t(dims.Hq) * size_t(mat_stride) * (sizeof(float) + es);
  const int64_t chunk =
      std::max<int64_t>(1, std::min<int64_t>(dims.B, int64_t(kScoreBudgetBytes / per_batch)));
  const int64_t max_count = chunk * dims.Hq;
  Tensor scores = Tensor::empty({max_count * mat_stride}, DType::F32, q.device, stream);
  Tensor probs = Tensor::empty({max_count * mat_stride}, q.dtype, q.device, stream);
  const int64_t ptr_sets = ((dims.B + chunk - 1) / chunk) * blocks;
  Tensor ptrs = Tensor::empty({ptr_sets * 6 * max_count}, DType::I64, q.device, stream);
  const cudaDataType_t type = blas_type(q.dtype);
  const float zero = 0.0f, one = 1.0f;

  std::lock_guard<std::mutex> lock(blas_mutex());
  cublasHandle_t handle = blas_handle(current_device());
  HK_ATTN_CUBLAS_CHECK(cublasSetStream(handle, s));
  int64_t set = 0;
  for (int64_t b0 = 0; b0 < dims.B; b0 += chunk) {
    const int64_t count = std::min(chunk, dims.B - b0) * dims.Hq;
    for (int64_t i0 = 0; i0 < dims.S; i0 += block_rows, ++set) {
      Block blk{i0, std::min(block_rows, dims.S - i0), dims.T};
      // The last row of the block sees keys ≤ T − S + i0 + rows − 1; a block whose rows see
      // nothing keeps one key, which the softmax masks (its rows become zeros).
      if (mask.causal)
        blk.keys = std::clamp<int64_t>(dims.T - dims.S + i0 + blk.rows, int64_t(1), dims.T);
      void** p = reinterpret_cast<void**>(ptrs.data_as<int64_t>()) + set * 6 * max_count;
      PointerArgs a{static_cast<const char*>(q.ptr()),
                    static_cast<const char*>(k.ptr()),
                    static_cast<const char*>(v.ptr()),
                    static_cast<char*>(out.ptr()),
                    scores.data_as<float>(),
                    static_cast<char*>(probs.view().ptr()),
                    q.strides[0] * int64_t(es),
                    q.strides[1] * int64_t(es),
                    q.strides[2] * int64_t(es),
                    k.strides[0] * int64_t(es),
                    k.strides[2] * int64_t(es),
                    v.strides[0] * int64_t(es),
                    v.strides[2] * int64_t(es),
                    out.strides[0] * int64_t(es),
                    out.strides[1] * int64_t(es),
                    out.strides[2] * int64_t(es),
                    dims.Hq,
                    dims.Hq / dims.Hkv,
                    mat_stride,
                    int64_t(es),
                    b0,
                    count,
                    i0};
      attention_pointers_kernel<<<static_cast<unsigned>((count + 255) / 256), 256, 0, s>>>(a, p);
      HK_CUDA_CHECK_LAUNCH();
      const int n = static_cast<int>(count);
      // Row-major scores [rows, keys] = Q·Kᵀ is column-major scoresᵀ [keys, rows] = (Kᵀ)ᵀ·Qᵀ.
      HK_ATTN_CUBLAS_CHECK(cublasGemmBatchedEx(
          handle, CUBLAS_OP_T, CUBLAS_OP_N, int(blk.keys), int(blk.rows), int(dims.D), &scale,
          p + n, type, int(seq_ld(k)), p, type, int(seq_ld(q)), &zero, p + 2 * n, CUDA_R_32F,
          int(blk.keys), n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      const int64_t rows = count * blk.rows;
      dispatch_float(q.dtype, "attention", [&](auto tag) {
        using T = decltype(tag);
        attention_masked_softmax_kernel<T>
            <<<checked_grid_x((rows + kSoftmaxWarps - 1) / kSoftmaxWarps, "attention"),
               kSoftmaxWarps * 32, 0, s>>>(scores.data_as<float>(), probs.data_as<T>(), rows,
                                           mat_stride, blk, dims, b0, mask);
      });
      HK_CUDA_CHECK_LAUNCH();
      // Row-major out [rows, D] = P [rows, keys]·V [keys, D] is column-major outᵀ = Vᵀ·Pᵀ.
      HK_ATTN_CUBLAS_CHECK(cublasGemmBatchedEx(
          handle, CUBLAS_OP_N, CUBLAS_OP_N, int(dims.D), int(blk.rows), int(blk.keys), &one,
          p + 4 * n, type, int(seq_ld(v)), p + 3 * n, type, int(blk.keys), &zero, p + 5 * n, type,
          int(seq_ld(out)), n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }
}

// ---- eligibility --------------------------------------------------------------------------------
// Every (batch, head) matrix must start 16-byte aligned with 16-byte aligned rows so cuBLAS can use
// its tensor-core kernels on pointer arrays, and the row stride must not overlap a row.
bool gemm_operand_ok(const TensorView& t) {
  const int64_t es = int64_t(dtype_size(t.dtype));
  if (!aligned_to(t.ptr(), 16)) return false;
  for (int d = 0; d < 3; ++d)
    if (t.shape[d] > 1 && (t.strides[d] * es) % 16 != 0) return false;
  return t.shape[1] <= 1 || t.strides[1] >= t.shape[3];
}

bool fits_int(int64_t x) {
  return x >= 0 && x <= int64_t(INT32_MAX);
}

}  // namespace

bool attention_fast_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const AttentionOptions& options, Stream stream) {
  if (!fast_path_enabled()) return false;
  if (q.ndim != 4 || k.ndim != 4 || v.ndim != 4 || out.ndim != 4) return false;
  if (!is_float_dtype(q.dtype) || k.dtype != q.dtype || v.dtype != q.dtype || out.dtype != q.dtype)
    return false;
  const Dims dims{q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3]};
  if (dims.D < 1 || dims.D > kMaxHeadDim || dims.T < 1 || out.numel() == 0) return false;
  if (dims.Hkv < 1 || dims.Hq % dims.Hkv != 0 || v.shape[1] != dims.T || v.shape[2] != dims.Hkv ||
      v.shape[3] != dims.D || k.shape[3] != dims.D || k.shape[0] != dims.B || v.shape[0] != dims.B)
    return false;
  for (const TensorView* t : {&q, &k, &v, &out})
    if (t->strides[3] != 1 || t->device.type != DeviceType::CUDA) return false;

  Mask mask{options.causal, nullptr, false};
  if (options.key_start) {
    const TensorView& ks = *options.key_start;
    if (ks.dtype != DType::I32 && ks.dtype != DType::I64) return false;
    if (ks.ndim != 1 || ks.shape[0] < dims.B || (ks.shape[0] > 1 && ks.strides[0] != 1))
      return false;
    mask.key_start = ks.ptr();
    mask.key_start_i64 = ks.dtype == DType::I64;
  }
  const float scale = options.scale != 0.0f
                          ? options.scale
                          : static_cast<float>(1.0 / std::sqrt(static_cast<double>(dims.D)));

  DeviceGuard guard(q.device);
  if (dims.S <= kDecodeMaxQueries && dims.T <= kDecodeMaxKeys && dims.Hq <= 65535 &&
      dims.B <= 65535) {
    launch_decode(q, k, v, out, dims, mask, scale, native(stream));
    return true;
  }
  for (const TensorView* t : {&q, &k, &v, &out})
    if (!gemm_operand_ok(*t) || !fits_int(seq_ld(*t))) return false;
  if (!fits_int(dims.S) || !fits_int(dims.T) || !fits_int(dims.B * dims.Hq)) return false;
  run_prefill(q, k, v, out, dims, mask, scale, stream);
  return true;
}

}  // namespace hk::ops::cuda
