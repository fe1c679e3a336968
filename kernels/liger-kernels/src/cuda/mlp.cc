// cuda/mlp.cc — the gated MLP (SwiGLU / GeGLU with its three projections), forward and backward:
// cuBLASLt GEMMs around the fused gated-activation kernels (cuda/activation.cu), intermediates in
// the caller's workspace. Host orchestration only; no synchronisation; the first call creates the
// cuBLASLt handle (so the entries using this do not claim capture).
//
// Workspace: forward g, u [rows, I] (h overwrites g), or h alone when the caller keeps g and u
// (MlpArgs::gate/up); backward h, dh, plus g, u unless the forward's are given; + the GEMM
// workspace.
#include "cuda/gemm.h"
#include "liger/cuda_ops.h"

namespace liger::cuda {
namespace {

size_t align256(size_t v) {
  return (v + 255) / 256 * 256;
}

Rows carve(char*& at, int64_t rows, int64_t cols, Dt dt) {
  Rows r{at, rows, cols, cols, dt};
  at += align256(static_cast<size_t>(rows * cols) * dt_size(dt));
  return r;
}

}  // namespace

size_t mlp_workspace_bytes(int64_t rows, int64_t intermediate, Dt dt, bool backward,
                           bool saved_gate_up) {
  const int buffers = backward ? (saved_gate_up ? 2 : 4) : (saved_gate_up ? 1 : 2);
  return buffers * align256(static_cast<size_t>(rows * intermediate) * dt_size(dt)) +
         kGemmWorkspace;
}

#define LIGER_TRY(x)             \
  do {                           \
    if (int e_ = (x)) return e_; \
  } while (0)

int mlp_fwd(const MlpArgs& a, void* stream) {
  const int64_t rows = a.x.rows, h = a.x.cols, inter = a.gate_w.rows;
  if (rows == 0) return 0;
  int status = 0;
  void* lt = lt_handle(&status);
  if (!lt) return status;
  char* at = static_cast<char*>(a.workspace);
  const bool keep = a.gate.data != nullptr;
  const Rows g = keep ? a.gate : carve(at, rows, inter, a.x.dt);
  const Rows u = keep ? a.up : carve(at, rows, inter, a.x.dt);
  const Rows hh = keep ? carve(at, rows, inter, a.x.dt) : g;  // h overwrites a scratch g
  void* ws = at;
  LIGER_TRY(gemm_rm(lt, false, true, rows, inter, h, a.x, a.gate_w, g, 0.0f, ws, stream));
  LIGER_TRY(gemm_rm(lt, false, true, rows, inter, h, a.x, a.up_w, u, 0.0f, ws, stream));
  GatedAct act;
  act.act = a.act, act.gate = g, act.up = u, act.out = hh;
  LIGER_TRY(gated_act_fwd(act, stream));
  return gemm_rm(lt, false, true, rows, h, inter, hh, a.down_w, a.y, 0.0f, ws, stream);
}

int mlp_bwd(const MlpArgs& a, void* stream) {
  const int64_t rows = a.x.rows, h = a.x.cols, inter = a.gate_w.rows;
  int status = 0;
  void* lt = lt_handle(&status);
  if (!lt) return status;
  const float wbeta = a.accumulate ? 1.0f : 0.0f;
  if (rows == 0) return 0;  // (weight gradients of an empty batch: left as they are)
  char* at = static_cast<char*>(a.workspace);
  const bool saved = a.gate.data != nullptr;
  const Rows g = saved ? a.gate : carve(at, rows, inter, a.x.dt);
  const Rows u = saved ? a.up : carve(at, rows, inter, a.x.dt);
  const Rows hh = carve(at, rows, inter, a.x.dt), dh = carve(at, rows, inter, a.x.dt);
  void* ws = at;
  if (!saved) {
    LIGER_TRY(gemm_rm(lt, false, true, rows, inter, h, a.x, a.gate_w, g, 0.0f, ws, stream));
    LIGER_TRY(gemm_rm(lt, false, true, rows, inter, h, a.x, a.up_w, u, 0.0f, ws, stream));
  }
  GatedAct act;
  act.act = a.act, act.gate = g, act.up = u, act.out = hh;
  LIGER_TRY(gated_act_fwd(act, stream));
  LIGER_TRY(gemm_rm(lt, false, false, rows, inter, h, a.dy, a.down_w, dh, 0.0f, ws, stream));
  if (a.ddown_w.data)
    LIGER_TRY(gemm_rm(lt, true, false, h, inter, rows, a.dy, hh, a.ddown_w, wbeta, ws, stream));
  act.dout = dh, act.dgate = g, act.dup = u;  // in place: g ← dg, u ← du
  LIGER_TRY(gated_act_bwd(act, stream));
  LIGER_TRY(gemm_rm(lt, false, false, rows, h, inter, g, a.gate_w, a.dx, 0.0f, ws, stream));
  LIGER_TRY(gemm_rm(lt, false, false, rows, h, inter, u, a.up_w, a.dx, 1.0f, ws, stream));
  if (a.dgate_w.data)
    LIGER_TRY(gemm_rm(lt, true, false, inter, h, rows, g, a.x, a.dgate_w, wbeta, ws, stream));
  if (a.dup_w.data)
    LIGER_TRY(gemm_rm(lt, true, false, inter, h, rows, u, a.x, a.dup_w, wbeta, ws, stream));
  return 0;
}

}  // namespace liger::cuda
