// Internal: deterministic column sums over dense rows, shared by linear_backward (dbias) and
// rms_norm_backward (dweight). Two launches: per-chunk partial sums in f32, then one thread per
// column adds the chunks in order and writes (or accumulates into) the output. No atomics, so
// results are bit-identical run to run.
#pragma once

#include "hk/tensor.h"

namespace hk::ops::cuda::detail {

struct ColumnSumTerms {
  const void* a = nullptr;  // [rows, cols] dense rows, float dtype
  DType a_dtype = DType::F32;
  int64_t a_row_stride = 0;
  // Optional second factor b[r, c] · row_scale[r], rounded to `round_dtype` before multiplying a
  // (the normalised value of RMSNorm). Null = factor 1.
  const void* b = nullptr;
  DType b_dtype = DType::F32;
  int64_t b_row_stride = 0;
  const float* row_scale = nullptr;
  DType round_dtype = DType::F32;
};

// out[c] (+)= Σ_r a[r, c] · factor(r, c). `out` is a 1-D float view of length cols, any stride.
void column_sum(const ColumnSumTerms& terms, int64_t rows, int64_t cols, const TensorView& out,
                bool accumulate, Stream stream);

}  // namespace hk::ops::cuda::detail
