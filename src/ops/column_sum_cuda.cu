// Column sums over dense rows (see column_sum_cuda.cuh).
#include "ops/column_sum_cuda.cuh"
#include "ops/cuda_common.cuh"

namespace hk::ops::cuda::detail {
namespace {

constexpr int kThreads = 256;

__global__ void column_partial_kernel(ColumnSumTerms t, int64_t rows, int64_t cols,
                                      int64_t rows_per_chunk, float* __restrict__ partial) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  const int64_t r0 = blockIdx.y * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  float acc = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    float v = load_f32(t.a, t.a_dtype, r * t.a_row_stride + c);
    if (t.b) {
      float f = load_f32(t.b, t.b_dtype, r * t.b_row_stride + c);
      if (t.row_scale) f *= t.row_scale[r];
      v *= round_dtype(t.round_dtype, f);
    }
    acc += v;
  }
  partial[blockIdx.y * cols + c] = acc;
}

__global__ void column_finish_kernel(const float* __restrict__ partial, int64_t chunks,
                                     int64_t cols, void* __restrict__ out, DType odt,
                                     int64_t out_stride, bool accumulate) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  float acc = accumulate ? load_f32(out, odt, c * out_stride) : 0.0f;
  for (int64_t k = 0; k < chunks; ++k) acc += partial[k * cols + c];
  store_f32(out, odt, c * out_stride, acc);
}

}  // namespace

void column_sum(const ColumnSumTerms& terms, int64_t rows, int64_t cols, const TensorView& out,
                bool accumulate, Stream stream) {
  if (cols == 0) return;
  require_float("column_sum", out.dtype);
  const cudaStream_t s = native(stream);
  const int64_t col_blocks = (cols + kThreads - 1) / kThreads;
  // Enough chunks to give every SM several blocks, each chunk at least 32 rows.
  int64_t chunks = std::max<int64_t>(
      1, std::min<int64_t>((rows + 31) / 32, (int64_t(sm_count()) * 8) / col_blocks));
  chunks = std::min<int64_t>(chunks, 65535);
  const int64_t rows_per_chunk = rows == 0 ? 1 : (rows + chunks - 1) / chunks;
  chunks = rows == 0 ? 1 : (rows + rows_per_chunk - 1) / rows_per_chunk;
  Tensor partial = Tensor::empty({chunks, cols}, DType::F32, out.device, stream);
  column_partial_kernel<<<dim3(checked_grid_x(col_blocks, "column_sum"), unsigned(chunks)),
                          kThreads, 0, s>>>(terms, rows, cols, rows_per_chunk,
                                            partial.data_as<float>());
  HK_CUDA_CHECK_LAUNCH();
  column_finish_kernel<<<checked_grid_x(col_blocks, "column_sum"), kThreads, 0, s>>>(
      partial.data_as<float>(), chunks, cols, out.ptr(), out.dtype,
      out.ndim ? out.strides[out.ndim - 1] : 1, accumulate);
  HK_CUDA_CHECK_LAUNCH();
}

}  // namespace hk::ops::cuda::detail
