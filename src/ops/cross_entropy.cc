// cross_entropy, cross_entropy_backward, argmax: argument checks and device dispatch.
#include "ops/dispatch.h"

namespace hk::ops {

using detail::Checker;

namespace {
// f32 side outputs (f64 allowed for f64 logits: the CPU reference dtype).
void check_f32(const Checker& ck, const TensorView& logits, const TensorView& t, const char* name) {
  ck.require(t.dtype == DType::F32 || (t.dtype == DType::F64 && logits.dtype == DType::F64),
             std::string(name) + " must be f32 (or f64 for f64 logits)");
}

void check_common(const Checker& ck, const TensorView& logits, const TensorView& labels,
                  const TensorView& loss, const CrossEntropyOptions& o, const TensorView* lse,
                  const char* loss_name) {
  ck.floating(logits, "logits");
  ck.rank(logits, "logits", 2);
  ck.integer_ids(labels, "labels");
  ck.require(labels.ndim == 1 && labels.shape[0] == logits.shape[0], "labels must be [N]");
  check_f32(ck, logits, loss, loss_name);
  if (o.reduction == Reduction::None)
    ck.require(loss.ndim == 1 && loss.shape[0] == logits.shape[0],
               std::string(loss_name) + " must be [N] with reduction None");
  else
    ck.require(loss.ndim <= 1 && loss.numel() == 1,
               std::string(loss_name) + " must be a scalar ([] or [1]) with reduction Mean/Sum");
  if (lse) {
    check_f32(ck, logits, *lse, "lse");
    ck.require(lse->ndim == 1 && lse->shape[0] == logits.shape[0], "lse must be [N]");
  }
}
}  // namespace

void cross_entropy(const TensorView& logits, const TensorView& labels, const TensorView& loss,
                   const CrossEntropyOptions& options, const TensorView* lse, Stream stream) {
  const Checker ck("cross_entropy",
                   {{"logits", &logits}, {"labels", &labels}, {"loss", &loss}, {"lse", lse}});
  check_common(ck, logits, labels, loss, options, lse, "loss");
  HK_OPS_DISPATCH(ck, cross_entropy, logits, labels, loss, options, lse, stream);
}

void cross_entropy_backward(const TensorView& dloss, const TensorView& logits,
                            const TensorView& labels, const TensorView& dlogits,
                            const CrossEntropyOptions& options, const TensorView* lse,
                            Stream stream) {
  const Checker ck("cross_entropy_backward", {{"dloss", &dloss},
                                              {"logits", &logits},
                                              {"labels", &labels},
                                              {"dlogits", &dlogits},
                                              {"lse", lse}});
  check_common(ck, logits, labels, dloss, options, lse, "dloss");
  ck.same_shape(logits, "logits", dlogits, "dlogits");
  ck.same_dtype(logits, "logits", dlogits, "dlogits");
  HK_OPS_DISPATCH(ck, cross_entropy_backward, dloss, logits, labels, dlogits, options, lse, stream);
}

void argmax(const TensorView& x, const TensorView& out, Stream stream) {
  const Checker ck("argmax", {{"x", &x}, {"out", &out}});
  ck.min_rank(x, "x", 1);
  ck.require(x.shape[x.ndim - 1] > 0, "x's last dim must not be empty");
  ck.require(out.dtype == DType::I64, "out must be i64");
  ck.require(out.numel() == detail::rows_of(x), "out must hold one index per row of x");
  HK_OPS_DISPATCH(ck, argmax, x, out, stream);
}

}  // namespace hk::ops
