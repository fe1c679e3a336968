// activation, act_mul and their backward: argument checks and device dispatch (see hk/ops.h).
#include "ops/dispatch.h"

namespace hk::ops {

using detail::Checker;

namespace {
void check_same(const Checker& ck, const TensorView& a, const char* an, const TensorView& b,
                const char* bn) {
  ck.same_shape(a, an, b, bn);
  ck.same_dtype(a, an, b, bn);
}
}  // namespace

void activation(Activation act, const TensorView& x, const TensorView& y, Stream stream) {
  const Checker ck("activation", {{"x", &x}, {"y", &y}});
  ck.floating(x, "x");
  check_same(ck, x, "x", y, "y");
  HK_OPS_DISPATCH(ck, activation, act, x, y, stream);
}

void activation_backward(Activation act, const TensorView& dy, const TensorView& x,
                         const TensorView& dx, Stream stream) {
  const Checker ck("activation_backward", {{"dy", &dy}, {"x", &x}, {"dx", &dx}});
  ck.floating(x, "x");
  check_same(ck, x, "x", dy, "dy");
  check_same(ck, x, "x", dx, "dx");
  HK_OPS_DISPATCH(ck, activation_backward, act, dy, x, dx, stream);
}

void act_mul(Activation act, const TensorView& gate, const TensorView& up, const TensorView& out,
             Stream stream) {
  const Checker ck("act_mul", {{"gate", &gate}, {"up", &up}, {"out", &out}});
  ck.floating(gate, "gate");
  check_same(ck, gate, "gate", up, "up");
  check_same(ck, gate, "gate", out, "out");
  HK_OPS_DISPATCH(ck, act_mul, act, gate, up, out, stream);
}

void act_mul_backward(Activation act, const TensorView& dout, const TensorView& gate,
                      const TensorView& up, const TensorView& dgate, const TensorView& dup,
                      Stream stream) {
  const Checker ck(
      "act_mul_backward",
      {{"dout", &dout}, {"gate", &gate}, {"up", &up}, {"dgate", &dgate}, {"dup", &dup}});
  ck.floating(gate, "gate");
  check_same(ck, gate, "gate", dout, "dout");
  check_same(ck, gate, "gate", up, "up");
  check_same(ck, gate, "gate", dgate, "dgate");
  check_same(ck, gate, "gate", dup, "dup");
  HK_OPS_DISPATCH(ck, act_mul_backward, act, dout, gate, up, dgate, dup, stream);
}

}  // namespace hk::ops
