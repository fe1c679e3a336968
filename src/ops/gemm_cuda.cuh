// Internal: a strided-batched GEMM on raw row-major operands through the same cuBLASLt plans as
// matmul (matmul_cuda.cu), for ops that lay out their own operands (the eager attention).
#pragma once

#include "hk/dtype.h"
#include "hk/stream.h"

namespace hk::ops::cuda::detail {

// For each of `batch` problems: C (M×N, row stride ldc) = alpha·A·op(B) + beta·C, with A M×K
// row-major (row stride lda) and B K×N row-major, or N×K row-major when `trans_b`. Batch strides
// in elements. A and B share `ab_dtype` (f32/bf16/f16); C is `c_dtype` (the same, or f32).
// f32 accumulation. Enqueued on `stream`; no host sync.
void gemm_strided_batched(DType ab_dtype, DType c_dtype, int64_t batch, int64_t M, int64_t N,
                          int64_t K, const void* A, int64_t lda, int64_t stride_a, const void* B,
                          int64_t ldb, int64_t stride_b, bool trans_b, void* C, int64_t ldc,
                          int64_t stride_c, float alpha, float beta, Stream stream);

}  // namespace hk::ops::cuda::detail
