// attention, attention_backward: argument checks and device dispatch (see hk/ops.h).
#include "ops/dispatch.h"

namespace hk::ops {

using detail::Checker;

namespace {
// q [B, S, Hq, D], k/v [B, T, Hkv, D], Hq % Hkv == 0; key_start i32/i64 [B]; probs [B, Hq, S, T].
void check_attention(const Checker& ck, const TensorView& q, const TensorView& k,
                     const TensorView& v, const AttentionOptions& o, const TensorView* probs) {
  ck.floating(q, "q");
  ck.rank(q, "q", 4);
  ck.rank(k, "k", 4);
  ck.same_dtype(q, "q", k, "k");
  ck.same_dtype(q, "q", v, "v");
  ck.same_shape(k, "k", v, "v");
  ck.require(k.shape[0] == q.shape[0] && k.shape[3] == q.shape[3],
             "q and k/v must agree in batch and head_dim");
  ck.require(k.shape[2] > 0 && q.shape[2] % k.shape[2] == 0,
             "q's heads must be a multiple of k/v's heads (GQA)");
  if (o.key_start) {
    ck.integer_ids(*o.key_start, "key_start");
    ck.require(o.key_start->ndim == 1 && o.key_start->shape[0] == q.shape[0],
               "key_start must be [batch]");
  }
  if (probs) {
    ck.require(probs->ndim == 4 && probs->shape[0] == q.shape[0] && probs->shape[1] == q.shape[2] &&
                   probs->shape[2] == q.shape[1] && probs->shape[3] == k.shape[1],
               "probs must be [batch, q heads, q seq, kv seq]");
    ck.require(probs->dtype == DType::F32 || (probs->dtype == DType::F64 && q.dtype == DType::F64),
               "probs must be f32 (or f64 for f64 q)");
  }
}
}  // namespace

void attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const AttentionOptions& options, const TensorView* probs, Stream stream) {
  const Checker ck("attention", {{"q", &q},
                                 {"k", &k},
                                 {"v", &v},
                                 {"out", &out},
                                 {"key_start", options.key_start},
                                 {"probs", probs}});
  check_attention(ck, q, k, v, options, probs);
  ck.same_shape(q, "q", out, "out");
  ck.same_dtype(q, "q", out, "out");
  HK_OPS_DISPATCH(ck, attention, q, k, v, out, options, probs, stream);
}

void attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& probs, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv, const AttentionOptions& options,
                        Stream stream) {
  const Checker ck("attention_backward", {{"dout", &dout},
                                          {"q", &q},
                                          {"k", &k},
                                          {"v", &v},
                                          {"probs", &probs},
                                          {"dq", &dq},
                                          {"dk", &dk},
                                          {"dv", &dv},
                                          {"key_start", options.key_start}});
  check_attention(ck, q, k, v, options, &probs);
  ck.same_shape(q, "q", dout, "dout");
  ck.same_dtype(q, "q", dout, "dout");
  ck.same_shape(q, "q", dq, "dq");
  ck.same_dtype(q, "q", dq, "dq");
  ck.same_shape(k, "k", dk, "dk");
  ck.same_dtype(k, "k", dk, "dk");
  ck.same_shape(v, "v", dv, "dv");
  ck.same_dtype(v, "v", dv, "dv");
  HK_OPS_DISPATCH(ck, attention_backward, dout, q, k, v, probs, dq, dk, dv, options, stream);
}

}  // namespace hk::ops
