// matmul, linear, linear_backward: argument checks and device dispatch (see hk/ops.h).
#include "ops/dispatch.h"

namespace hk::ops {

using detail::Checker;

namespace {
// Leading dims of a and b agree (the "rows" of a linear layer).
bool same_leading(const TensorView& a, const TensorView& b) {
  if (a.ndim != b.ndim) return false;
  for (int d = 0; d + 1 < a.ndim; ++d)
    if (a.shape[d] != b.shape[d]) return false;
  return true;
}
}  // namespace

void matmul(const TensorView& a, const TensorView& b, const TensorView& c,
            const MatmulOptions& options, Stream stream) {
  const Checker ck("matmul", {{"a", &a}, {"b", &b}, {"c", &c}});
  ck.floating(a, "a");
  ck.same_dtype(a, "a", b, "b");
  ck.same_dtype(a, "a", c, "c");
  ck.require((a.ndim == 2 || a.ndim == 3) && b.ndim == a.ndim && c.ndim == a.ndim,
             "a, b and c must all be 2-D, or all 3-D (batched)");
  const int r = a.ndim - 2;
  const int64_t m = options.trans_a ? a.shape[r + 1] : a.shape[r];
  const int64_t ka = options.trans_a ? a.shape[r] : a.shape[r + 1];
  const int64_t kb = options.trans_b ? b.shape[r + 1] : b.shape[r];
  const int64_t n = options.trans_b ? b.shape[r] : b.shape[r + 1];
  ck.require(ka == kb, "inner dimensions of op(a) and op(b) differ");
  ck.require(c.shape[r] == m && c.shape[r + 1] == n, "c must be [M, N] = op(a)·op(b)");
  if (a.ndim == 3) {
    ck.require(c.shape[0] == a.shape[0], "c and a must have the same batch");
    ck.require(b.shape[0] == a.shape[0] || b.shape[0] == 1, "b's batch must equal a's or be 1");
  }
  HK_OPS_DISPATCH(ck, matmul, a, b, c, options, stream);
}

void linear(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& y,
            Stream stream) {
  const Checker ck("linear", {{"x", &x}, {"w", &w}, {"bias", bias}, {"y", &y}});
  ck.floating(x, "x");
  ck.same_dtype(x, "x", w, "w");
  ck.same_dtype(x, "x", y, "y");
  ck.min_rank(x, "x", 1);
  ck.rank(w, "w", 2);
  ck.require(x.shape[x.ndim - 1] == w.shape[1], "x's last dim must equal w's dim 1 (K)");
  ck.require(same_leading(x, y) && y.shape[y.ndim - 1] == w.shape[0],
             "y must be x's shape with the last dim = w's dim 0 (N)");
  if (bias) {
    ck.same_dtype(x, "x", *bias, "bias");
    ck.require(bias->ndim == 1 && bias->shape[0] == w.shape[0], "bias must be [N]");
  }
  HK_OPS_DISPATCH(ck, linear, x, w, bias, y, stream);
}

void linear_backward(const TensorView& dy, const TensorView& x, const TensorView& w,
                     const TensorView* dx, const TensorView* dw, const TensorView* dbias,
                     bool accumulate, Stream stream) {
  const Checker ck("linear_backward",
                   {{"dy", &dy}, {"x", &x}, {"w", &w}, {"dx", dx}, {"dw", dw}, {"dbias", dbias}});
  ck.floating(dy, "dy");
  ck.same_dtype(dy, "dy", x, "x");
  ck.same_dtype(dy, "dy", w, "w");
  ck.min_rank(x, "x", 1);
  ck.rank(w, "w", 2);
  ck.require(x.shape[x.ndim - 1] == w.shape[1], "x's last dim must equal w's dim 1 (K)");
  ck.require(same_leading(x, dy) && dy.shape[dy.ndim - 1] == w.shape[0],
             "dy must be x's shape with the last dim = w's dim 0 (N)");
  if (dx) {
    ck.same_shape(*dx, "dx", x, "x");
    ck.same_dtype(*dx, "dx", x, "x");
  }
  if (dw) {
    ck.same_shape(*dw, "dw", w, "w");
    ck.same_dtype(*dw, "dw", w, "w");
  }
  if (dbias) {
    ck.same_dtype(*dbias, "dbias", dy, "dy");
    ck.require(dbias->ndim == 1 && dbias->shape[0] == w.shape[0], "dbias must be [N]");
  }
  HK_OPS_DISPATCH(ck, linear_backward, dy, x, w, dx, dw, dbias, accumulate, stream);
}

}  // namespace hk::ops
