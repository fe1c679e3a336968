// matmul, linear and linear_backward on CPU against a naive double reference (every dtype,
// transposes, odd shapes, strided operands and outputs, batching with broadcast B), and the
// linear backward against finite differences in f64.
#include <gtest/gtest.h>

#include "common/op_testing.h"
#include "hk/ops.h"

namespace hk {
namespace {

using namespace hk::test;

constexpr auto& kDtypes = kTestDtypes;

// C = alpha·op(A)·op(B) + beta·C0 over row-major values, accumulated in Acc (double: the
// reference; float: the same-dtype naive implementation that bounds the reduction error).
template <class Acc>
std::vector<double> ref_gemm(const std::vector<double>& a, const std::vector<double>& b,
                             const std::vector<double>& c0, int64_t m, int64_t n, int64_t k,
                             bool ta, bool tb, double alpha = 1, double beta = 0) {
  std::vector<double> c(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      Acc s = 0;
      for (int64_t e = 0; e < k; ++e) {
        const Acc x = static_cast<Acc>(ta ? a[e * m + i] : a[i * k + e]);
        const Acc y = static_cast<Acc>(tb ? b[j * k + e] : b[e * n + j]);
        s += x * y;
      }
      s = static_cast<Acc>(alpha) * s;
      if (beta != 0) s += static_cast<Acc>(beta) * static_cast<Acc>(c0[i * n + j]);
      c[i * n + j] = s;
    }
  return c;
}

// Checks out against the double reference with the naive-f32 reduction bound.
template <class... Args>
::testing::AssertionResult gemm_close(const TensorView& out, Args... args) {
  const auto ref = ref_gemm<double>(args...);
  return all_close(out, ref, naive_bound(ref, ref_gemm<float>(args...)));
}

TEST(Matmul, EmptyInnerDimensionScalesC) {
  for (DType dt : kDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = Tensor::empty({3, 0}, dt), b = Tensor::empty({0, 4}, dt);
    Tensor c0 = random_tensor({3, 4}, dt, 41);
    Tensor c = c0.clone();
    ops::MatmulOptions o;
    o.beta = 0.5f;
    ops::matmul(a, b, c, o);
    std::vector<double> ref = values(c0);
    for (double& e : ref) e *= 0.5;
    EXPECT_TRUE(all_close(c, ref));
    ops::matmul(Tensor::empty({0, 5}, dt), Tensor::empty({5, 4}, dt), Tensor::empty({0, 4}, dt));
  }
}

// y = x·wᵀ + bias over [rows, K] values, accumulated in Acc.
template <class Acc>
std::vector<double> ref_linear(const std::vector<double>& x, const std::vector<double>& w,
                               const std::vector<double>* bias, int64_t rows, int64_t n,
                               int64_t k) {
  auto y = ref_gemm<Acc>(x, w, {}, rows, n, k, false, true);
  if (bias)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < n; ++j)
        y[i * n + j] = static_cast<Acc>(static_cast<Acc>(y[i * n + j]) + (*bias)[j]);
  return y;
}

struct Mnk {
  int64_t m, n, k;
};

TEST(Matmul, MatchesReferenceAcrossDtypesTransposesAndLayouts) {
  const Mnk shapes[] = {{1, 1, 1}, {7, 5, 33}, {33, 129, 7}, {16, 8, 64}};
  uint64_t seed = 1;
  for (DType dt : kDtypes)
    for (const Mnk& s : shapes)
      for (int t = 0; t < 4; ++t)
        for (Layout la : kAllLayouts) {
          const bool ta = t & 1, tb = t & 2;
          const Layout lb = kAllLayouts[(static_cast<int>(la) + 1) % 4];
          const Layout lc = kAllLayouts[(static_cast<int>(la) + 2) % 4];
          SCOPED_TRACE(::testing::Message()
                       << dtype_name(dt) << " m" << s.m << " n" << s.n << " k" << s.k << " ta" << ta
                       << " tb" << tb << " layouts " << layout_name(la) << "/" << layout_name(lb)
                       << "/" << layout_name(lc));
          Tensor a =
              with_layout(random_tensor(ta ? Shape{s.k, s.m} : Shape{s.m, s.k}, dt, seed++), la);
          Tensor b =
              with_layout(random_tensor(tb ? Shape{s.n, s.k} : Shape{s.k, s.n}, dt, seed++), lb);
          Tensor c0 = random_tensor({s.m, s.n}, dt, seed++);
          Tensor c = with_layout(c0, lc);
          const double alpha = t == 3 ? 0.5 : 1.0, beta = t == 3 ? -2.0 : (t == 1 ? 1.0 : 0.0);
          ops::MatmulOptions o;
          o.trans_a = ta;
          o.trans_b = tb;
          o.alpha = static_cast<float>(alpha);
          o.beta = static_cast<float>(beta);
          ops::matmul(a, b, c, o);
          EXPECT_TRUE(
              gemm_close(c, values(a), values(b), values(c0), s.m, s.n, s.k, ta, tb, alpha, beta));
        }
}

TEST(Matmul, BatchedWithBroadcastB) {
  for (DType dt : kDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t batch = 3, m = 5, n = 9, k = 17;
    Tensor a = random_tensor({batch, m, k}, dt, 11);
    Tensor b_full = random_tensor({batch, k, n}, dt, 12);
    Tensor b_one = random_tensor({1, k, n}, dt, 13);
    for (int variant = 0; variant < 3; ++variant) {
      SCOPED_TRACE(variant);
      // 0: full batch, 1: batch 1 broadcast, 2: stride-0 batch from expand()
      Tensor b = variant == 0 ? b_full : variant == 1 ? b_one : b_one.expand({batch, k, n});
      Tensor c = empty_with_layout({batch, m, n}, dt, Layout::PaddedRows);
      ops::matmul(a, b, c);
      const auto av = values(a), bv = values(b_full), b1 = values(b_one);
      std::vector<double> ref, naive;
      for (int64_t i = 0; i < batch; ++i) {
        std::vector<double> ai(av.begin() + i * m * k, av.begin() + (i + 1) * m * k);
        std::vector<double> bi =
            variant == 0 ? std::vector<double>(bv.begin() + i * k * n, bv.begin() + (i + 1) * k * n)
                         : b1;
        const auto ci = ref_gemm<double>(ai, bi, {}, m, n, k, false, false);
        const auto ni = ref_gemm<float>(ai, bi, {}, m, n, k, false, false);
        ref.insert(ref.end(), ci.begin(), ci.end());
        naive.insert(naive.end(), ni.begin(), ni.end());
      }
      EXPECT_TRUE(all_close(c, ref, naive_bound(ref, naive)));
    }
  }
}

TEST(Matmul, LargeKHalfPrecisionUsesBlockedConversion) {
  // K large enough that 16-bit B is converted in several column blocks (block = 2^22 / K).
  const int64_t m = 3, n = 600, k = 8192;
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = random_tensor({m, k}, dt, 21);
    Tensor w = random_tensor({n, k}, dt, 22);
    Tensor c = Tensor::empty({m, n}, dt);
    ops::MatmulOptions o;
    o.trans_b = true;
    ops::matmul(a, w, c, o);
    EXPECT_TRUE(gemm_close(c.view(), values(a), values(w), std::vector<double>{}, m, n, k, false,
                           true, 1.0, 0.0));
    // the same through linear, whose bias is added per column block
    Tensor bias = random_tensor({n}, dt, 23);
    Tensor y = Tensor::empty({m, n}, dt);
    ops::linear(a, w, &bias.view(), y);
    const auto bv = values(bias), av = values(a), wv = values(w);
    const auto ref = ref_linear<double>(av, wv, &bv, m, n, k);
    EXPECT_TRUE(all_close(y, ref, naive_bound(ref, ref_linear<float>(av, wv, &bv, m, n, k))));
  }
}

TEST(Matmul, F64MatchesReferenceExactly) {
  Tensor a = random_tensor({6, 10}, DType::F64, 31);
  Tensor b = with_layout(random_tensor({10, 4}, DType::F64, 32), Layout::Transposed);
  Tensor c = Tensor::empty({6, 4}, DType::F64);
  ops::matmul(a, b, c);
  EXPECT_TRUE(all_close(c, ref_gemm<double>(values(a), values(b), {}, 6, 4, 10, false, false)));
}

TEST(Linear, MatchesReferenceWithAndWithoutBias) {
  uint64_t seed = 100;
  for (DType dt : kDtypes)
    for (Layout lx : kAllLayouts)
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dt) << " x " << layout_name(lx) << (with_bias ? " bias" : ""));
        const int64_t k = 33, n = 7;
        Tensor x = with_layout(random_tensor({2, 3, k}, dt, seed++), lx);
        Tensor w = random_tensor({n, k}, dt, seed++);
        Tensor bias = random_tensor({n}, dt, seed++);
        const Layout ly = kAllLayouts[(static_cast<int>(lx) + 1) % 4];
        Tensor y = empty_with_layout({2, 3, n}, dt, ly);
        ops::linear(x, w, with_bias ? &bias.view() : nullptr, y);
        const auto bv = values(bias), xv = values(x), wv = values(w);
        const auto* bp = with_bias ? &bv : nullptr;
        const auto ref = ref_linear<double>(xv, wv, bp, 6, n, k);
        EXPECT_TRUE(all_close(y, ref, naive_bound(ref, ref_linear<float>(xv, wv, bp, 6, n, k))));
      }
}

TEST(LinearBackward, MatchesReference) {
  uint64_t seed = 200;
  for (DType dt : kDtypes)
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " accumulate " << accumulate);
      const int64_t rows = 13, k = 9, n = 129;
      Tensor x = with_layout(random_tensor({rows, k}, dt, seed++), Layout::Transposed);
      Tensor w = random_tensor({n, k}, dt, seed++);
      Tensor dy = with_layout(random_tensor({rows, n}, dt, seed++), Layout::Strided);
      Tensor dx = empty_with_layout({rows, k}, dt, Layout::PaddedRows);
      Tensor dw0 = random_tensor({n, k}, dt, seed++);
      Tensor dw = with_layout(dw0, Layout::Transposed);
      Tensor db0 = random_tensor({n}, dt, seed++);
      Tensor db = with_layout(db0, Layout::Strided);
      ops::linear_backward(dy, x, w, &dx.view(), &dw.view(), &db.view(), accumulate);
      const auto xv = values(x), wv = values(w), g = values(dy);
      EXPECT_TRUE(
          gemm_close(dx.view(), g, wv, std::vector<double>{}, rows, k, n, false, false, 1.0, 0.0));
      EXPECT_TRUE(gemm_close(dw.view(), g, xv, values(dw0), n, k, rows, true, false, 1.0,
                             accumulate ? 1.0 : 0.0));
      std::vector<double> db_ref(n);
      std::vector<double> db_naive(n);
      const auto db0v = values(db0);
      for (int64_t j = 0; j < n; ++j) {
        db_ref[j] = accumulate ? db0v[j] : 0;
        float naive = static_cast<float>(db_ref[j]);
        for (int64_t i = 0; i < rows; ++i) {
          db_ref[j] += g[i * n + j];
          naive += static_cast<float>(g[i * n + j]);
        }
        db_naive[j] = naive;
      }
      EXPECT_TRUE(all_close(db, db_ref, naive_bound(db_ref, db_naive)));
    }
}

TEST(LinearBackward, FiniteDifferencesF64) {
  const int64_t rows = 4, k = 5, n = 3;
  Tensor x = random_tensor({rows, k}, DType::F64, 301);
  Tensor w = random_tensor({n, k}, DType::F64, 302);
  Tensor b = random_tensor({n}, DType::F64, 303);
  Tensor weights = random_tensor({rows, n}, DType::F64, 304);  // dL/dy
  Tensor y = Tensor::empty({rows, n}, DType::F64);
  const auto wv = values(weights);
  auto loss = [&] {
    ops::linear(x, w, &b.view(), y);
    return weighted_sum(y, wv);
  };
  Tensor dx = Tensor::empty({rows, k}, DType::F64), dw = Tensor::empty({n, k}, DType::F64);
  Tensor db = Tensor::empty({n}, DType::F64);
  ops::linear_backward(weights, x, w, &dx.view(), &dw.view(), &db.view(), false);
  const Tolerance tol{1e-7, 1e-6};
  EXPECT_TRUE(all_close(dx, numeric_gradient(x, loss), tol));
  EXPECT_TRUE(all_close(dw, numeric_gradient(w, loss), tol));
  EXPECT_TRUE(all_close(db, numeric_gradient(b, loss), tol));
}

}  // namespace
}  // namespace hk
