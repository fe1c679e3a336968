// rms_norm (forward/backward) and layer_norm on CPU against double references over dtypes, odd
// hidden sizes and layouts; Transformers' rounding of x·rstd to the input dtype is checked with
// an f32 weight/output (where it is visible); backward also by finite differences in f64.
#include <gtest/gtest.h>

#include <cmath>

#include "common/op_testing.h"
#include "hk/ops.h"

namespace hk {
namespace {

using namespace hk::test;

constexpr float kEps = 1e-6f;

// rsqrt(mean(x²) + eps) per row, accumulated in Acc.
template <class Acc>
std::vector<double> ref_rstd(const std::vector<double>& x, int64_t rows, int64_t h, double eps) {
  std::vector<double> r(rows);
  for (int64_t i = 0; i < rows; ++i) {
    Acc ss = 0;
    for (int64_t j = 0; j < h; ++j) ss += static_cast<Acc>(x[i * h + j] * x[i * h + j]);
    r[i] = 1 / std::sqrt(static_cast<double>(ss) / h + eps);
  }
  return r;
}

// y = round(x·r to x's dtype)·w.
std::vector<double> ref_rms_norm(const std::vector<double>& x, const std::vector<double>& w,
                                 int64_t rows, int64_t h, DType x_dtype) {
  const auto r = ref_rstd<double>(x, rows, h, kEps);
  std::vector<double> y(x.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < h; ++j)
      y[i * h + j] = round_to_dtype(x[i * h + j] * r[i], x_dtype) * w[j];
  return y;
}

TEST(RmsNorm, MatchesReferenceOverDtypesSizesAndLayouts) {
  uint64_t seed = 1;
  for (DType dt : kTestDtypes)
    for (int64_t h : {1, 7, 33, 129})
      for (Layout lx : kAllLayouts) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dt) << " H " << h << " x " << layout_name(lx));
        const int64_t rows = 2 * 5;
        Tensor x = with_layout(random_tensor({2, 5, h}, dt, seed++, -2, 2), lx);
        Tensor w = random_tensor({h}, dt, seed++, 0.5, 1.5);
        Tensor y = empty_with_layout({2, 5, h}, dt, kAllLayouts[(static_cast<int>(lx) + 1) % 4]);
        Tensor rstd = Tensor::empty({2, 5}, DType::F32);
        ops::rms_norm(x, w, kEps, y, &rstd.view());
        const auto xv = values(x);
        const auto ref = ref_rms_norm(xv, values(w), rows, h, dt);
        EXPECT_TRUE(all_close(y, ref));
        if (dt != DType::F32 && rows * h > 30) EXPECT_GE(exact_fraction(y, ref), 0.97);
        const auto r = ref_rstd<double>(xv, rows, h, kEps);
        EXPECT_TRUE(all_close(rstd, r, naive_bound(r, ref_rstd<float>(xv, rows, h, kEps))));
      }
}

TEST(RmsNorm, RoundsNormalisedValueToInputDtypeBeforeWeight) {
  // bf16 x with an f32 weight and f32 output: y = f32(round_bf16(x·r))·w keeps f32 precision,
  // so skipping the intermediate rounding would be off by ~2^-9 relative.
  Tensor x = random_tensor({4, 65}, DType::BF16, 9, -3, 3);
  Tensor w = random_tensor({65}, DType::F32, 10, 0.5, 1.5);
  Tensor y = Tensor::empty({4, 65}, DType::F32);
  ops::rms_norm(x, w, kEps, y);
  EXPECT_TRUE(all_close(y, ref_rms_norm(values(x), values(w), 4, 65, DType::BF16)));
}

TEST(RmsNorm, OutputMayAliasInput) {
  Tensor x = random_tensor({3, 17}, DType::BF16, 12);
  Tensor w = random_tensor({17}, DType::BF16, 13);
  const auto ref = ref_rms_norm(values(x), values(w), 3, 17, DType::BF16);
  ops::rms_norm(x, w, kEps, x);
  EXPECT_TRUE(all_close(x, ref));
}

// dx and dweight of y = x·r·w, with dweight against round(x·r) as autograd saves it.
template <class Acc>
void ref_rms_backward(const std::vector<double>& g, const std::vector<double>& x,
                      const std::vector<double>& w, int64_t rows, int64_t h, DType x_dtype,
                      std::vector<double>& dx, std::vector<double>& dw) {
  const auto r = ref_rstd<Acc>(x, rows, h, kEps);
  dx.assign(x.size(), 0);
  std::vector<Acc> dwa(dw.begin(), dw.end());
  for (int64_t i = 0; i < rows; ++i) {
    Acc dot = 0;
    for (int64_t j = 0; j < h; ++j) dot += static_cast<Acc>(g[i * h + j] * w[j] * x[i * h + j]);
    for (int64_t j = 0; j < h; ++j) {
      dx[i * h + j] = r[i] * g[i * h + j] * w[j] -
                      r[i] * r[i] * r[i] * static_cast<double>(dot) / h * x[i * h + j];
      dwa[j] += static_cast<Acc>(g[i * h + j] * round_to_dtype(x[i * h + j] * r[i], x_dtype));
    }
  }
  dw.assign(dwa.begin(), dwa.end());
}

TEST(AddRmsNorm, IsAddThenRmsNorm) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    Tensor h = random_tensor({4, 3, 65}, dt, 11), d = random_tensor({4, 3, 65}, dt, 12);
    Tensor w = random_tensor({65}, dt, 13);
    Tensor ref_h = h.clone(), ref_y = Tensor::empty({4, 3, 65}, dt);
    ops::add(ref_h, d, ref_h);
    ops::rms_norm(ref_h, w, kEps, ref_y);
    Tensor y = Tensor::empty({4, 3, 65}, dt);
    ops::add_rms_norm(h, d, w, kEps, y);
    EXPECT_EQ(h.to_doubles(), ref_h.to_doubles()) << dtype_name(dt);
    EXPECT_EQ(y.to_doubles(), ref_y.to_doubles()) << dtype_name(dt);
  }
  Tensor h = random_tensor({2, 8}, DType::F32, 1), w = random_tensor({8}, DType::F32, 2);
  HK_EXPECT_INVALID(ops::add_rms_norm(h, h, w, kEps, h), "add_rms_norm");
  HK_EXPECT_INVALID(ops::add_rms_norm(h, random_tensor({2, 8}, DType::BF16, 3), w, kEps,
                                      Tensor::empty({2, 8}, DType::F32)),
                    "add_rms_norm");
}

TEST(RmsNormBackward, MatchesReference) {
  uint64_t seed = 100;
  for (DType dt : kTestDtypes)
    for (int64_t h : {1, 7, 129})
      for (bool use_rstd : {false, true})
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " H " << h << " rstd " << use_rstd
                                            << " accumulate " << accumulate);
          const int64_t rows = 6;
          Tensor x = with_layout(random_tensor({rows, h}, dt, seed++, -2, 2), Layout::Transposed);
          Tensor w = random_tensor({h}, dt, seed++, 0.5, 1.5);
          Tensor dy = with_layout(random_tensor({rows, h}, dt, seed++), Layout::Strided);
          Tensor rstd = Tensor::empty({rows}, DType::F32);
          Tensor y = Tensor::empty({rows, h}, dt);
          ops::rms_norm(x, w, kEps, y, &rstd.view());
          Tensor dx = empty_with_layout({rows, h}, dt, Layout::PaddedRows);
          Tensor dw0 = random_tensor({h}, DType::F32, seed++);
          Tensor dw = with_layout(dw0, Layout::Strided);
          ops::rms_norm_backward(dy, x, w, kEps, use_rstd ? &rstd.view() : nullptr, dx, &dw.view(),
                                 accumulate);
          const auto g = values(dy), xv = values(x), wv = values(w);
          std::vector<double> dx_ref, dw_ref = accumulate ? values(dw0) : std::vector<double>(h, 0);
          std::vector<double> dx_naive, dw_naive = dw_ref;
          ref_rms_backward<double>(g, xv, wv, rows, h, dt, dx_ref, dw_ref);
          ref_rms_backward<float>(g, xv, wv, rows, h, dt, dx_naive, dw_naive);
          EXPECT_TRUE(all_close(dx, dx_ref, naive_bound(dx_ref, dx_naive)));
          EXPECT_TRUE(all_close(dw, dw_ref, naive_bound(dw_ref, dw_naive)));
        }
}

TEST(RmsNormBackward, FiniteDifferencesF64) {
  const int64_t rows = 3, h = 5;
  Tensor x = random_tensor({rows, h}, DType::F64, 200, -2, 2);
  Tensor w = random_tensor({h}, DType::F64, 201, 0.5, 1.5);
  Tensor wts = random_tensor({rows, h}, DType::F64, 202);
  Tensor y = Tensor::empty({rows, h}, DType::F64);
  const auto wv = values(wts);
  auto loss = [&] {
    ops::rms_norm(x, w, kEps, y);
    return weighted_sum(y, wv);
  };
  Tensor dx = Tensor::empty({rows, h}, DType::F64), dw = Tensor::empty({h}, DType::F64);
  ops::rms_norm_backward(wts, x, w, kEps, nullptr, dx, &dw.view());
  const Tolerance tol{1e-7, 1e-6};
  EXPECT_TRUE(all_close(dx, numeric_gradient(x, loss), tol));
  EXPECT_TRUE(all_close(dw, numeric_gradient(w, loss), tol));
}

template <class Acc>
std::vector<double> ref_layer_norm(const std::vector<double>& x, const std::vector<double>& w,
                                   const std::vector<double>* b, int64_t rows, int64_t h) {
  std::vector<double> y(x.size());
  for (int64_t i = 0; i < rows; ++i) {
    Acc mean = 0, var = 0;
    for (int64_t j = 0; j < h; ++j) mean += static_cast<Acc>(x[i * h + j]);
    mean /= h;
    for (int64_t j = 0; j < h; ++j)
      var += (static_cast<Acc>(x[i * h + j]) - mean) * (static_cast<Acc>(x[i * h + j]) - mean);
    const double rs = 1 / std::sqrt(static_cast<double>(var) / h + kEps);
    for (int64_t j = 0; j < h; ++j)
      y[i * h + j] = (x[i * h + j] - static_cast<double>(mean)) * rs * w[j] + (b ? (*b)[j] : 0);
  }
  return y;
}

TEST(LayerNorm, MatchesReference) {
  uint64_t seed = 300;
  for (DType dt : kTestDtypes)
    for (int64_t h : {1, 7, 33, 129})
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " H " << h << " bias " << with_bias);
        Tensor x = with_layout(random_tensor({4, h}, dt, seed++, -1, 3), Layout::Strided);
        Tensor w = random_tensor({h}, dt, seed++);
        Tensor b = random_tensor({h}, dt, seed++);
        Tensor y = empty_with_layout({4, h}, dt, Layout::Transposed);
        ops::layer_norm(x, w, with_bias ? &b.view() : nullptr, kEps, y);
        const auto bv = values(b), xv = values(x), wv = values(w);
        const auto* bp = with_bias ? &bv : nullptr;
        const auto ref = ref_layer_norm<double>(xv, wv, bp, 4, h);
        EXPECT_TRUE(all_close(y, ref, naive_bound(ref, ref_layer_norm<float>(xv, wv, bp, 4, h))));
      }
}

}  // namespace
}  // namespace hk
