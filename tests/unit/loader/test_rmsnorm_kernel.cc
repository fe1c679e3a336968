// kernels-community/rmsnorm (cpu variant, from the embedded hub) against a naive double reference:
// forward and backward over f32/bf16/f16, odd sizes, strided rows, saved vs recomputed rstd,
// dweight accumulation, gemma casting, and finite differences for small f32 shapes.
#include <gtest/gtest.h>

#include <cmath>

#include "hk/kernel_loader.h"
#include "hk/layer_interfaces.h"
#include "hub_fixture.h"
#include "rmsnorm_reference.h"

namespace hk {
namespace {

KernelFunction rmsnorm_cpu() {
  static const KernelFunction fn = [] {
    const auto so = test::library_path(test::embedded_hub(), "kernels-community/rmsnorm",
                                       "heads/v1", "-cpu-", "librmsnorm.so");
    return load_kernel_library(so, "kernels-community/rmsnorm@v1")->function("RMSNorm");
  }();
  return fn;
}

struct Case {
  DType dtype;
  Shape shape;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << shape_str(c.shape);
}

class RmsNormKernel : public ::testing::TestWithParam<Case> {};

TEST_P(RmsNormKernel, ForwardAndBackwardMatchTheReference) {
  const Case c = GetParam();
  const int64_t h = c.shape.back();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < c.shape.size(); ++i) rows *= c.shape[i];
  const size_t n = static_cast<size_t>(rows * h);

  const Tensor x = Tensor::from_floats(test::random_values(n, 11), c.shape, c.dtype);
  const Tensor w = Tensor::from_floats(test::random_values(h, 12, 0.5f, 1.5f), {h}, c.dtype);
  const Tensor dy = Tensor::from_floats(test::random_values(n, 13), c.shape, c.dtype);
  RmsNormAttrs attrs;
  attrs.eps = 1e-5f;
  const Reference ref =
      reference(x.to_doubles(), w.to_doubles(), dy.to_doubles(), rows, h, c.dtype, attrs);

  const Tensor y = Tensor::zeros(c.shape, c.dtype);
  const Tensor rstd = Tensor::zeros({rows}, DType::F32);
  rmsnorm_cpu().forward({x, w}, {y, rstd}, attrs);
  expect_close(y.to_doubles(), ref.y, c.dtype, 1e-6, "y");
  expect_close(rstd.to_doubles(), ref.rstd, DType::F32, 0, "rstd");

  const Tensor dx = Tensor::zeros(c.shape, c.dtype);
  const Tensor dweight = Tensor::zeros({h}, DType::F32);
  rmsnorm_cpu().backward({dy, x, w, rstd}, {dx, dweight}, attrs);
  expect_close(dx.to_doubles(), ref.dx, c.dtype, 1e-5, "dx");
  // dweight sums `rows` products whose n was rounded to the dtype (llama casting): each term may
  // differ by one rounding of n, so the bound scales with Σ|dy·n|.
  const auto dw = dweight.to_doubles();
  for (int64_t j = 0; j < h; ++j) {
    EXPECT_NEAR(dw[j], ref.dweight[j], 1e-6 + rtol(c.dtype) * ref.dweight_abs[j])
        << "dweight[" << j << "]";
  }

  // Recomputed rstd gives the same gradients.
  const Tensor dx2 = Tensor::zeros(c.shape, c.dtype);
  rmsnorm_cpu().backward({dy, x, w}, {dx2}, attrs);
  EXPECT_EQ(dx2.to_doubles(), dx.to_doubles());
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormKernel,
                         ::testing::Values(Case{DType::F32, {1, 1}}, Case{DType::F32, {3, 7}},
                                           Case{DType::F32, {2, 5, 129}}, Case{DType::BF16, {3, 7}},
                                           Case{DType::BF16, {4, 1000}},
                                           Case{DType::BF16, {2, 3, 33}}, Case{DType::F16, {5, 17}},
                                           Case{DType::F16, {1, 2048}}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name = dtype_name(info.param.dtype);
                           for (int64_t d : info.param.shape) name += "_" + std::to_string(d);
                           return name;
                         });

TEST(RmsNormKernelCpu, HonoursStridedRowsAndAccumulatesDweight) {
  // x is every other row of a [6, 9] tensor; y a column-slice-free but row-strided view.
  const Tensor big = Tensor::from_floats(test::random_values(54, 21), {6, 9});
  const TensorView x = big.view().slice(0, 0, 6, 2);  // rows 0, 2, 4
  const Tensor w = Tensor::from_floats(test::random_values(9, 22, 0.5f, 1.5f), {9});
  const Tensor ybig = Tensor::zeros({6, 9}, DType::F32);
  const TensorView y = ybig.view().slice(0, 1, 6, 2);
  RmsNormAttrs attrs;
  rmsnorm_cpu().forward({x, w}, {y}, attrs);

  const Tensor xc = Tensor::wrap(x).contiguous();
  const Tensor yc = Tensor::zeros({3, 9}, DType::F32);
  rmsnorm_cpu().forward({xc, w}, {yc}, attrs);
  EXPECT_EQ(Tensor::wrap(y).contiguous().to_doubles(), yc.to_doubles());
  for (double v : Tensor::wrap(ybig.view().slice(0, 0, 6, 2)).contiguous().to_doubles())
    EXPECT_EQ(v, 0.0) << "rows outside the view were written";

  // Accumulate: dweight starts at 1 and gains the gradient.
  const Tensor dy = Tensor::from_floats(test::random_values(27, 23), {3, 9});
  const Tensor dx = Tensor::zeros({3, 9}, DType::F32);
  const Tensor dw_fresh = Tensor::zeros({9}, DType::F32);
  rmsnorm_cpu().backward({dy, xc, w}, {dx, dw_fresh}, attrs);
  const Tensor dw_acc = Tensor::from_floats(std::vector<float>(9, 1.0f), {9});
  attrs.flags = kAccumulateWeightGrads;
  rmsnorm_cpu().backward({dy, xc, w}, {dx, dw_acc}, attrs);
  const auto fresh = dw_fresh.to_doubles(), acc = dw_acc.to_doubles();
  for (size_t j = 0; j < fresh.size(); ++j) EXPECT_FLOAT_EQ(acc[j], 1.0 + fresh[j]);
}

TEST(RmsNormKernelCpu, BackwardMatchesFiniteDifferences) {
  // Gemma casting with offset: no rounding inside, so the loss Σ dy·y is smooth in x and w.
  const int64_t rows = 2, h = 5;
  std::vector<float> xv = test::random_values(rows * h, 31), wv = test::random_values(h, 32);
  const Tensor dy = Tensor::from_floats(test::random_values(rows * h, 33), {rows, h});
  RmsNormAttrs attrs;
  attrs.casting_mode = kRmsNormCastingGemma;
  attrs.offset = 1.0f;
  attrs.eps = 1e-3f;
  auto loss = [&](const std::vector<float>& xs, const std::vector<float>& ws) {
    const Tensor y = Tensor::zeros({rows, h}, DType::F32);
    rmsnorm_cpu().forward({Tensor::from_floats(xs, {rows, h}), Tensor::from_floats(ws, {h})}, {y},
                          attrs);
    double sum = 0;
    const auto yd = y.to_doubles(), dyd = dy.to_doubles();
    for (size_t i = 0; i < yd.size(); ++i) sum += yd[i] * dyd[i];
    return sum;
  };
  const Tensor dx = Tensor::zeros({rows, h}, DType::F32);
  const Tensor dw = Tensor::zeros({h}, DType::F32);
  rmsnorm_cpu().backward({dy, Tensor::from_floats(xv, {rows, h}), Tensor::from_floats(wv, {h})},
                         {dx, dw}, attrs);
  const float step = 1e-2f;
  const auto dxd = dx.to_doubles(), dwd = dw.to_doubles();
  for (size_t i = 0; i < xv.size(); ++i) {
    auto plus = xv, minus = xv;
    plus[i] += step;
    minus[i] -= step;
    const double numeric = (loss(plus, wv) - loss(minus, wv)) / (2 * step);
    EXPECT_NEAR(dxd[i], numeric, 2e-3 + 2e-3 * std::abs(numeric)) << "dx[" << i << "]";
  }
  for (size_t j = 0; j < wv.size(); ++j) {
    auto plus = wv, minus = wv;
    plus[j] += step;
    minus[j] -= step;
    const double numeric = (loss(xv, plus) - loss(xv, minus)) / (2 * step);
    EXPECT_NEAR(dwd[j], numeric, 2e-3 + 2e-3 * std::abs(numeric)) << "dweight[" << j << "]";
  }
}

}  // namespace
}  // namespace hk
