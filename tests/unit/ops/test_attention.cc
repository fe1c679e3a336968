// Eager attention on CPU: GQA, causal masking with S < T (queries are the last S keys), key_start
// left padding, fully masked rows, custom scale and strided q/k/v/out — forward against a double
// reference (probabilities rounded to q's dtype before P·V), backward against the double
// reference and by finite differences in f64.
#include <gtest/gtest.h>

#include <cmath>

#include "common/op_testing.h"
#include "hk/ops.h"

namespace hk {
namespace {

using namespace hk::test;

struct Geometry {
  int64_t b, s, t, hq, hkv, d;
};

struct RefOut {
  std::vector<double> out, probs;
};

// Scores in Acc, softmax, probabilities rounded to `dtype` before P·V (accumulated in Acc).
template <class Acc>
RefOut ref_attention(const std::vector<double>& q, const std::vector<double>& k,
                     const std::vector<double>& v, const Geometry& g, double scale, bool causal,
                     const std::vector<int64_t>& key_start, DType dtype) {
  RefOut r{std::vector<double>(g.b * g.s * g.hq * g.d, 0),
           std::vector<double>(g.b * g.hq * g.s * g.t, 0)};
  for (int64_t b = 0; b < g.b; ++b)
    for (int64_t h = 0; h < g.hq; ++h) {
      const int64_t kh = h / (g.hq / g.hkv);
      for (int64_t i = 0; i < g.s; ++i) {
        std::vector<double> sc(g.t);
        std::vector<bool> vis(g.t);
        double m = -INFINITY;
        for (int64_t j = 0; j < g.t; ++j) {
          vis[j] = !(causal && j > g.t - g.s + i) && !(!key_start.empty() && j < key_start[b]);
          Acc dot = 0;
          for (int64_t e = 0; e < g.d; ++e)
            dot += static_cast<Acc>(q[((b * g.s + i) * g.hq + h) * g.d + e]) *
                   static_cast<Acc>(k[((b * g.t + j) * g.hkv + kh) * g.d + e]);
          sc[j] = static_cast<double>(dot) * scale;
          if (vis[j]) m = std::max(m, sc[j]);
        }
        Acc sum = 0;
        for (int64_t j = 0; j < g.t; ++j)
          if (vis[j]) sum += static_cast<Acc>(std::exp(sc[j] - m));
        for (int64_t j = 0; j < g.t; ++j) {
          const double p = vis[j] ? std::exp(sc[j] - m) / static_cast<double>(sum) : 0.0;
          r.probs[((b * g.hq + h) * g.s + i) * g.t + j] = p;
          const double pr = round_to_dtype(p, dtype);
          for (int64_t e = 0; e < g.d; ++e)
            r.out[((b * g.s + i) * g.hq + h) * g.d + e] +=
                pr * v[((b * g.t + j) * g.hkv + kh) * g.d + e];
        }
      }
    }
  return r;
}

struct RefGrads {
  std::vector<double> dq, dk, dv;
};

// Gradients of out = round(P)·V with P = softmax(scale·q·kᵀ + mask), from given probabilities.
RefGrads ref_attention_backward(const std::vector<double>& dout, const std::vector<double>& q,
                                const std::vector<double>& k, const std::vector<double>& v,
                                const std::vector<double>& probs, const Geometry& g, double scale,
                                DType dtype) {
  RefGrads r{std::vector<double>(q.size(), 0), std::vector<double>(k.size(), 0),
             std::vector<double>(v.size(), 0)};
  for (int64_t b = 0; b < g.b; ++b)
    for (int64_t h = 0; h < g.hq; ++h) {
      const int64_t kh = h / (g.hq / g.hkv);
      for (int64_t i = 0; i < g.s; ++i) {
        const double* p = &probs[((b * g.hq + h) * g.s + i) * g.t];
        const int64_t qo = ((b * g.s + i) * g.hq + h) * g.d;
        std::vector<double> dp(g.t, 0);
        double sum = 0;
        for (int64_t j = 0; j < g.t; ++j) {
          const int64_t ko = ((b * g.t + j) * g.hkv + kh) * g.d;
          for (int64_t e = 0; e < g.d; ++e) {
            dp[j] += dout[qo + e] * v[ko + e];
            r.dv[ko + e] += round_to_dtype(p[j], dtype) * dout[qo + e];
          }
          sum += p[j] * dp[j];
        }
        for (int64_t j = 0; j < g.t; ++j) {
          const double ds = p[j] * (dp[j] - sum) * scale;
          const int64_t ko = ((b * g.t + j) * g.hkv + kh) * g.d;
          for (int64_t e = 0; e < g.d; ++e) {
            r.dq[qo + e] += ds * k[ko + e];
            r.dk[ko + e] += ds * q[qo + e];
          }
        }
      }
    }
  return r;
}

struct Case {
  Geometry g;
  bool causal;
  bool padded;  // key_start = {0, 3}
  float scale;  // 0 = 1/sqrt(d)
};

const Case kCases[] = {
    {{2, 5, 5, 4, 2, 8}, true, false, 0},      // square causal, GQA 2
    {{2, 3, 9, 4, 1, 7}, true, true, 0},       // decode-like S < T, MQA, left padding, odd d
    {{1, 1, 6, 2, 2, 33}, true, false, 0.3f},  // single query, custom scale
    {{2, 4, 4, 6, 3, 16}, false, true, 0},     // not causal, padded
};

TEST(Attention, ForwardAndBackwardMatchReference) {
  uint64_t seed = 1;
  for (DType dt : kTestDtypes)
    for (const Case& c : kCases)
      for (Layout l : {Layout::Contiguous, Layout::Transposed, Layout::Strided}) {
        const Geometry& g = c.g;
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dt) << " B" << g.b << " S" << g.s << " T" << g.t << " Hq" << g.hq
                     << " Hkv" << g.hkv << " D" << g.d << " causal " << c.causal << " padded "
                     << c.padded << " " << layout_name(l));
        Tensor q = with_layout(random_tensor({g.b, g.s, g.hq, g.d}, dt, seed++, -2, 2), l);
        Tensor k = with_layout(random_tensor({g.b, g.t, g.hkv, g.d}, dt, seed++, -2, 2), l);
        Tensor v =
            with_layout(random_tensor({g.b, g.t, g.hkv, g.d}, dt, seed++), Layout::PaddedRows);
        Tensor key_start = Tensor::from_ints({0, 3}, {2}, DType::I32);
        ops::AttentionOptions o;
        o.causal = c.causal;
        o.scale = c.scale;
        o.key_start = c.padded ? &key_start.view() : nullptr;
        Tensor out = empty_with_layout({g.b, g.s, g.hq, g.d}, dt, Layout::PaddedRows);
        Tensor probs = Tensor::empty({g.b, g.hq, g.s, g.t}, DType::F32);
        ops::attention(q, k, v, out, o, &probs.view());
        const double scale = c.scale != 0 ? c.scale : 1 / std::sqrt(static_cast<double>(g.d));
        const std::vector<int64_t> ks =
            c.padded ? std::vector<int64_t>{0, 3} : std::vector<int64_t>{};
        const auto qv = values(q), kv = values(k), vv = values(v);
        const RefOut ref = ref_attention<double>(qv, kv, vv, g, scale, c.causal, ks, dt);
        const RefOut naive = ref_attention<float>(qv, kv, vv, g, scale, c.causal, ks, dt);
        EXPECT_TRUE(all_close(out, ref.out, naive_bound(ref.out, naive.out)));
        if (dt != DType::F32) EXPECT_GE(exact_fraction(out, ref.out), 0.9);
        EXPECT_TRUE(all_close(probs, ref.probs, naive_bound(ref.probs, naive.probs)));

        Tensor dout = with_layout(random_tensor({g.b, g.s, g.hq, g.d}, dt, seed++), l);
        Tensor dq = empty_with_layout({g.b, g.s, g.hq, g.d}, dt, Layout::Strided);
        Tensor dk = empty_with_layout({g.b, g.t, g.hkv, g.d}, dt, Layout::Transposed);
        Tensor dv = empty_with_layout({g.b, g.t, g.hkv, g.d}, dt, Layout::Contiguous);
        ops::attention_backward(dout, q, k, v, probs, dq, dk, dv, o);
        const auto pv = values(probs);
        const RefGrads gr = ref_attention_backward(values(dout), qv, kv, vv, pv, g, scale, dt);
        // bound: the float-accumulated forward's error propagated is not available here, so
        // use f32 accumulation error over the T·D-term reductions, relative to the output scale
        auto bound = [&](const std::vector<double>& r) {
          double mx = 0;
          for (double e : r) mx = std::max(mx, std::fabs(e));
          return std::vector<double>(r.size(),
                                     4 * g.t * g.d * unit_roundoff(DType::F32) * (mx + 1));
        };
        EXPECT_TRUE(all_close(dq, gr.dq, bound(gr.dq)));
        EXPECT_TRUE(all_close(dk, gr.dk, bound(gr.dk)));
        EXPECT_TRUE(all_close(dv, gr.dv, bound(gr.dv)));
      }
}

TEST(Attention, FullyMaskedRowGivesZerosNotNaN) {
  // key_start beyond the queries' visible window: batch 1's rows see nothing.
  const Geometry g{2, 2, 4, 2, 1, 4};
  Tensor q = random_tensor({2, 2, 2, 4}, DType::F32, 80),
         k = random_tensor({2, 4, 1, 4}, DType::F32, 81);
  Tensor v = random_tensor({2, 4, 1, 4}, DType::F32, 82);
  Tensor key_start = Tensor::from_ints({0, 4}, {2}, DType::I32);
  ops::AttentionOptions o;
  o.key_start = &key_start.view();
  Tensor out = Tensor::empty({2, 2, 2, 4}, DType::F32),
         probs = Tensor::empty({2, 2, 2, 4}, DType::F32);
  ops::attention(q, k, v, out, o, &probs.view());
  const auto ov = values(out.select(0, 1)), pv = values(probs.select(0, 1));
  for (double e : ov) EXPECT_EQ(e, 0.0);
  for (double e : pv) EXPECT_EQ(e, 0.0);
  Tensor dq = Tensor::empty({2, 2, 2, 4}, DType::F32), dk = Tensor::empty({2, 4, 1, 4}, DType::F32);
  Tensor dv = Tensor::empty({2, 4, 1, 4}, DType::F32);
  ops::attention_backward(random_tensor({2, 2, 2, 4}, DType::F32, 83), q, k, v, probs, dq, dk, dv,
                          o);
  for (double e : values(dq.select(0, 1))) EXPECT_EQ(e, 0.0);
  for (double e : values(dk.select(0, 1))) EXPECT_EQ(e, 0.0);
  (void)g;
}

TEST(AttentionBackward, FiniteDifferencesF64WithGqaCausalAndPadding) {
  const Geometry g{2, 3, 5, 4, 2, 3};
  Tensor q = random_tensor({g.b, g.s, g.hq, g.d}, DType::F64, 90, -1, 1);
  Tensor k = random_tensor({g.b, g.t, g.hkv, g.d}, DType::F64, 91, -1, 1);
  Tensor v = random_tensor({g.b, g.t, g.hkv, g.d}, DType::F64, 92);
  Tensor w = random_tensor({g.b, g.s, g.hq, g.d}, DType::F64, 93);
  Tensor key_start = Tensor::from_ints({0, 1}, {2}, DType::I32);
  ops::AttentionOptions o;
  o.key_start = &key_start.view();
  Tensor out = Tensor::empty({g.b, g.s, g.hq, g.d}, DType::F64);
  Tensor probs = Tensor::empty({g.b, g.hq, g.s, g.t}, DType::F64);
  const auto wv = values(w);
  auto loss = [&] {
    ops::attention(q, k, v, out, o, &probs.view());
    return weighted_sum(out, wv);
  };
  loss();
  Tensor dq = Tensor::empty(q.sizes(), DType::F64), dk = Tensor::empty(k.sizes(), DType::F64);
  Tensor dv = Tensor::empty(v.sizes(), DType::F64);
  ops::attention_backward(w, q, k, v, probs, dq, dk, dv, o);
  const Tolerance tol{1e-8, 1e-6};
  EXPECT_TRUE(all_close(dq, numeric_gradient(q, loss), tol));
  EXPECT_TRUE(all_close(dk, numeric_gradient(k, loss), tol));
  EXPECT_TRUE(all_close(dv, numeric_gradient(v, loss), tol));
}

}  // namespace
}  // namespace hk
