// CUDA eager attention (causal, GQA, left-padding mask) and its backward from saved probabilities.
//
// Correct and simple, not fast: the probabilities are materialised as f32 [B, Hq, S, T], exactly
// as eager Transformers does (that is what `probs` returns and backward consumes). Three kernels:
//  - scores: a block takes R query rows of one (batch, head); each warp walks keys, every lane
//    holding a slice of the R query rows in registers, and writes q·k·scale (or dout·v in
//    backward); then one warp per row turns its scores into probabilities (softmax in f32; a fully
//    masked row becomes zeros) or, in backward, into dS = P·(dP − Σ P·dP)·scale;
//  - row sum: out[i] = Σ_j W[i, j]·M[j] (P·V with P rounded to q's dtype, or dS·K for dq);
//  - column sum: out[j] = Σ_{heads of the group, i} W[i, j]·M[i] (dSᵀ·Q for dk, round(P)ᵀ·dO for
//    dv), which also sums the GQA group.
// The forward normally runs both products as batched cuBLASLt GEMMs instead (attention_gemm,
// below); the loop kernels remain its fallback (mixed dtypes, no cuBLASLt algorithm, or
// HK_ATTENTION_NO_GEMM=1) and do the backward.
// Masking: query i (of S) sees keys j ≤ T − S + i when causal, and keys j ≥ key_start[b].
// head_dim ≤ 256. Not here: flash-style tiling, dropout, sliding windows, ALiBi.
#include <cmath>
#include <cstdlib>
#include <string>

#include "ops/attention_fast.h"
#include "ops/cuda_common.cuh"
#include "ops/cuda_ops.h"
#include "ops/gemm_cuda.cuh"

namespace hk::ops::cuda {
namespace {
using namespace detail;

constexpr int kRows = 8;   // query rows (or keys) per block
constexpr int kWarps = 8;  // warps of the scores kernel (one per row in its softmax phase)
constexpr int kMaxHeadDim = 256;

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

__device__ __forceinline__ int64_t key_begin(const Mask& mask, int64_t b) {
  return mask.key_start ? load_index(mask.key_start, mask.key_start_i64, b) : 0;
}
// Last visible key for query i, inclusive (may be < 0).
__device__ __forceinline__ int64_t key_end(const Mask& mask, const Dims& d, int64_t i) {
  return mask.causal ? d.T - d.S + i : d.T - 1;
}

// Forward: W = softmax(scale·A·Kmᵀ) (A = q, Km = k). Backward: W = dS from A = dout, Km = v and
// the saved probabilities P.
template <int DPL>  // head-dim elements per lane
__global__ void __launch_bounds__(kWarps * 32)
    attention_scores_kernel(const void* __restrict__ a, DType adt, Strides4 as,
                            const void* __restrict__ km, DType kdt, Strides4 ks, Dims dims,
                            Mask mask, float scale, const float* __restrict__ probs,
                            float* __restrict__ w) {
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = int64_t(blockIdx.x) * kRows;
  const int64_t hk = h / (dims.Hq / dims.Hkv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool backward = probs != nullptr;

  float av[kRows][DPL];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = i0 + r;
#pragma unroll
    for (int t = 0; t < DPL; ++t) {
      const int64_t d = lane + 32 * t;
      av[r][t] = (i < dims.S && d < dims.D)
                     ? load_f32(a, adt, b * as.s[0] + i * as.s[1] + h * as.s[2] + d * as.s[3])
                     : 0.0f;
    }
  }
  const int64_t begin = key_begin(mask, b);
  const int64_t last_row = min(i0 + kRows, dims.S) - 1;
  const int64_t end_all = key_end(mask, dims, last_row);  // no row of the block sees past this
  const int64_t row_base = ((b * dims.Hq + h) * dims.S) * dims.T;

  for (int64_t j = warp; j < dims.T; j += kWarps) {
    const bool any = j >= begin && j <= end_all;
    float kv[DPL];
#pragma unroll
    for (int t = 0; t < DPL; ++t) {
      const int64_t d = lane + 32 * t;
      kv[t] = (any && d < dims.D)
                  ? load_f32(km, kdt, b * ks.s[0] + j * ks.s[1] + hk * ks.s[2] + d * ks.s[3])
                  : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float dot = 0.0f;
#pragma unroll
      for (int t = 0; t < DPL; ++t) dot += av[r][t] * kv[t];
      dot = warp_sum(dot);
      const int64_t i = i0 + r;
      if (lane == r && i < dims.S) {
        const bool visible = j >= begin && j <= key_end(mask, dims, i);
        float out;
        if (backward)
          out = visible ? dot : 0.0f;  // dP
        else
          out = visible ? dot * scale : -INFINITY;  // scores
        w[row_base + i * dims.T + j] = out;
      }
    }
  }
  __syncthreads();  // the block's global writes are visible to the block after this

  const int64_t i = i0 + warp;
  if (warp >= kRows || i >= dims.S) return;
  float* row = w + row_base + i * dims.T;
  if (backward) {
    const float* p = probs + row_base + i * dims.T;
    float dot = 0.0f;
    for (int64_t j = lane; j < dims.T; j += 32) dot += p[j] * row[j];
    dot = warp_sum(dot);
    for (int64_t j = lane; j < dims.T; j += 32) row[j] = p[j] * (row[j] - dot) * scale;
    return;
  }
  float m = -INFINITY;
  for (int64_t j = lane; j < dims.T; j += 32) m = fmaxf(m, row[j]);
  m = warp_max(m);
  if (m == -INFINITY) {  // fully masked: zeros, not NaN
    for (int64_t j = lane; j < dims.T; j += 32) row[j] = 0.0f;
    return;
  }
  float s = 0.0f;
  for (int64_t j = lane; j < dims.T; j += 32) s += expf(row[j] - m);
  s = warp_sum(s);
  const float inv = 1.0f / s;
  for (int64_t j = lane; j < dims.T; j += 32) row[j] = expf(row[j] - m) * inv;
}

// out[b, i, h, :] = Σ_j W[b, h, i, j]·M[b, j, h/g, :]; W rounded to `round_dt` first when asked.
__global__ void attention_rowsum_kernel(const float* __restrict__ w, bool round_w, DType round_dt,
                                        const void* __restrict__ m, DType mdt, Strides4 ms,
                                        void* __restrict__ out, DType odt, Strides4 os, Dims dims,
                                        Mask mask) {
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = int64_t(blockIdx.x) * kRows;
  const int64_t hk = h / (dims.Hq / dims.Hkv);
  const int64_t d = threadIdx.x;
  const int64_t rows = min(int64_t(kRows), dims.S - i0);
  const int64_t begin = max(int64_t(0), key_begin(mask, b));
  const int64_t end = min(dims.T - 1, key_end(mask, dims, i0 + rows - 1));
  const float* wb = w + ((b * dims.Hq + h) * dims.S + i0) * dims.T;
  float acc[kRows] = {};
  if (d < dims.D) {
    for (int64_t j = begin; j <= end; ++j) {
      const float mv = load_f32(m, mdt, b * ms.s[0] + j * ms.s[1] + hk * ms.s[2] + d * ms.s[3]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r < rows) {
          float wv = wb[r * dims.T + j];
          if (round_w) wv = round_dtype(round_dt, wv);
          acc[r] += wv * mv;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (r < rows)
        store_f32(out, odt, b * os.s[0] + (i0 + r) * os.s[1] + h * os.s[2] + d * os.s[3], acc[r]);
  }
}

// out[b, j, hk, :] = Σ_{h in group hk} Σ_i W[b, h, i, j]·M[b, i, h, :] (W rounded when asked).
__global__ void attention_colsum_kernel(const float* __restrict__ w, bool round_w, DType round_dt,
                                        const void* __restrict__ m, DType mdt, Strides4 ms,
                                        void* __restrict__ out, DType odt, Strides4 os, Dims dims,
                                        Mask mask) {
  const int64_t b = blockIdx.z, hk = blockIdx.y, j0 = int64_t(blockIdx.x) * kRows;
  const int64_t group = dims.Hq / dims.Hkv;
  const int64_t d = threadIdx.x;
  const int64_t keys = min(int64_t(kRows), dims.T - j0);
  // Query i sees key j only when j ≤ T − S + i, i.e. i ≥ j − (T − S).
  const int64_t i_begin = mask.causal ? max(int64_t(0), j0 - (dims.T - dims.S)) : 0;
  float acc[kRows] = {};
  if (d < dims.D) {
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      const float* wb = w + ((b * dims.Hq + h) * dims.S) * dims.T + j0;
      for (int64_t i = i_begin; i < dims.S; ++i) {
        const float mv = load_f32(m, mdt, b * ms.s[0] + i * ms.s[1] + h * ms.s[2] + d * ms.s[3]);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (r < keys) {
            float wv = wb[i * dims.T + r];
            if (round_w) wv = round_dtype(round_dt, wv);
            acc[r] += wv * mv;
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (r < keys)
        store_f32(out, odt, b * os.s[0] + (j0 + r) * os.s[1] + hk * os.s[2] + d * os.s[3], acc[r]);
  }
}

// GEMM path, step 2: scores (already scaled) → probabilities in place, one block per query row
// (b, h, i) of the [B, Hq, S, T] buffer; masked keys get 0, a fully masked row all zeros. Also
// writes the probabilities rounded to q's dtype (p16, same layout) for the P·V product.
__global__ void attention_softmax_kernel(float* __restrict__ w, void* __restrict__ p16,
                                         DType p16_dtype, Dims dims, Mask mask) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t i = row % dims.S, b = row / (dims.S * dims.Hq);
  const int64_t begin = max(int64_t(0), key_begin(mask, b));
  const int64_t end = min(dims.T - 1, key_end(mask, dims, i));  // inclusive
  float* r = w + row * dims.T;
  float m = -INFINITY;
  for (int64_t j = begin + threadIdx.x; j <= end; j += blockDim.x) m = fmaxf(m, r[j]);
  m = block_max(m, scratch);
  float sum = 0.0f;
  if (m != -INFINITY)
    for (int64_t j = begin + threadIdx.x; j <= end; j += blockDim.x) sum += expf(r[j] - m);
  sum = block_sum(sum, scratch);
  const float inv = m == -INFINITY ? 0.0f : 1.0f / sum;
  for (int64_t j = threadIdx.x; j < dims.T; j += blockDim.x) {
    const float p = (j >= begin && j <= end && m != -INFINITY) ? expf(r[j] - m) * inv : 0.0f;
    r[j] = p;
    store_f32(p16, p16_dtype, row * dims.T + j, p);
  }
}

// A [B, S, Hq, D] view seen as [B, S, Hkv, group, D] (the query heads of one kv head adjacent).
TensorView split_heads(const TensorView& q, int64_t hkv) {
  const int64_t group = q.shape[2] / hkv;
  TensorView v = q;
  v.ndim = 5;
  v.shape[0] = q.shape[0];
  v.shape[1] = q.shape[1];
  v.shape[2] = hkv;
  v.shape[3] = group;
  v.shape[4] = q.shape[3];
  v.strides[0] = q.strides[0];
  v.strides[1] = q.strides[1];
  v.strides[2] = q.strides[2] * group;
  v.strides[3] = q.strides[2];
  v.strides[4] = q.strides[3];
  return v;
}

bool gemm_attention_disabled() {
  const char* e = std::getenv("HK_ATTENTION_NO_GEMM");
  return e && std::string(e) == "1";
}

// Eager attention with both products on cuBLASLt (tensor cores for bf16/f16):
//  1. q → [B, Hkv, group, S, D], k and v → [B, Hkv, T, D] (contiguous copies);
//  2. scores = scale·q·kᵀ, f32, batched over (b, kv head): the M = group·S rows of one kv head
//     land exactly in the [B, Hq, S, T] probability layout (h = hk·group + r);
//  3. masked softmax in place (f32) + a copy rounded to q's dtype;
//  4. out = round(P)·v in q's dtype, then permuted back to [B, S, Hq, D].
// Same math as the loop kernels (f32 scores and softmax, probabilities rounded before P·V, f32
// accumulation); only summation order differs.
void attention_gemm(const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& out, const Dims& d, const Mask& mask, float scale, float* w,
                    Stream stream) {
  const DType dt = q.dtype;
  const int64_t group = d.Hq / d.Hkv;
  Tensor qg = Tensor::empty({d.B, d.Hkv, group, d.S, d.D}, dt, q.device, stream);
  copy_view(qg.view(), split_heads(q, d.Hkv).permute({0, 2, 3, 1, 4}), stream);
  Tensor kt = Tensor::empty({d.B, d.Hkv, d.T, d.D}, dt, q.device, stream);
  copy_view(kt.view(), k.permute({0, 2, 1, 3}), stream);
  Tensor vt = Tensor::empty({d.B, d.Hkv, d.T, d.D}, dt, q.device, stream);
  copy_view(vt.view(), v.permute({0, 2, 1, 3}), stream);
  const int64_t M = group * d.S;
  gemm_strided_batched(dt, DType::F32, d.B * d.Hkv, M, d.T, d.D, qg.view().ptr(), d.D, M * d.D,
                       kt.view().ptr(), d.D, d.T * d.D, /*trans_b=*/true, w, d.T, M * d.T, scale,
                       0.0f, stream);
  Tensor p16 = Tensor::empty({d.B, d.Hq, d.S, d.T}, dt, q.device, stream);
  attention_softmax_kernel<<<checked_grid_x(d.B * d.Hq * d.S, "attention"), 256, 0,
                             native(stream)>>>(w, p16.view().ptr(), dt, d, mask);
  HK_CUDA_CHECK_LAUNCH();
  Tensor og = Tensor::empty({d.B, d.Hkv, group, d.S, d.D}, dt, q.device, stream);
  gemm_strided_batched(dt, dt, d.B * d.Hkv, M, d.D, d.T, p16.view().ptr(), d.T, M * d.T,
                       vt.view().ptr(), d.D, d.T * d.D, /*trans_b=*/false, og.view().ptr(), d.D,
                       M * d.D, 1.0f, 0.0f, stream);
  copy_view(split_heads(out, d.Hkv).permute({0, 2, 3, 1, 4}), og.view(), stream);
}

Dims dims_of(const TensorView& q, const TensorView& k) {
  return {q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3]};
}

void check_shapes(const char* op, const TensorView& q, const TensorView& k, const TensorView& v) {
  if (q.ndim != 4 || k.ndim != 4 || v.ndim != 4)
    throw InvalidArgument(std::string(op) + ": q, k, v must be [batch, seq, heads, head_dim]");
  for (const TensorView* t : {&q, &k, &v}) require_float(op, t->dtype);
  if (q.shape[3] > kMaxHeadDim)
    throw Unsupported(std::string(op) + ": head_dim " + std::to_string(q.shape[3]) +
                      " > 256 is not supported by the built-in CUDA attention");
  if (k.shape[2] == 0 || q.shape[2] % k.shape[2] != 0)
    throw InvalidArgument(std::string(op) + ": query heads must be a multiple of kv heads");
}

Mask mask_of(const AttentionOptions& options, Tensor& keep, Stream stream) {
  Mask mask{options.causal, nullptr, false};
  if (options.key_start) {
    const TensorView ks = contiguous_input(*options.key_start, keep, stream);
    if (ks.dtype != DType::I32 && ks.dtype != DType::I64)
      throw InvalidArgument("attention: key_start must be i32 or i64");
    mask.key_start = ks.ptr();
    mask.key_start_i64 = ks.dtype == DType::I64;
  }
  return mask;
}

float scale_of(const AttentionOptions& options, int64_t head_dim) {
  return options.scale != 0.0f ? options.scale
                               : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

void launch_scores(const TensorView& a, const TensorView& km, const Dims& dims, const Mask& mask,
                   float scale, const float* probs, float* w, cudaStream_t s) {
  const dim3 grid(checked_grid_x((dims.S + kRows - 1) / kRows, "attention"),
                  static_cast<unsigned>(dims.Hq), static_cast<unsigned>(dims.B));
  const Strides4 as = strides4(a), ks = strides4(km);
  if (dims.D <= 64)
    attention_scores_kernel<2><<<grid, kWarps * 32, 0, s>>>(
        a.ptr(), a.dtype, as, km.ptr(), km.dtype, ks, dims, mask, scale, probs, w);
  else if (dims.D <= 128)
    attention_scores_kernel<4><<<grid, kWarps * 32, 0, s>>>(
        a.ptr(), a.dtype, as, km.ptr(), km.dtype, ks, dims, mask, scale, probs, w);
  else
    attention_scores_kernel<8><<<grid, kWarps * 32, 0, s>>>(
        a.ptr(), a.dtype, as, km.ptr(), km.dtype, ks, dims, mask, scale, probs, w);
  HK_CUDA_CHECK_LAUNCH();
}

int head_threads(int64_t D) {
  return static_cast<int>(std::max<int64_t>(32, (D + 31) / 32 * 32));
}

void launch_rowsum(const float* w, bool round_w, DType round_dt, const TensorView& m,
                   const TensorView& out, const Dims& dims, const Mask& mask, cudaStream_t s) {
  const dim3 grid(checked_grid_x((dims.S + kRows - 1) / kRows, "attention"),
                  static_cast<unsigned>(dims.Hq), static_cast<unsigned>(dims.B));
  attention_rowsum_kernel<<<grid, head_threads(dims.D), 0, s>>>(
      w, round_w, round_dt, m.ptr(), m.dtype, strides4(m), out.ptr(), out.dtype, strides4(out),
      dims, mask);
  HK_CUDA_CHECK_LAUNCH();
}

void launch_colsum(const float* w, bool round_w, DType round_dt, const TensorView& m,
                   const TensorView& out, const Dims& dims, const Mask& mask, cudaStream_t s) {
  const dim3 grid(checked_grid_x((dims.T + kRows - 1) / kRows, "attention"),
                  static_cast<unsigned>(dims.Hkv), static_cast<unsigned>(dims.B));
  attention_colsum_kernel<<<grid, head_threads(dims.D), 0, s>>>(
      w, round_w, round_dt, m.ptr(), m.dtype, strides4(m), out.ptr(), out.dtype, strides4(out),
      dims, mask);
  HK_CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const AttentionOptions& options, const TensorView* probs, Stream stream) {
  check_shapes("attention", q, k, v);
  require_float("attention", out.dtype);
  const Dims dims = dims_of(q, k);
  if (out.numel() == 0) return;
  DeviceGuard guard(q.device);
  const cudaStream_t s = native(stream);
  if (!probs && attention_fast_forward(q, k, v, out, options, stream)) return;
  Tensor keep_mask, w_tmp;
  const Mask mask = mask_of(options, keep_mask, stream);
  float* w;
  if (probs && probs->dtype == DType::F32 && probs->is_contiguous()) {
    w = probs->data_as<float>();
  } else {
    w_tmp = Tensor::empty({dims.B, dims.Hq, dims.S, dims.T}, DType::F32, q.device, stream);
    w = w_tmp.data_as<float>();
  }
  if (dims.T == 0) {
    fill(out, 0.0, stream);
    return;
  }
  const bool one_dtype = k.dtype == q.dtype && v.dtype == q.dtype && out.dtype == q.dtype;
  bool done = false;
  if (one_dtype && !gemm_attention_disabled()) {
    try {
      attention_gemm(q, k, v, out, dims, mask, scale_of(options, dims.D), w, stream);
      done = true;
    } catch (const Unsupported&) {
      // cuBLASLt had no algorithm for these strides/alignment: the loop kernels below recompute
      // the probabilities and the output from scratch, with the same math.
    }
  }
  if (!done) {
    launch_scores(q, k, dims, mask, scale_of(options, dims.D), nullptr, w, s);
    launch_rowsum(w, true, q.dtype, v, out, dims, mask, s);
  }
  if (w_tmp.defined() && probs) cast(w_tmp.view(), *probs, stream);
}

void attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& probs, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv, const AttentionOptions& options,
                        Stream stream) {
  check_shapes("attention_backward", q, k, v);
  for (const TensorView* t : {&dout, &dq, &dk, &dv}) require_float("attention_backward", t->dtype);
  const Dims dims = dims_of(q, k);
  DeviceGuard guard(q.device);
  const cudaStream_t s = native(stream);
  if (dims.S == 0 || dims.T == 0 || dims.B == 0) {
    if (dq.numel()) fill(dq, 0.0, stream);
    if (dk.numel()) fill(dk, 0.0, stream);
    if (dv.numel()) fill(dv, 0.0, stream);
    return;
  }
  Tensor keep_mask, keep_p, ds;
  const Mask mask = mask_of(options, keep_mask, stream);
  const float* p;
  if (probs.dtype == DType::F32 && probs.is_contiguous()) {
    p = probs.data_as<float>();
  } else {
    keep_p = Tensor::empty({dims.B, dims.Hq, dims.S, dims.T}, DType::F32, q.device, stream);
    cast(probs, keep_p.view(), stream);
    p = keep_p.data_as<float>();
  }
  ds = Tensor::empty({dims.B, dims.Hq, dims.S, dims.T}, DType::F32, q.device, stream);
  float* dsp = ds.data_as<float>();
  launch_scores(dout, v, dims, mask, scale_of(options, dims.D), p, dsp, s);
  launch_rowsum(dsp, false, q.dtype, k, dq, dims, mask, s);
  launch_colsum(dsp, false, q.dtype, q, dk, dims, mask, s);
  launch_colsum(p, true, q.dtype, dout, dv, dims, mask, s);
}

}  // namespace hk::ops::cuda
