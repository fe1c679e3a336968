// fused_attention, fused_attention_backward: argument checks and device dispatch (see hk/ops.h).
#include "ops/attention_fused.h"

#include "ops/dispatch.h"

namespace hk::ops {

using detail::Checker;

namespace {
bool is_varlen(const FusedAttentionOptions& o) {
  return o.cu_seqlens_q != nullptr || o.cu_seqlens_k != nullptr;
}

// q [B, S, Hq, D] / k, v [B, T, Hkv, D], or the varlen [rows, H, D] layouts; lse shape.
void check_fused(const Checker& ck, const TensorView& q, const TensorView& k, const TensorView& v,
                 const FusedAttentionOptions& o, const TensorView* lse) {
  const bool varlen = is_varlen(o);
  const int rank = varlen ? 3 : 4;
  ck.floating(q, "q");
  ck.rank(q, "q", rank);
  ck.rank(k, "k", rank);
  ck.same_dtype(q, "q", k, "k");
  ck.same_dtype(q, "q", v, "v");
  ck.same_shape(k, "k", v, "v");
  const int hh = rank - 2, hd = rank - 1;
  ck.require(k.shape[hd] == q.shape[hd], "q and k/v must agree in head_dim");
  ck.require(k.shape[hh] > 0 && q.shape[hh] % k.shape[hh] == 0,
             "q's heads must be a multiple of k/v's heads (GQA)");
  ck.require(o.window_left >= -1, "window_left must be -1 (none) or ≥ 0");
  ck.require(o.softcap >= 0.0f, "softcap must be ≥ 0");
  int64_t batch = q.shape[0];
  if (varlen) {
    ck.require(o.cu_seqlens_q != nullptr && o.cu_seqlens_k != nullptr,
               "varlen attention needs both cu_seqlens_q and cu_seqlens_k");
    for (const TensorView* cu : {o.cu_seqlens_q, o.cu_seqlens_k})
      ck.require(cu->ndim == 1 && cu->shape[0] >= 2 && cu->dtype == DType::I32,
                 "cu_seqlens must be i32 [batch + 1]");
    ck.require(o.cu_seqlens_q->shape[0] == o.cu_seqlens_k->shape[0],
               "cu_seqlens_q and cu_seqlens_k must have the same length");
    ck.require(o.key_start == nullptr, "key_start is for batch layouts, not varlen");
    ck.require(o.max_seqlen_q > 0 && o.max_seqlen_q <= q.shape[0] && o.max_seqlen_k >= 0 &&
                   o.max_seqlen_k <= k.shape[0],
               "varlen attention needs max_seqlen_q / max_seqlen_k bounding the sequences");
    batch = o.cu_seqlens_q->shape[0] - 1;
  } else {
    ck.require(k.shape[0] == q.shape[0], "q and k/v must agree in batch");
  }
  if (o.key_start) {
    ck.integer_ids(*o.key_start, "key_start");
    ck.require(o.key_start->ndim == 1 && o.key_start->shape[0] == batch,
               "key_start must be [batch]");
  }
  if (lse) {
    ck.require(lse->dtype == DType::F32, "lse must be f32");
    if (varlen)
      ck.require(lse->ndim == 2 && lse->shape[0] == q.shape[1] && lse->shape[1] == q.shape[0],
                 "lse must be [heads, rows] for varlen attention");
    else
      ck.require(lse->ndim == 3 && lse->shape[0] == q.shape[0] && lse->shape[1] == q.shape[2] &&
                     lse->shape[2] == q.shape[1],
                 "lse must be [batch, q heads, q seq]");
  }
}
}  // namespace

void fused_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const FusedAttentionOptions& options,
                     const TensorView* lse, Stream stream) {
  const Checker ck("fused_attention", {{"q", &q},
                                       {"k", &k},
                                       {"v", &v},
                                       {"out", &out},
                                       {"lse", lse},
                                       {"key_start", options.key_start},
                                       {"cu_seqlens_q", options.cu_seqlens_q},
                                       {"cu_seqlens_k", options.cu_seqlens_k}});
  check_fused(ck, q, k, v, options, lse);
  ck.same_shape(q, "q", out, "out");
  ck.same_dtype(q, "q", out, "out");
  HK_OPS_DISPATCH(ck, fused_attention, q, k, v, out, options, lse, stream);
}

void fused_attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                              const TensorView& v, const TensorView& out, const TensorView& lse,
                              const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const FusedAttentionOptions& options, Stream stream) {
  const Checker ck("fused_attention_backward", {{"dout", &dout},
                                                {"q", &q},
                                                {"k", &k},
                                                {"v", &v},
                                                {"out", &out},
                                                {"lse", &lse},
                                                {"dq", &dq},
                                                {"dk", &dk},
                                                {"dv", &dv},
                                                {"key_start", options.key_start},
                                                {"cu_seqlens_q", options.cu_seqlens_q},
                                                {"cu_seqlens_k", options.cu_seqlens_k}});
  check_fused(ck, q, k, v, options, &lse);
  for (const auto& [t, name] : {std::pair{&dout, "dout"}, {&out, "out"}, {&dq, "dq"}}) {
    ck.same_shape(q, "q", *t, name);
    ck.same_dtype(q, "q", *t, name);
  }
  ck.same_shape(k, "k", dk, "dk");
  ck.same_dtype(k, "k", dk, "dk");
  ck.same_shape(v, "v", dv, "dv");
  ck.same_dtype(v, "v", dv, "dv");
  HK_OPS_DISPATCH(ck, fused_attention_backward, dout, q, k, v, out, lse, dq, dk, dv, options,
                  stream);
}

}  // namespace hk::ops
