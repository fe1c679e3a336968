// cpu/activation.cc — unary activations and gated act·up (SwiGLU, GeGLU), forward and backward.
#include "liger/act_math.h"
#include "liger/cpu_ops.h"
#include "liger/host_numerics.h"

namespace liger::cpu {
using host::at;
using host::put;

void unary_act_fwd(const UnaryAct& a) {
  for (int64_t r = 0; r < a.x.rows; ++r)
    for (int64_t c = 0; c < a.x.cols; ++c) put(a.y, r, c, act_fwd(a.act, at(a.x, r, c)));
}

void unary_act_bwd(const UnaryAct& a) {
  for (int64_t r = 0; r < a.x.rows; ++r)
    for (int64_t c = 0; c < a.x.cols; ++c)
      put(a.dx, r, c, at(a.dy, r, c) * act_grad(a.act, at(a.x, r, c)));
}

void gated_act_fwd(const GatedAct& a) {
  for (int64_t r = 0; r < a.gate.rows; ++r)
    for (int64_t c = 0; c < a.gate.cols; ++c) {
      const float g = host::round_to(a.gate.dt, act_fwd(a.act, at(a.gate, r, c)));
      put(a.out, r, c, g * at(a.up, r, c));
    }
}

void gated_act_bwd(const GatedAct& a) {
  for (int64_t r = 0; r < a.gate.rows; ++r)
    for (int64_t c = 0; c < a.gate.cols; ++c) {
      const float x = at(a.gate, r, c), u = at(a.up, r, c), d = at(a.dout, r, c);
      const float g = host::round_to(a.gate.dt, act_fwd(a.act, x));
      put(a.dgate, r, c, d * u * act_grad(a.act, x));
      put(a.dup, r, c, d * g);
    }
}

}  // namespace liger::cpu
