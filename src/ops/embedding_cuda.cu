// CUDA embedding lookup, its backward (scatter-add), and argmax over the last dim.
//
// Lookup: one block per token copies a weight row as raw bytes (16-byte words when the row size
// and addresses allow). Ids outside [0, V) produce a zero row: checking them on the host would
// need a sync. Backward: one block per token atomically adds its gradient row into an f32
// accumulator — dweight itself when it is f32 with dense rows, else an f32 copy of it that is cast
// back at the end (one rounding). Atomic order makes f32 sums run-to-run nondeterministic in the
// last bits, as in PyTorch. argmax: one block per row, NaN counts as the maximum, first index on
// ties.
#include "ops/cuda_common.cuh"
#include "ops/cuda_ops.h"

namespace hk::ops::cuda {
namespace {
using namespace detail;

template <class W>  // W = a word type of 1, 2, 4, 8 or 16 bytes
__global__ void embedding_kernel(const W* __restrict__ weight, int64_t w_rs,
                                 const void* __restrict__ ids, bool ids_i64, int64_t vocab,
                                 W* __restrict__ out, int64_t out_rs, int64_t words) {
  const int64_t token = blockIdx.x;
  const int64_t id = load_index(ids, ids_i64, token);
  W* dst = out + token * out_rs;
  if (id < 0 || id >= vocab) {
    for (int64_t i = threadIdx.x; i < words; i += blockDim.x) dst[i] = W{};
    return;
  }
  const W* src = weight + id * w_rs;
  for (int64_t i = threadIdx.x; i < words; i += blockDim.x) dst[i] = src[i];
}

template <class W>
void launch_embedding(const Rows& rw, const TensorView& ids, const Rows& ro, size_t es,
                      cudaStream_t s) {
  const int64_t k = sizeof(W) / es;  // elements per word
  const int64_t words = rw.cols / k;
  const int threads =
      static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, (words + 31) / 32 * 32)));
  embedding_kernel<W><<<checked_grid_x(ro.rows, "embedding"), threads, 0, s>>>(
      static_cast<const W*>(rw.ptr), rw.row_stride / k, ids.ptr(), ids.dtype == DType::I64, rw.rows,
      static_cast<W*>(ro.ptr), ro.row_stride / k, words);
  HK_CUDA_CHECK_LAUNCH();
}

__global__ void embedding_backward_kernel(const void* __restrict__ dout, DType dodt, int64_t do_rs,
                                          const void* __restrict__ ids, bool ids_i64, int64_t vocab,
                                          float* __restrict__ acc, int64_t acc_rs, int64_t cols) {
  const int64_t token = blockIdx.x;
  const int64_t id = load_index(ids, ids_i64, token);
  if (id < 0 || id >= vocab) return;
  float* dst = acc + id * acc_rs;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    atomicAdd(dst + c, load_f32(dout, dodt, token * do_rs + c));
}

// (value, index) merge: NaN beats numbers, larger beats smaller, lower index wins ties;
// index INT64_MAX marks "nothing yet".
__device__ __forceinline__ void argmax_merge(float& bv, int64_t& bi, float ov, int64_t oi) {
  const bool o_nan = isnan(ov), b_nan = isnan(bv);
  bool take;
  if (oi == INT64_MAX)
    take = false;
  else if (bi == INT64_MAX)
    take = true;
  else if (o_nan != b_nan)
    take = o_nan;
  else if (o_nan || ov == bv)
    take = oi < bi;
  else
    take = ov > bv;
  if (take) {
    bv = ov;
    bi = oi;
  }
}

// Block-wide (value, index) reduction; the result is valid in thread 0.
__device__ void block_argmax(float& best, int64_t& best_i) {
  __shared__ float s_val[32];
  __shared__ int64_t s_idx[32];
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    argmax_merge(best, best_i, ov, oi);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    s_val[warp] = best;
    s_idx[warp] = best_i;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x >> 5;
    best = lane < warps ? s_val[lane] : -INFINITY;
    best_i = lane < warps ? s_idx[lane] : INT64_MAX;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int64_t oi = __shfl_xor_sync(0xffffffffu, best_i, o);
      argmax_merge(best, best_i, ov, oi);
    }
  }
}

// One block per (column chunk, row): a vocabulary-sized row (151,936 logits) is spread over
// many SMs instead of one block reading it alone (0.25 ms per decode step before).
__global__ void argmax_partial_kernel(const void* __restrict__ x, DType xdt, int64_t x_rs,
                                      int64_t cols, int64_t chunk, float* __restrict__ part_val,
                                      int64_t* __restrict__ part_idx) {
  const int64_t row = blockIdx.y;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t end = min(cols, begin + chunk);
  float best = -INFINITY;
  int64_t best_i = INT64_MAX;
  for (int64_t c = begin + threadIdx.x; c < end; c += blockDim.x)
    argmax_merge(best, best_i, load_f32(x, xdt, row * x_rs + c), c);
  block_argmax(best, best_i);
  if (threadIdx.x == 0) {
    part_val[row * gridDim.x + blockIdx.x] = best;
    part_idx[row * gridDim.x + blockIdx.x] = best_i;
  }
}

// Merges the per-chunk winners of each row (chunks in column order, so ties keep the first).
__global__ void argmax_final_kernel(const float* __restrict__ part_val,
                                    const int64_t* __restrict__ part_idx, int64_t splits,
                                    int64_t* __restrict__ out) {
  const int64_t row = blockIdx.x;
  float best = -INFINITY;
  int64_t best_i = INT64_MAX;
  for (int64_t k = threadIdx.x; k < splits; k += blockDim.x)
    argmax_merge(best, best_i, part_val[row * splits + k], part_idx[row * splits + k]);
  block_argmax(best, best_i);
  if (threadIdx.x == 0) out[row] = best_i == INT64_MAX ? 0 : best_i;
}

}  // namespace

void embedding(const TensorView& weight, const TensorView& ids, const TensorView& out,
               Stream stream) {
  if (ids.dtype != DType::I32 && ids.dtype != DType::I64)
    throw InvalidArgument("embedding: ids must be i32 or i64");
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device);
  Tensor keep_w, keep_ids;
  const TensorView wv = dense_rows_input(weight, keep_w, stream);
  const TensorView iv = contiguous_input(ids, keep_ids, stream);
  WritableOutput o(out, false, false, stream);
  const Rows rw = rows_of(wv), ro = rows_of(o.view());
  const size_t es = dtype_size(weight.dtype);
  const cudaStream_t s = native(stream);
  const int64_t row_bytes = rw.cols * int64_t(es);
  auto fits = [&](size_t word) {
    return row_bytes % int64_t(word) == 0 && (rw.row_stride * int64_t(es)) % int64_t(word) == 0 &&
           (ro.row_stride * int64_t(es)) % int64_t(word) == 0 && aligned_to(rw.ptr, word) &&
           aligned_to(ro.ptr, word) && word >= es;
  };
  if (fits(16))
    launch_embedding<uint4>(rw, iv, ro, es, s);
  else if (fits(8))
    launch_embedding<uint2>(rw, iv, ro, es, s);
  else if (fits(4))
    launch_embedding<uint32_t>(rw, iv, ro, es, s);
  else if (fits(2))
    launch_embedding<uint16_t>(rw, iv, ro, es, s);
  else
    launch_embedding<uint8_t>(rw, iv, ro, es, s);
  o.finish(stream);
}

void embedding_backward(const TensorView& dout, const TensorView& ids, const TensorView& dweight,
                        Stream stream) {
  require_float("embedding_backward", dout.dtype);
  require_float("embedding_backward", dweight.dtype);
  if (ids.dtype != DType::I32 && ids.dtype != DType::I64)
    throw InvalidArgument("embedding_backward: ids must be i32 or i64");
  if (dout.numel() == 0) return;
  DeviceGuard guard(dout.device);
  Tensor keep_d, keep_ids, acc;
  const TensorView dv = dense_rows_input(dout, keep_d, stream);
  const TensorView iv = contiguous_input(ids, keep_ids, stream);
  const bool direct = dweight.dtype == DType::F32 && dweight.rows_are_dense();
  TensorView accv = dweight;
  if (!direct) {
    acc = Tensor::empty(dweight.sizes(), DType::F32, dweight.device, stream);
    cast(dweight, acc.view(), stream);
    accv = acc.view();
  }
  const Rows rd = rows_of(dv), ra = rows_of(accv);
  const int threads =
      static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, (rd.cols + 31) / 32 * 32)));
  embedding_backward_kernel<<<checked_grid_x(rd.rows, "embedding_backward"), threads, 0,
                              native(stream)>>>(
      rd.ptr, dout.dtype, rd.row_stride, iv.ptr(), ids.dtype == DType::I64, ra.rows,
      static_cast<float*>(ra.ptr), ra.row_stride, rd.cols);
  HK_CUDA_CHECK_LAUNCH();
  if (!direct) cast(acc.view(), dweight, stream);
}

void argmax(const TensorView& x, const TensorView& out, Stream stream) {
  require_float("argmax", x.dtype);
  if (out.dtype != DType::I64) throw InvalidArgument("argmax: out must be i64");
  if (out.numel() == 0) return;
  DeviceGuard guard(x.device);
  Tensor keep_x;
  const TensorView xv = dense_rows_input(x, keep_x, stream);
  WritableOutput o(out, true, false, stream);
  const Rows rx = rows_of(xv);
  constexpr int64_t kChunk = 4096;
  const int64_t splits = std::max<int64_t>(1, (rx.cols + kChunk - 1) / kChunk);
  if (rx.rows > 65535)
    throw InvalidArgument("argmax: at most 65535 rows on CUDA, got " + std::to_string(rx.rows));
  Tensor part_val = Tensor::empty({rx.rows, splits}, DType::F32, x.device, stream);
  Tensor part_idx = Tensor::empty({rx.rows, splits}, DType::I64, x.device, stream);
  argmax_partial_kernel<<<dim3(static_cast<unsigned>(splits), static_cast<unsigned>(rx.rows)), 256,
                          0, native(stream)>>>(rx.ptr, x.dtype, rx.row_stride, rx.cols, kChunk,
                                               part_val.data_as<float>(),
                                               part_idx.data_as<int64_t>());
  HK_CUDA_CHECK_LAUNCH();
  argmax_final_kernel<<<static_cast<unsigned>(rx.rows), 128, 0, native(stream)>>>(
      part_val.data_as<float>(), part_idx.data_as<int64_t>(), splits,
      o.view().data_as<int64_t>());
  HK_CUDA_CHECK_LAUNCH();
  o.finish(stream);
}

}  // namespace hk::ops::cuda
