// cuda/gemm.h — internal: cuBLASLt GEMMs for the liger cuda variant (no CUDA types here).
#pragma once

#include <cstddef>
#include <cstdint>

#include "liger/args.h"

namespace liger::cuda {

inline constexpr size_t kGemmWorkspace = size_t{32} << 20;  // bytes handed to cuBLASLt

// The cuBLASLt handle of the current device (created on first use; not capture-safe then).
// Null on failure, with *status set to the negated cublasStatus_t.
void* lt_handle(int* status);

// Column-major D = op(A)·op(B) + beta·D (m×n, inner k), f32 accumulation.
struct Gemm {
  bool ta, tb;
  int64_t m, n, k;
  const void* a;
  Dt a_dt;
  int64_t lda;
  const void* b;
  Dt b_dt;
  int64_t ldb;
  void* c;
  Dt c_dt;
  int64_t ldc;
  float beta;
};
int run_gemm(void* handle, const Gemm& g, void* ws, void* stream);

// Row-major C[m, n] = op(A)[m, k] · op(B)[k, n] + beta·C (op = transpose when ta / tb; A, B, C
// as Rows with their row strides).
int gemm_rm(void* handle, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const Rows& a,
            const Rows& b, const Rows& c, float beta, void* ws, void* stream);

}  // namespace liger::cuda
