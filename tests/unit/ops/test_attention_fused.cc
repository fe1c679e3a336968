// CPU fused attention (hk::ops::fused_attention, the "sdpa" attention function on CPU) against the
// double reference of test_attention_reference.h: f32/bf16/f16/f64; odd lengths (1, 7, 129), S < T
// and S > T (rows that see nothing), GQA ratios 1/2/3 and MQA, causal and not, softcap, left
// window, key_start with fully masked rows, custom scale, lse; q/k/v/out as strided views; varlen
// (packed sequences) against the reference and against per-sequence batch calls; the backward
// against the reference and, in f64, by finite differences; argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/op_testing.h"
#include "hk/ops.h"
#include "unit/ops/test_attention_reference.h"

namespace hk {
namespace {

using namespace hk::test;

struct Case {
  std::string name;
  int64_t b, s, t, hq, hkv, d;
  bool causal = true;
  double softcap = 0;
  int64_t window = -1;
  bool key_start = false;
  float scale = 0;
};

AttnProblem problem_of(const Case& c) {
  AttnProblem p;
  p.S.assign(c.b, c.s);
  p.T.assign(c.b, c.t);
  p.hq = c.hq;
  p.hkv = c.hkv;
  p.d = c.d;
  p.causal = c.causal;
  p.softcap = c.softcap;
  p.window = c.window;
  p.scale = c.scale;
  if (c.key_start)
    for (int64_t b = 0; b < c.b; ++b) p.key_start.push_back((b * 5 + 3) % (c.t + 2));
  return p;
}

// A [B, S, H, D] view of `x` stored heads-major.
Tensor heads_major(const Tensor& x) {
  const Shape s = x.sizes();
  Tensor buf = Tensor::empty({s[0], s[2], s[1], s[3]}, x.dtype());
  Tensor v = buf.permute({0, 2, 1, 3});
  v.copy_from(x.view());
  return v;
}

ops::FusedAttentionOptions options_of(const Case& c, const Tensor* key_start) {
  ops::FusedAttentionOptions o;
  o.causal = c.causal;
  o.softcap = static_cast<float>(c.softcap);
  o.window_left = c.window;
  o.scale = c.scale;
  o.key_start = key_start ? &key_start->view() : nullptr;
  return o;
}

void run_case(const Case& c, DType dt, bool strided, bool backward) {
  SCOPED_TRACE(c.name + " " + dtype_name(dt) + (strided ? " strided" : ""));
  const AttnProblem p = problem_of(c);
  Tensor q = random_tensor({c.b, c.s, c.hq, c.d}, dt, 11);
  Tensor k = random_tensor({c.b, c.t, c.hkv, c.d}, dt, 12);
  Tensor v = random_tensor({c.b, c.t, c.hkv, c.d}, dt, 13);
  Tensor dout = random_tensor({c.b, c.s, c.hq, c.d}, dt, 14);
  const AttnRef ref = attention_reference(p, values(q), values(k), values(v),
                                          backward ? values(dout) : std::vector<double>{});
  Tensor ks;
  if (c.key_start) ks = Tensor::from_ints(p.key_start, {c.b}, DType::I32);
  const ops::FusedAttentionOptions o = options_of(c, c.key_start ? &ks : nullptr);
  Tensor qv = strided ? heads_major(q) : q, kv = strided ? heads_major(k) : k,
         vv = strided ? heads_major(v) : v;
  Tensor out = strided ? heads_major(Tensor::zeros(q.sizes(), dt)) : Tensor::empty(q.sizes(), dt);
  ops::fill(out, std::nan(""));
  Tensor lse = Tensor::empty({c.b, c.hq, c.s}, DType::F32);
  ops::fused_attention(qv, kv, vv, out, o, &lse.view());
  EXPECT_TRUE(attention_close(values(out), ref.out, attention_tolerance(dt), "out"));
  EXPECT_TRUE(
      attention_close(values(lse), batch_lse(p, ref.lse), attention_tolerance(DType::F32), "lse"));
  if (!backward) return;
  Tensor dq = Tensor::empty(q.sizes(), dt), dk = Tensor::empty(k.sizes(), dt),
         dv = Tensor::empty(v.sizes(), dt);
  ops::fused_attention_backward(strided ? heads_major(dout) : dout, qv, kv, vv, out, lse, dq, dk,
                                dv, o);
  const AttnTolerance gt = attention_tolerance(dt, /*gradient=*/true);
  EXPECT_TRUE(attention_close(values(dq), ref.dq, gt, "dq"));
  EXPECT_TRUE(attention_close(values(dk), ref.dk, gt, "dk"));
  EXPECT_TRUE(attention_close(values(dv), ref.dv, gt, "dv"));
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"one", 1, 1, 1, 1, 1, 16},
      {"odd7_gqa2", 2, 7, 7, 4, 2, 16},
      {"s129_mqa", 1, 129, 129, 3, 1, 32},
      {"decode_t130_gqa3", 2, 1, 130, 6, 2, 64},
      {"s_lt_t", 1, 65, 200, 2, 2, 16},
      {"s_gt_t_masked_rows", 1, 40, 17, 2, 1, 16},
      {"noncausal", 2, 33, 70, 4, 2, 16, false},
      {"softcap", 1, 50, 50, 2, 1, 16, true, 5.0},
      {"window", 1, 90, 90, 2, 2, 16, true, 0, 17},
      {"window_noncausal", 1, 30, 45, 2, 1, 16, false, 0, 6},
      {"key_start", 3, 9, 21, 2, 1, 16, true, 0, -1, true},
      {"scale", 1, 20, 20, 2, 2, 16, true, 0, -1, false, 0.37f},
      {"everything", 2, 37, 52, 4, 2, 32, true, 3.0, 11, true, 0.2f},
  };
  return all;
}

TEST(FusedAttentionCpu, ForwardMatchesReferenceEveryFeatureAndDtype) {
  for (const Case& c : cases())
    for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64})
      run_case(c, dt, false, false);
}

TEST(FusedAttentionCpu, StridedViews) {
  for (const Case& c : cases()) run_case(c, DType::BF16, true, true);
}

TEST(FusedAttentionCpu, BackwardMatchesReference) {
  for (const Case& c : cases())
    for (DType dt : {DType::F32, DType::BF16, DType::F64}) run_case(c, dt, false, true);
}

TEST(FusedAttentionCpu, FullyMaskedRowsGiveZerosAndInfiniteLse) {
  // S > T causal: queries 0..S-T-1 see no key; key_start past every key masks a whole batch row
  Case c{"masked", 2, 6, 3, 2, 1, 16};
  const AttnProblem p = problem_of(c);
  Tensor q = random_tensor({2, 6, 2, 16}, DType::F32, 1),
         k = random_tensor({2, 3, 1, 16}, DType::F32, 2);
  Tensor v = random_tensor({2, 3, 1, 16}, DType::F32, 3);
  Tensor out = Tensor::empty(q.sizes(), DType::F32), lse = Tensor::empty({2, 2, 6}, DType::F32);
  Tensor ks = Tensor::from_ints({0, 5}, {2}, DType::I64);
  ops::FusedAttentionOptions o;
  o.key_start = &ks.view();
  ops::fused_attention(q, k, v, out, o, &lse.view());
  const auto o_vals = values(out), l_vals = values(lse);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t s = 0; s < 6; ++s) {
      const bool empty0 = s < 3;  // batch 0: causal S > T
      EXPECT_EQ(std::isinf(l_vals[(0 * 2 + h) * 6 + s]), empty0) << s;
      EXPECT_TRUE(std::isinf(l_vals[(1 * 2 + h) * 6 + s]));  // batch 1: key_start 5 > T
      for (int64_t e = 0; e < 16; ++e) {
        EXPECT_EQ(o_vals[((1 * 6 + s) * 2 + h) * 16 + e], 0.0);
        if (empty0) EXPECT_EQ(o_vals[((0 * 6 + s) * 2 + h) * 16 + e], 0.0);
      }
    }
  (void)p;
}

TEST(FusedAttentionCpu, VarlenMatchesReferenceAndPerSequenceCalls) {
  AttnProblem p;
  p.S = {3, 1, 17, 9};
  p.T = {5, 1, 17, 30};
  p.hq = 4;
  p.hkv = 2;
  p.d = 16;
  p.softcap = 4.0;
  p.window = 9;
  const int64_t nq = p.rows_q(), nk = p.rows_k();
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor q = random_tensor({nq, 4, 16}, dt, 21), k = random_tensor({nk, 2, 16}, dt, 22),
           v = random_tensor({nk, 2, 16}, dt, 23), dout = random_tensor({nq, 4, 16}, dt, 24);
    const AttnRef ref = attention_reference(p, values(q), values(k), values(v), values(dout));
    Tensor cu_q = Tensor::from_ints({0, 3, 4, 21, 30}, {5}, DType::I32);
    Tensor cu_k = Tensor::from_ints({0, 5, 6, 23, 53}, {5}, DType::I32);
    ops::FusedAttentionOptions o;
    o.softcap = 4.0f;
    o.window_left = 9;
    o.cu_seqlens_q = &cu_q.view();
    o.cu_seqlens_k = &cu_k.view();
    o.max_seqlen_q = 17;
    o.max_seqlen_k = 30;
    Tensor out = Tensor::empty(q.sizes(), dt), lse = Tensor::empty({4, nq}, DType::F32);
    ops::fused_attention(q, k, v, out, o, &lse.view());
    EXPECT_TRUE(attention_close(values(out), ref.out, attention_tolerance(dt), "out"));
    EXPECT_TRUE(attention_close(values(lse), ref.lse, attention_tolerance(DType::F32), "lse"));
    Tensor dq = Tensor::empty(q.sizes(), dt), dk = Tensor::empty(k.sizes(), dt),
           dv = Tensor::empty(v.sizes(), dt);
    ops::fused_attention_backward(dout, q, k, v, out, lse, dq, dk, dv, o);
    const AttnTolerance gt = attention_tolerance(dt, true);
    EXPECT_TRUE(attention_close(values(dq), ref.dq, gt, "dq"));
    EXPECT_TRUE(attention_close(values(dk), ref.dk, gt, "dk"));
    EXPECT_TRUE(attention_close(values(dv), ref.dv, gt, "dv"));
    // each sequence alone, in batch layout, gives the same rows bit for bit
    const auto all_out = values(out);
    int64_t q0 = 0, k0 = 0;
    for (size_t b = 0; b < p.S.size(); ++b) {
      const int64_t S = p.S[b], T = p.T[b];
      Tensor qb = q.slice(0, q0, q0 + S).unsqueeze(0), kb = k.slice(0, k0, k0 + T).unsqueeze(0),
             vb = v.slice(0, k0, k0 + T).unsqueeze(0);
      Tensor ob = Tensor::empty({1, S, 4, 16}, dt);
      ops::FusedAttentionOptions ob_opts;
      ob_opts.softcap = 4.0f;
      ob_opts.window_left = 9;
      ops::fused_attention(qb, kb, vb, ob, ob_opts);
      const auto one = values(ob);
      for (size_t i = 0; i < one.size(); ++i)
        ASSERT_EQ(one[i], all_out[q0 * 4 * 16 + i]) << "sequence " << b << " element " << i;
      q0 += S;
      k0 += T;
    }
  }
}

TEST(FusedAttentionCpu, BackwardMatchesFiniteDifferences) {
  // f64, tiny: d(Σ w·out)/d(q, k, v) numerically vs the op's backward (softcap + window + GQA)
  Case c{"fd", 1, 5, 7, 2, 1, 4, true, 2.0, 3};
  Tensor q = random_tensor({1, 5, 2, 4}, DType::F64, 31),
         k = random_tensor({1, 7, 1, 4}, DType::F64, 32),
         v = random_tensor({1, 7, 1, 4}, DType::F64, 33),
         w = random_tensor({1, 5, 2, 4}, DType::F64, 34);
  const ops::FusedAttentionOptions o = options_of(c, nullptr);
  Tensor out = Tensor::empty(q.sizes(), DType::F64), lse = Tensor::empty({1, 2, 5}, DType::F32);
  auto loss = [&] {
    ops::fused_attention(q, k, v, out, o);
    return weighted_sum(out, values(w));
  };
  const auto gq = numeric_gradient(q, loss), gk = numeric_gradient(k, loss),
             gv = numeric_gradient(v, loss);
  ops::fused_attention(q, k, v, out, o, &lse.view());
  Tensor dq = Tensor::empty(q.sizes(), DType::F64), dk = Tensor::empty(k.sizes(), DType::F64),
         dv = Tensor::empty(v.sizes(), DType::F64);
  ops::fused_attention_backward(w, q, k, v, out, lse, dq, dk, dv, o);
  // lse is f32: the recomputed probabilities carry its rounding (~6e-8 relative)
  const AttnTolerance fd{1e-5, 1e-5};
  EXPECT_TRUE(attention_close(values(dq), gq, fd, "dq"));
  EXPECT_TRUE(attention_close(values(dk), gk, fd, "dk"));
  EXPECT_TRUE(attention_close(values(dv), gv, fd, "dv"));
}

TEST(FusedAttentionCpu, RejectsBadArguments) {
  Tensor q = Tensor::zeros({1, 4, 2, 8}, DType::F32), k = Tensor::zeros({1, 4, 3, 8}, DType::F32);
  Tensor out = Tensor::zeros({1, 4, 2, 8}, DType::F32);
  HK_EXPECT_INVALID(ops::fused_attention(q, k, k, out), "fused_attention");  // 2 % 3 heads
  Tensor k2 = Tensor::zeros({1, 4, 1, 4}, DType::F32);
  HK_EXPECT_INVALID(ops::fused_attention(q, k2, k2, out), "head_dim");
  Tensor lse = Tensor::zeros({1, 4, 2}, DType::F32);  // wrong order of dims
  Tensor k1 = Tensor::zeros({1, 4, 1, 8}, DType::F32);
  HK_EXPECT_INVALID(ops::fused_attention(q, k1, k1, out, {}, &lse.view()), "lse");
  ops::FusedAttentionOptions o;
  Tensor cu = Tensor::from_ints({0, 4}, {2}, DType::I32);
  o.cu_seqlens_q = &cu.view();  // varlen needs both, and 3-D tensors
  HK_EXPECT_INVALID(ops::fused_attention(q, k1, k1, out, o), "cu_seqlens");
}

}  // namespace
}  // namespace hk
