// cross_entropy (None/Mean/Sum, ignore_index, lse) and its backward on CPU against a double
// reference and finite differences in f64; the all-ignored batch (loss 0, zero gradients, no NaN);
// out-of-range labels; and argmax (first maximum on ties, NaN as maximum, strided rows).
#include <gtest/gtest.h>

#include <cmath>

#include "common/op_testing.h"
#include "hk/ops.h"

namespace hk {
namespace {

using namespace hk::test;
using ops::Reduction;

constexpr Reduction kReductions[] = {Reduction::None, Reduction::Mean, Reduction::Sum};

struct CeRef {
  std::vector<double> loss, lse, dlogits;
};

// Loss, lse and dlogits (for incoming dloss) in double.
CeRef ref_cross_entropy(const std::vector<double>& x, const std::vector<int64_t>& labels, int64_t n,
                        int64_t v, Reduction red, int64_t ignore,
                        const std::vector<double>& dloss) {
  CeRef r;
  r.lse.resize(n);
  std::vector<double> per(n, 0);
  int64_t count = 0;
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < v; ++j) m = std::max(m, x[i * v + j]);
    for (int64_t j = 0; j < v; ++j) s += std::exp(x[i * v + j] - m);
    r.lse[i] = m + std::log(s);
    if (labels[i] == ignore) continue;
    per[i] = r.lse[i] - x[i * v + labels[i]];
    total += per[i];
    ++count;
  }
  if (red == Reduction::None)
    r.loss = per;
  else if (red == Reduction::Sum)
    r.loss = {total};
  else
    r.loss = {count ? total / count : 0.0};
  r.dlogits.assign(x.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] == ignore) continue;
    double w = red == Reduction::None ? dloss[i] : dloss[0];
    if (red == Reduction::Mean) w /= count;
    for (int64_t j = 0; j < v; ++j)
      r.dlogits[i * v + j] = w * (std::exp(x[i * v + j] - r.lse[i]) - (j == labels[i]));
  }
  return r;
}

TEST(CrossEntropy, ForwardAndBackwardMatchReference) {
  uint64_t seed = 1;
  for (DType dt : kTestDtypes)
    for (int64_t v : {1, 7, 129})
      for (Reduction red : kReductions)
        for (int64_t ignore : {int64_t{-100}, int64_t{2}}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " V " << v << " reduction "
                                            << static_cast<int>(red) << " ignore " << ignore);
          const int64_t n = 9;
          Tensor logits = with_layout(random_tensor({n, v}, dt, seed++, -6, 6), Layout::Transposed);
          std::vector<int64_t> lv = random_ints({n}, DType::I64, 0, v, seed++).to_int64s();
          lv[1] = ignore;  // a -100 row, or class 2 treated as ignored
          lv[4] = ignore;
          if (ignore >= v) lv[1] = lv[4] = 0;  // (class 2 absent for V=1: nothing to ignore)
          Tensor labels = Tensor::from_ints(lv, {n}, DType::I32);
          ops::CrossEntropyOptions o;
          o.ignore_index = ignore;
          o.reduction = red;
          const Shape loss_shape = red == Reduction::None ? Shape{n} : Shape{};
          Tensor loss = Tensor::empty(loss_shape, DType::F32);
          Tensor lse = empty_with_layout({n}, DType::F32, Layout::Strided);
          ops::cross_entropy(logits, labels, loss, o, &lse.view());
          Tensor dloss =
              random_tensor(red == Reduction::None ? Shape{n} : Shape{1}, DType::F32, seed++);
          if (red != Reduction::None) dloss = dloss.reshape({});
          const CeRef ref = ref_cross_entropy(values(logits), lv, n, v, red, ignore, values(dloss));
          // f32 sums of ≤ V exp terms / ≤ N losses: a few hundred f32 ulps at most
          const Tolerance f32tol{1e-5, 1e-5};
          EXPECT_TRUE(all_close(loss, ref.loss, f32tol));
          EXPECT_TRUE(all_close(lse, ref.lse, f32tol));
          for (bool pass_lse : {false, true}) {
            Tensor dlogits = empty_with_layout({n, v}, dt, Layout::PaddedRows);
            ops::cross_entropy_backward(dloss, logits, labels, dlogits, o,
                                        pass_lse ? &lse.view() : nullptr);
            Tolerance tol = default_tolerance(dt);
            tol.atol = std::max(tol.atol, 1e-6);
            EXPECT_TRUE(all_close(dlogits, ref.dlogits, tol)) << "lse passed " << pass_lse;
          }
        }
}

TEST(CrossEntropy, AllIgnoredBatchGivesZeroLossAndGradients) {
  Tensor logits = random_tensor({3, 5}, DType::BF16, 20);
  Tensor labels = Tensor::from_ints({-100, -100, -100}, {3});
  for (Reduction red : kReductions) {
    SCOPED_TRACE(static_cast<int>(red));
    ops::CrossEntropyOptions o;
    o.reduction = red;
    Tensor loss = Tensor::empty(red == Reduction::None ? Shape{3} : Shape{1}, DType::F32);
    ops::cross_entropy(logits, labels, loss, o);
    for (double e : values(loss)) EXPECT_EQ(e, 0.0);
    Tensor dloss = Tensor::from_floats(std::vector<float>(loss.numel(), 1.0f), loss.sizes());
    Tensor dlogits = Tensor::empty({3, 5}, DType::BF16);
    ops::cross_entropy_backward(dloss, logits, labels, dlogits, o);
    for (double e : values(dlogits)) EXPECT_EQ(e, 0.0);
  }
}

TEST(CrossEntropy, OutOfRangeLabelThrows) {
  Tensor logits = random_tensor({2, 4}, DType::F32, 30);
  Tensor loss = Tensor::empty({}, DType::F32);
  HK_EXPECT_INVALID(ops::cross_entropy(logits, Tensor::from_ints({0, 4}, {2}), loss),
                    "cross_entropy");
  HK_EXPECT_INVALID(ops::cross_entropy(logits, Tensor::from_ints({-1, 0}, {2}), loss),
                    "cross_entropy");
}

TEST(CrossEntropyBackward, FiniteDifferencesF64) {
  const int64_t n = 4, v = 5;
  for (Reduction red : kReductions) {
    SCOPED_TRACE(static_cast<int>(red));
    Tensor logits = random_tensor({n, v}, DType::F64, 40, -3, 3);
    Tensor labels = Tensor::from_ints({3, -100, 0, 4}, {n});
    ops::CrossEntropyOptions o;
    o.reduction = red;
    const Shape ls = red == Reduction::None ? Shape{n} : Shape{};
    Tensor loss = Tensor::empty(ls, DType::F64);
    Tensor dloss =
        random_tensor(red == Reduction::None ? Shape{n} : Shape{1}, DType::F64, 41).reshape(ls);
    const auto wv = values(dloss);
    auto f = [&] {
      ops::cross_entropy(logits, labels, loss, o);
      return weighted_sum(loss, wv);
    };
    Tensor dlogits = Tensor::empty({n, v}, DType::F64);
    ops::cross_entropy_backward(dloss, logits, labels, dlogits, o);
    EXPECT_TRUE(all_close(dlogits, numeric_gradient(logits, f), Tolerance{1e-9, 1e-7}));
  }
}

TEST(Argmax, FirstMaximumNaNAndLayouts) {
  for (DType dt : kTestDtypes)
    for (Layout l : kAllLayouts) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " " << layout_name(l));
      Tensor x = with_layout(random_tensor({3, 4, 33}, dt, 50), l);
      Tensor out = empty_with_layout({3, 4}, DType::I64, Layout::Strided);
      ops::argmax(x, out);
      const auto xv = values(x);
      std::vector<int64_t> ref;
      for (int64_t r = 0; r < 12; ++r) {
        int64_t best = 0;
        for (int64_t j = 1; j < 33; ++j)
          if (xv[r * 33 + j] > xv[r * 33 + best]) best = j;
        ref.push_back(best);
      }
      EXPECT_EQ(Tensor::wrap(out).to_int64s(), ref);
    }
  Tensor ties = Tensor::from_floats({1, 3, 3, 2, 0, 0, 0, 0, NAN, 5, NAN, 1}, {3, 4});
  Tensor out = Tensor::empty({3}, DType::I64);
  ops::argmax(ties, out);
  EXPECT_EQ(out.to_int64s(), (std::vector<int64_t>{1, 0, 0}));
}

}  // namespace
}  // namespace hk
