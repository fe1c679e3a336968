// cuda/linear_bias.cu — the two bias helpers of the linear layer (cuda/linear.cc): broadcasting
// the bias into every row of y before the GEMM adds to it, and the bias gradient as column sums
// of dy (f32, one thread per column walking the rows: biases are rare and small, so simple wins).
#include "cuda/common.cuh"
#include "liger/cuda_ops.h"

namespace liger::cuda {
namespace {

__global__ void broadcast_rows_kernel(const void* __restrict__ b, Dt bdt, void* __restrict__ y,
                                      Dt ydt, int64_t rows, int64_t cols, int64_t row_stride) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    store_dt(y, ydt, r * row_stride + c, load_dt(b, bdt, c));
  }
}

__global__ void column_sums_kernel(const void* __restrict__ dy, Dt dt, int64_t rows, int64_t cols,
                                   int64_t row_stride, void* __restrict__ db, Dt dbdt,
                                   bool accumulate) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  float sum = accumulate ? load_dt(db, dbdt, c) : 0.0f;
  for (int64_t r = 0; r < rows; ++r) sum += load_dt(dy, dt, r * row_stride + c);
  store_dt(db, dbdt, c, sum);
}

int grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

}  // namespace

int broadcast_rows(const Vec& b, const Rows& y, void* stream) {
  if (y.rows == 0 || y.cols == 0) return 0;
  broadcast_rows_kernel<<<grid_for(y.rows * y.cols, 256), 256, 0,
                          static_cast<cudaStream_t>(stream)>>>(b.data, b.dt, y.data, y.dt, y.rows,
                                                               y.cols, y.row_stride);
  return last_error();
}

int column_sums(const Rows& dy, const Vec& db, bool accumulate, void* stream) {
  if (dy.cols == 0) return 0;
  column_sums_kernel<<<grid_for(dy.cols, 128), 128, 0, static_cast<cudaStream_t>(stream)>>>(
      dy.data, dy.dt, dy.rows, dy.cols, dy.row_stride, db.data, db.dt, accumulate);
  return last_error();
}

}  // namespace liger::cuda
