// cpu/mlp.cc — the gated MLP (three projections around the gated activation), forward and
// backward, with a naive row-major GEMM (f32 accumulation, one rounding to the output dtype).
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
  Buffer g(rows, inter, a.x.dt), u(rows, inter, a.x.dt);
  gemm(false, true, rows, inter, h, a.x, a.gate_w, g.rows, false);
  gemm(false, true, rows, inter, h, a.x, a.up_w, u.rows, false);
  GatedAct act;
  act.act = a.act, act.gate = g.rows, act.up = u.rows, act.out = g.rows;
  gated_act_fwd(act);
  gemm(false, true, rows, h, inter, g.rows, a.down_w, a.y, false);
}

void mlp_bwd(const MlpArgs& a) {
  const int64_t rows = a.x.rows, h = a.x.cols, inter = a.gate_w.rows;
  Buffer g(rows, inter, a.x.dt), u(rows, inter, a.x.dt), hh(rows, inter, a.x.dt),
      dh(rows, inter, a.x.dt);
  gemm(false, true, rows, inter, h, a.x, a.gate_w, g.rows, false);
  gemm(false, true, rows, inter, h, a.x, a.up_w, u.rows, false);
  GatedAct act;
  act.act = a.act, act.gate = g.rows, act.up = u.rows, act.out = hh.rows;
  gated_act_fwd(act);
  gemm(false, false, rows, inter, h, a.dy, a.down_w, dh.rows, false);
  if (a.ddown_w.data) gemm(true, false, h, inter, rows, a.dy, hh.rows, a.ddown_w, a.accumulate);
  act.dout = dh.rows, act.dgate = g.rows, act.dup = u.rows;
  gated_act_bwd(act);
  gemm(false, false, rows, h, inter, g.rows, a.gate_w, a.dx, false);
  gemm(false, false, rows, h, inter, u.rows, a.up_w, a.dx, true);
  if (a.dgate_w.data) gemm(true, false, inter, h, rows, g.rows, a.x, a.dgate_w, a.accumulate);
  if (a.dup_w.data) gemm(true, false, inter, h, rows, u.rows, a.x, a.dup_w, a.accumulate);
}

}  // namespace liger::cpu
