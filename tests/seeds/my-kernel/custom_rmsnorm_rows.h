// custom_rmsnorm_rows.h — the checked arguments of one CustomRMSNorm call (plain data, so the .cu
// file needs no SDK header).
#pragma once

#include <cstdint>

namespace custom_rmsnorm {

struct Rows {
  const void* x;
  const void* scale;
  void* y;
  int64_t rows, hidden, x_stride, y_stride;  // strides in elements
  int32_t dtype;                             // HK_DTYPE_F32 / _BF16 / _F16
  float eps;
};

// Queues the cuda kernel on `stream`; returns the cudaError_t of the launch (0 = success).
int launch_cuda(const Rows& r, void* stream);

}  // namespace custom_rmsnorm
