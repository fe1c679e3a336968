// embedding, embedding_backward: argument checks and device dispatch (see hk/ops.h).
#include "ops/dispatch.h"

namespace hk::ops {

using detail::Checker;

namespace {
// out must be ids.shape + [H].
bool is_ids_plus_hidden(const TensorView& out, const TensorView& ids, int64_t hidden) {
  if (out.ndim != ids.ndim + 1 || out.shape[out.ndim - 1] != hidden) return false;
  for (int d = 0; d < ids.ndim; ++d)
    if (out.shape[d] != ids.shape[d]) return false;
  return true;
}
}  // namespace

void embedding(const TensorView& weight, const TensorView& ids, const TensorView& out,
               Stream stream) {
  const Checker ck("embedding", {{"weight", &weight}, {"ids", &ids}, {"out", &out}});
  ck.floating(weight, "weight");
  ck.rank(weight, "weight", 2);
  ck.integer_ids(ids, "ids");
  ck.same_dtype(weight, "weight", out, "out");
  ck.require(ids.ndim + 1 <= kMaxDims, "ids has too many dims");
  ck.require(is_ids_plus_hidden(out, ids, weight.shape[1]),
             "out must be ids' shape followed by the hidden size");
  HK_OPS_DISPATCH(ck, embedding, weight, ids, out, stream);
}

void embedding_backward(const TensorView& dout, const TensorView& ids, const TensorView& dweight,
                        Stream stream) {
  const Checker ck("embedding_backward", {{"dout", &dout}, {"ids", &ids}, {"dweight", &dweight}});
  ck.floating(dout, "dout");
  ck.integer_ids(ids, "ids");
  ck.rank(dweight, "dweight", 2);
  ck.require(dweight.dtype == dout.dtype || dweight.dtype == DType::F32,
             "dweight must have dout's dtype or be f32");
  ck.require(is_ids_plus_hidden(dout, ids, dweight.shape[1]),
             "dout must be ids' shape followed by the hidden size of dweight");
  HK_OPS_DISPATCH(ck, embedding_backward, dout, ids, dweight, stream);
}

}  // namespace hk::ops
