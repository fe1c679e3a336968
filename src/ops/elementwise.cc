// add, mul, scale, cast, fill: argument checks and device dispatch (see hk/ops.h).
//
// For add/mul, b may have fewer dims or size-1 dims: it is broadcast to a's shape here (a stride-0
// view, as expand() makes) so every device implementation sees operands of one shape.
#include "ops/dispatch.h"

namespace hk::ops {

using detail::Checker;

namespace {
TensorView broadcast_b(const Checker& ck, const TensorView& a, const TensorView& b) {
  if (same_shape(a, b)) return b;
  bool ok = b.ndim <= a.ndim;
  for (int i = b.ndim - 1, j = a.ndim - 1; ok && i >= 0; --i, --j)
    ok = b.shape[i] == a.shape[j] || b.shape[i] == 1;
  ck.require(ok, "b must have a's shape or broadcast to it");
  return b.expand(a.sizes());
}

void check_binary(const Checker& ck, const TensorView& a, const TensorView& b,
                  const TensorView& out) {
  ck.floating(a, "a");
  ck.same_dtype(a, "a", b, "b");
  ck.same_dtype(a, "a", out, "out");
  ck.same_shape(a, "a", out, "out");
}
}  // namespace

void add(const TensorView& a, const TensorView& b, const TensorView& out, float alpha,
         Stream stream) {
  const Checker ck("add", {{"a", &a}, {"b", &b}, {"out", &out}});
  check_binary(ck, a, b, out);
  const TensorView bb = broadcast_b(ck, a, b);
  HK_OPS_DISPATCH(ck, add, a, bb, out, alpha, stream);
}

void mul(const TensorView& a, const TensorView& b, const TensorView& out, Stream stream) {
  const Checker ck("mul", {{"a", &a}, {"b", &b}, {"out", &out}});
  check_binary(ck, a, b, out);
  const TensorView bb = broadcast_b(ck, a, b);
  HK_OPS_DISPATCH(ck, mul, a, bb, out, stream);
}

void scale(const TensorView& x, float factor, const TensorView& out, Stream stream) {
  const Checker ck("scale", {{"x", &x}, {"out", &out}});
  ck.floating(x, "x");
  ck.same_dtype(x, "x", out, "out");
  ck.same_shape(x, "x", out, "out");
  HK_OPS_DISPATCH(ck, scale, x, factor, out, stream);
}

void cast(const TensorView& x, const TensorView& out, Stream stream) {
  const Checker ck("cast", {{"x", &x}, {"out", &out}});
  ck.same_shape(x, "x", out, "out");
  HK_OPS_DISPATCH(ck, cast, x, out, stream);
}

void fill(const TensorView& out, double value, Stream stream) {
  const Checker ck("fill", {{"out", &out}});
  HK_OPS_DISPATCH(ck, fill, out, value, stream);
}

}  // namespace hk::ops
