// cpu/mlp.cc — the gated MLP (three projections around the gated activation), forward and
// backward, with a naive row-major GEMM (f32 accumulation, one rounding to the output dtype).
// g = x·gate_wᵀ and u = x·up_wᵀ go into the caller's MlpArgs::gate/up when given (and backward
// then reads them instead of recomputing), else into local buffers; h is always recomputed.
// Simple and slow by design: the cpu variant is the portable reference, not a BLAS.
#include <vector>

#include "cpu/gemm.h"
#include "liger/cpu_ops.h"
#include "liger/host_numerics.h"

namespace liger::cpu {
namespace {

struct Buffer {
  std::vector<uint8_t> bytes;
  Rows rows;
  Buffer(int64_t r, int64_t c, Dt dt)
      : bytes(static_cast<size_t>(r * c) * dt_size(dt) + 1), rows{bytes.data(), r, c, c, dt} {}
};

}  // namespace

void mlp_fwd(const MlpArgs& a) {
  const int64_t rows = a.x.rows, h = a.x.cols, inter = a.gate_w.rows;
  const bool keep = a.gate.data != nullptr;
  Buffer g(keep ? 0 : rows, inter, a.x.dt), u(keep ? 0 : rows, inter, a.x.dt),
      hh(rows, inter, a.x.dt);
  const Rows gr = keep ? a.gate : g.rows, ur = keep ? a.up : u.rows;
  gemm(false, true, rows, inter, h, a.x, a.gate_w, gr, false);
  gemm(false, true, rows, inter, h, a.x, a.up_w, ur, false);
  GatedAct act;
  act.act = a.act, act.gate = gr, act.up = ur, act.out = hh.rows;
  gated_act_fwd(act);
  gemm(false, true, rows, h, inter, hh.rows, a.down_w, a.y, false);
}

void mlp_bwd(const MlpArgs& a) {
  const int64_t rows = a.x.rows, h = a.x.cols, inter = a.gate_w.rows;
  const bool saved = a.gate.data != nullptr;
  Buffer g(saved ? 0 : rows, inter, a.x.dt), u(saved ? 0 : rows, inter, a.x.dt),
      hh(rows, inter, a.x.dt), dh(rows, inter, a.x.dt);
  const Rows gr = saved ? a.gate : g.rows, ur = saved ? a.up : u.rows;
  if (!saved) {
    gemm(false, true, rows, inter, h, a.x, a.gate_w, gr, false);
    gemm(false, true, rows, inter, h, a.x, a.up_w, ur, false);
  }
  GatedAct act;
  act.act = a.act, act.gate = gr, act.up = ur, act.out = hh.rows;
  gated_act_fwd(act);
  gemm(false, false, rows, inter, h, a.dy, a.down_w, dh.rows, false);
  if (a.ddown_w.data) gemm(true, false, h, inter, rows, a.dy, hh.rows, a.ddown_w, a.accumulate);
  act.dout = dh.rows, act.dgate = gr, act.dup = ur;  // in place: g ← dg, u ← du
  gated_act_bwd(act);
  gemm(false, false, rows, h, inter, gr, a.gate_w, a.dx, false);
  gemm(false, false, rows, h, inter, ur, a.up_w, a.dx, true);
  if (a.dgate_w.data) gemm(true, false, inter, h, rows, gr, a.x, a.dgate_w, a.accumulate);
  if (a.dup_w.data) gemm(true, false, inter, h, rows, ur, a.x, a.dup_w, a.accumulate);
}

}  // namespace liger::cpu
