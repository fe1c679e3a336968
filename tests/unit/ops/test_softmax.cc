// softmax and softmax_backward on CPU against double references (odd widths, layouts, aliasing)
// and the backward by finite differences in f64.
#include <gtest/gtest.h>

#include <cmath>

#include "common/op_testing.h"
#include "hk/ops.h"

namespace hk {
namespace {

using namespace hk::test;

template <class Acc>
std::vector<double> ref_softmax(const std::vector<double>& x, int64_t rows, int64_t n) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY;
    for (int64_t j = 0; j < n; ++j) m = std::max(m, x[r * n + j]);
    Acc s = 0;
    for (int64_t j = 0; j < n; ++j) s += static_cast<Acc>(std::exp(x[r * n + j] - m));
    for (int64_t j = 0; j < n; ++j)
      y[r * n + j] = std::exp(x[r * n + j] - m) / static_cast<double>(s);
  }
  return y;
}

template <class Acc>
std::vector<double> ref_softmax_backward(const std::vector<double>& g, const std::vector<double>& y,
                                         int64_t rows, int64_t n) {
  std::vector<double> dx(g.size());
  for (int64_t r = 0; r < rows; ++r) {
    Acc dot = 0;
    for (int64_t j = 0; j < n; ++j) dot += static_cast<Acc>(g[r * n + j] * y[r * n + j]);
    for (int64_t j = 0; j < n; ++j)
      dx[r * n + j] = y[r * n + j] * (g[r * n + j] - static_cast<double>(dot));
  }
  return dx;
}

TEST(Softmax, ForwardAndBackwardMatchReference) {
  uint64_t seed = 1;
  for (DType dt : kTestDtypes)
    for (int64_t n : {1, 7, 33, 129})
      for (Layout l : kAllLayouts) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " n " << n << " " << layout_name(l));
        const int64_t rows = 6;
        Tensor x = with_layout(random_tensor({2, 3, n}, dt, seed++, -8, 8), l);
        Tensor y = empty_with_layout({2, 3, n}, dt, kAllLayouts[(static_cast<int>(l) + 1) % 4]);
        ops::softmax(x, y);
        const auto xv = values(x);
        const auto ref = ref_softmax<double>(xv, rows, n);
        EXPECT_TRUE(all_close(y, ref, naive_bound(ref, ref_softmax<float>(xv, rows, n))));

        Tensor dy = with_layout(random_tensor({2, 3, n}, dt, seed++), l);
        Tensor dx = empty_with_layout({2, 3, n}, dt, kAllLayouts[(static_cast<int>(l) + 2) % 4]);
        ops::softmax_backward(dy, y, dx);
        const auto g = values(dy), yv = values(y);
        const auto dref = ref_softmax_backward<double>(g, yv, rows, n);
        EXPECT_TRUE(
            all_close(dx, dref, naive_bound(dref, ref_softmax_backward<float>(g, yv, rows, n))));
      }
}

TEST(Softmax, InPlace) {
  Tensor x = random_tensor({4, 9}, DType::BF16, 50, -3, 3);
  const auto ref = ref_softmax<double>(values(x), 4, 9);
  ops::softmax(x, x);
  EXPECT_TRUE(all_close(x, ref));
}

TEST(SoftmaxBackward, FiniteDifferencesF64) {
  Tensor x = random_tensor({3, 5}, DType::F64, 60, -2, 2);
  Tensor w = random_tensor({3, 5}, DType::F64, 61);
  Tensor y = Tensor::empty({3, 5}, DType::F64), dx = Tensor::empty({3, 5}, DType::F64);
  const auto wv = values(w);
  auto loss = [&] {
    ops::softmax(x, y);
    return weighted_sum(y, wv);
  };
  loss();
  ops::softmax_backward(w, y, dx);
  EXPECT_TRUE(all_close(dx, numeric_gradient(x, loss), Tolerance{1e-9, 1e-7}));
}

}  // namespace
}  // namespace hk
