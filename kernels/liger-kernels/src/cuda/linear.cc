// cuda/linear.cc — the linear layer (LigerLinear, linear@1), forward and backward, as cuBLASLt
// GEMMs: y = x·wᵀ + 1·y with y pre-filled with the bias (so the bias joins the f32 accumulation
// before the one rounding), dx = dy·w, dw (+)= dyᵀ·x, db (+)= column sums of dy (linear_bias.cu).
// Host orchestration only; no synchronisation; the first call creates the cuBLASLt handle (so the
// entry does not claim capture). Workspace: the GEMM workspace.
#include "cuda/gemm.h"
#include "liger/cuda_ops.h"

namespace liger::cuda {

size_t linear_workspace_bytes() {
  return kGemmWorkspace;
}

#define LIGER_TRY(x)             \
  do {                           \
    if (int e_ = (x)) return e_; \
  } while (0)

int linear_fwd(const LinearArgs& a, void* stream) {
  const int64_t rows = a.x.rows, k = a.x.cols, n = a.w.rows;
  if (rows == 0 || n == 0) return 0;
  int status = 0;
  void* lt = lt_handle(&status);
  if (!lt) return status;
  float beta = 0.0f;
  if (a.b.data) {
    LIGER_TRY(broadcast_rows(a.b, a.y, stream));
    beta = 1.0f;
  }
  return gemm_rm(lt, false, true, rows, n, k, a.x, a.w, a.y, beta, a.workspace, stream);
}

int linear_bwd(const LinearArgs& a, void* stream) {
  const int64_t rows = a.dy.rows, n = a.dy.cols, k = a.w.cols;
  int status = 0;
  void* lt = lt_handle(&status);
  if (!lt) return status;
  const float wbeta = a.accumulate ? 1.0f : 0.0f;
  if (rows == 0) return 0;  // (weight gradients of an empty batch: left as they are)
  if (a.dx.data)
    LIGER_TRY(gemm_rm(lt, false, false, rows, k, n, a.dy, a.w, a.dx, 0.0f, a.workspace, stream));
  if (a.dw.data)
    LIGER_TRY(gemm_rm(lt, true, false, n, k, rows, a.dy, a.x, a.dw, wbeta, a.workspace, stream));
  if (a.db.data) LIGER_TRY(column_sums(a.dy, a.db, a.accumulate, stream));
  return 0;
}

}  // namespace liger::cuda
