// cuda/mlp.cc — the gated MLP (SwiGLU / GeGLU with its three projections), forward and backward:
// cuBLASLt GEMMs around the fused gated-activation kernels (cuda/activation.cu), intermediates in
// the caller's workspace; and the fused RMSNorm → gated MLP (args.h RmsNormMlpArgs), whose
// forward runs the norm kernel, one GEMM over the concatenated gate_up weight, the gated
// activation in place over the gate half and the down GEMM (no separate gate and up GEMMs, and
// the normalised rows are read by one GEMM instead of two). Host orchestration only; no
// synchronisation; the first call creates the cuBLASLt handle (so the entries using this do not
// claim capture).
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

size_t rms_norm_mlp_workspace_bytes(int64_t rows, int64_t hidden, int64_t intermediate, Dt dt,
                                    bool backward) {
  const size_t normed = align256(static_cast<size_t>(rows * hidden) * dt_size(dt));
  const size_t inter = align256(static_cast<size_t>(rows * intermediate) * dt_size(dt));
  // forward: n, then gu [rows, 2I] (or, when the caller keeps gu, h [rows, I] in its place)
  if (!backward) return normed + 2 * inter + kGemmWorkspace;
  // backward: n, dn, rstd, gu (unless kept), h, dh, the GEMM's, then the norm backward's scratch
  return 2 * normed + align256(static_cast<size_t>(rows) * sizeof(float)) + 4 * inter +
         kGemmWorkspace + align256(rms_norm_bwd_workspace_bytes(rows, hidden));
}

namespace {
// The gated activation over the gate and up column blocks of gu [rows, 2I].
GatedAct gated_halves(const RmsNormMlpArgs& a, const Rows& gu) {
  GatedAct act;
  act.act = a.act;
  act.gate = col_half(gu, false), act.up = col_half(gu, true);
  return act;
}
}  // namespace

int rms_norm_mlp_fwd(const RmsNormMlpArgs& a, void* stream) {
  const int64_t rows = a.x.rows, h = a.x.cols, inter = a.down_w.cols;
  if (rows == 0) return 0;
  int status = 0;
  void* lt = lt_handle(&status);
  if (!lt) return status;
  char* at = static_cast<char*>(a.workspace);
  const Rows n = carve(at, rows, h, a.x.dt);
  const bool keep = a.gate_up.data != nullptr;
  const Rows gu = keep ? a.gate_up : carve(at, rows, 2 * inter, a.x.dt);
  GatedAct act = gated_halves(a, gu);
  act.out = keep ? carve(at, rows, inter, a.x.dt) : act.gate;  // h overwrites a scratch gate half
  void* ws = at;
  LIGER_TRY(rms_norm_fwd(norm_of(a, n, a.rstd), stream));
  LIGER_TRY(gemm_rm(lt, false, true, rows, 2 * inter, h, n, a.gate_up_w, gu, 0.0f, ws, stream));
  LIGER_TRY(gated_act_fwd(act, stream));
  return gemm_rm(lt, false, true, rows, h, inter, act.out, a.down_w, a.y, 0.0f, ws, stream);
}

// Four GEMMs with a kept gu (five without): dh, d(down), dn and d(gate_up) — against six (eight)
// for the unfused MLP's separate gate and up projections.
int rms_norm_mlp_bwd(const RmsNormMlpArgs& a, void* stream) {
  const int64_t rows = a.x.rows, h = a.x.cols, inter = a.down_w.cols;
  int status = 0;
  void* lt = lt_handle(&status);
  if (!lt) return status;
  if (rows == 0) return 0;  // (weight gradients of an empty batch: left as they are)
  const float wbeta = a.accumulate ? 1.0f : 0.0f;
  char* at = static_cast<char*>(a.workspace);
  const Rows n = carve(at, rows, h, a.x.dt), dn = carve(at, rows, h, a.x.dt);
  float* rstd = reinterpret_cast<float*>(at);
  at += align256(static_cast<size_t>(rows) * sizeof(float));
  const bool kept = a.gate_up.data != nullptr;
  const Rows gu = kept ? a.gate_up : carve(at, rows, 2 * inter, a.x.dt);
  const Rows hh = carve(at, rows, inter, a.x.dt), dh = carve(at, rows, inter, a.x.dt);
  void* ws = at;
  at += kGemmWorkspace;
  LIGER_TRY(rms_norm_fwd(norm_of(a, n, rstd), stream));
  if (!kept)
    LIGER_TRY(gemm_rm(lt, false, true, rows, 2 * inter, h, n, a.gate_up_w, gu, 0.0f, ws, stream));
  GatedAct act = gated_halves(a, gu);
  act.out = hh;
  LIGER_TRY(gated_act_fwd(act, stream));
  LIGER_TRY(gemm_rm(lt, false, false, rows, inter, h, a.dy, a.down_w, dh, 0.0f, ws, stream));
  if (a.ddown_w.data)
    LIGER_TRY(gemm_rm(lt, true, false, h, inter, rows, a.dy, hh, a.ddown_w, wbeta, ws, stream));
  act.dout = dh, act.dgate = act.gate, act.dup = act.up;  // in place: gu ← dgu
  LIGER_TRY(gated_act_bwd(act, stream));
  LIGER_TRY(gemm_rm(lt, false, false, rows, h, 2 * inter, gu, a.gate_up_w, dn, 0.0f, ws, stream));
  if (a.dgate_up_w.data)
    LIGER_TRY(gemm_rm(lt, true, false, 2 * inter, h, rows, gu, n, a.dgate_up_w, wbeta, ws, stream));
  return rms_norm_bwd(norm_backward_of(a, dn, rstd, at), stream);
}

}  // namespace liger::cuda
