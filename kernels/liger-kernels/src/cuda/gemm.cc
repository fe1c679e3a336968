// cuda/gemm.cc — the one cuBLASLt matmul helper of the liger cuda variant (used by the fused
// linear cross-entropy and the gated MLP): f32 accumulation, the heuristic's first algorithm,
// the caller's workspace, one handle per device created on first use.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "cuda/gemm.h"

namespace liger::cuda {
namespace {
cudaDataType_t cuda_type(Dt dt) {
  return dt == Dt::F32 ? CUDA_R_32F : dt == Dt::BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

// Largest power of two (≤ 256) dividing the address.
uint32_t alignment(const void* p) {
  uint32_t a = 256;
  while (a > 1 && (reinterpret_cast<uintptr_t>(p) % a) != 0) a >>= 1;
  return a;
}

}  // namespace

// One handle per device for the life of the process (cuBLASLt handles are thread-safe).
void* lt_handle(int* status) {
  static std::mutex mu;
  static cublasLtHandle_t handles[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) dev = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (!handles[dev]) {
    cublasStatus_t st = cublasLtCreate(&handles[dev]);
    if (st != CUBLAS_STATUS_SUCCESS) {
      *status = -static_cast<int>(st);
      handles[dev] = nullptr;
    }
  }
  return handles[dev];
}

// Column-major D = op(A)·op(B) + beta·D with f32 accumulation (the caller maps row-major
// operands onto this by swapping roles).
int run_gemm(void* handle, const Gemm& g, void* ws, void* stream) {
  const auto h = static_cast<cublasLtHandle_t>(handle);
  const auto s = static_cast<cudaStream_t>(stream);
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasStatus_t st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  auto fail = [&](cublasStatus_t e) {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return e == CUBLAS_STATUS_SUCCESS ? 0 : -static_cast<int>(e);
  };
  if (st) return fail(st);
  const cublasOperation_t ta = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                          tb = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  // Stored shapes: A is m×k (k×m when transposed), B is k×n (n×k when transposed).
  if ((st = cublasLtMatrixLayoutCreate(&la, cuda_type(g.a_dt), g.ta ? g.k : g.m, g.ta ? g.m : g.k,
                                       g.lda)))
    return fail(st);
  if ((st = cublasLtMatrixLayoutCreate(&lb, cuda_type(g.b_dt), g.tb ? g.n : g.k, g.tb ? g.k : g.n,
                                       g.ldb)))
    return fail(st);
  if ((st = cublasLtMatrixLayoutCreate(&lc, cuda_type(g.c_dt), g.m, g.n, g.ldc))) return fail(st);
  if ((st = cublasLtMatmulPreferenceCreate(&pref))) return fail(st);
  size_t ws_bytes = kGemmWorkspace;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                       sizeof(ws_bytes));
  // The heuristic assumes 256-byte aligned operands unless told otherwise; chunk slices of a
  // padded matrix may be less aligned, so state each pointer's real alignment.
  const uint32_t align_a = alignment(g.a), align_b = alignment(g.b), align_c = alignment(g.c);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                       sizeof(align_a));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                       sizeof(align_b));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                       sizeof(align_c));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                       sizeof(align_c));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  st = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &heur, &found);
  if (st) return fail(st);
  if (found == 0) return fail(CUBLAS_STATUS_NOT_SUPPORTED);
  const float alpha = 1.0f;
  st = cublasLtMatmul(h, op, &alpha, g.a, la, g.b, lb, &g.beta, g.c, lc, g.c, lc, &heur.algo, ws,
                      kGemmWorkspace, s);
  return fail(st);
}

int gemm_rm(void* handle, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const Rows& a,
            const Rows& b, const Rows& c, float beta, void* ws, void* stream) {
  // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: swap the operands.
  const Gemm g{
      tb,   ta,           n,   m, k, b.data, b.dt, b.row_stride, a.data, a.dt, a.row_stride, c.data,
      c.dt, c.row_stride, beta};
  return run_gemm(handle, g, ws, stream);
}

}  // namespace liger::cuda
