// rms_norm, rms_norm_backward, layer_norm: argument checks and device dispatch (see hk/ops.h).
#include "ops/dispatch.h"

namespace hk::ops {

using detail::Checker;
using detail::rows_of;

namespace {
// rstd: one f32 per row (any shape with that many elements); f64 allowed for f64 x (CPU reference).
void check_rstd(const Checker& ck, const TensorView& x, const TensorView* rstd) {
  if (!rstd) return;
  ck.require(rstd->numel() == rows_of(x), "rstd must hold one value per row of x");
  ck.require(rstd->dtype == DType::F32 || (rstd->dtype == DType::F64 && x.dtype == DType::F64),
             "rstd must be f32 (or f64 for an f64 x)");
}

void check_row_weight(const Checker& ck, const TensorView& x, const TensorView& w,
                      const char* name) {
  ck.floating(w, name);
  ck.require(w.ndim == 1 && w.shape[0] == x.shape[x.ndim - 1],
             std::string(name) + " must be [H] with H = x's last dim");
}
}  // namespace

void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
              const TensorView* rstd, Stream stream) {
  const Checker ck("rms_norm", {{"x", &x}, {"weight", &weight}, {"y", &y}, {"rstd", rstd}});
  ck.floating(x, "x");
  ck.min_rank(x, "x", 1);
  check_row_weight(ck, x, weight, "weight");
  ck.floating(y, "y");
  ck.same_shape(x, "x", y, "y");
  check_rstd(ck, x, rstd);
  HK_OPS_DISPATCH(ck, rms_norm, x, weight, eps, y, rstd, stream);
}

void add_rms_norm(const TensorView& residual, const TensorView& delta, const TensorView& weight,
                  float eps, const TensorView& y, Stream stream) {
  const Checker ck("add_rms_norm",
                   {{"residual", &residual}, {"delta", &delta}, {"weight", &weight}, {"y", &y}});
  ck.floating(residual, "residual");
  ck.min_rank(residual, "residual", 1);
  ck.same_shape(residual, "residual", delta, "delta");
  ck.require(residual.dtype == delta.dtype, "residual and delta must share one dtype");
  check_row_weight(ck, residual, weight, "weight");
  ck.floating(y, "y");
  ck.same_shape(residual, "residual", y, "y");
  ck.require(y.ptr() != residual.ptr() && y.ptr() != delta.ptr(),
             "y must not alias residual or delta");
  HK_OPS_DISPATCH(ck, add_rms_norm, residual, delta, weight, eps, y, stream);
}

void rms_norm_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                       float eps, const TensorView* rstd, const TensorView& dx,
                       const TensorView* dweight, bool accumulate_dweight, Stream stream) {
  const Checker ck("rms_norm_backward", {{"dy", &dy},
                                         {"x", &x},
                                         {"weight", &weight},
                                         {"rstd", rstd},
                                         {"dx", &dx},
                                         {"dweight", dweight}});
  ck.floating(x, "x");
  ck.min_rank(x, "x", 1);
  ck.floating(dy, "dy");
  ck.floating(dx, "dx");
  ck.same_shape(dy, "dy", x, "x");
  ck.same_shape(dx, "dx", x, "x");
  check_row_weight(ck, x, weight, "weight");
  check_rstd(ck, x, rstd);
  if (dweight) {
    ck.same_shape(*dweight, "dweight", weight, "weight");
    ck.require(dweight->dtype == weight.dtype || dweight->dtype == DType::F32,
               "dweight must have weight's dtype or be f32");
  }
  HK_OPS_DISPATCH(ck, rms_norm_backward, dy, x, weight, eps, rstd, dx, dweight, accumulate_dweight,
                  stream);
}

void layer_norm(const TensorView& x, const TensorView& weight, const TensorView* bias, float eps,
                const TensorView& y, Stream stream) {
  const Checker ck("layer_norm", {{"x", &x}, {"weight", &weight}, {"bias", bias}, {"y", &y}});
  ck.floating(x, "x");
  ck.min_rank(x, "x", 1);
  check_row_weight(ck, x, weight, "weight");
  if (bias) check_row_weight(ck, x, *bias, "bias");
  ck.floating(y, "y");
  ck.same_shape(x, "x", y, "y");
  HK_OPS_DISPATCH(ck, layer_norm, x, weight, bias, eps, y, stream);
}

}  // namespace hk::ops
