// softmax, softmax_backward: argument checks and device dispatch (see hk/ops.h).
#include "ops/dispatch.h"

namespace hk::ops {

using detail::Checker;

void softmax(const TensorView& x, const TensorView& y, Stream stream) {
  const Checker ck("softmax", {{"x", &x}, {"y", &y}});
  ck.floating(x, "x");
  ck.min_rank(x, "x", 1);
  ck.same_shape(x, "x", y, "y");
  ck.same_dtype(x, "x", y, "y");
  HK_OPS_DISPATCH(ck, softmax, x, y, stream);
}

void softmax_backward(const TensorView& dy, const TensorView& y, const TensorView& dx,
                      Stream stream) {
  const Checker ck("softmax_backward", {{"dy", &dy}, {"y", &y}, {"dx", &dx}});
  ck.floating(y, "y");
  ck.min_rank(y, "y", 1);
  ck.same_shape(y, "y", dy, "dy");
  ck.same_shape(y, "y", dx, "dx");
  ck.same_dtype(y, "y", dy, "dy");
  ck.same_dtype(y, "y", dx, "dx");
  HK_OPS_DISPATCH(ck, softmax_backward, dy, y, dx, stream);
}

}  // namespace hk::ops
