// GPU (label gpu): the cuda variant of kernels-community/rmsnorm from the embedded hub, against
// the double reference — f32/bf16/f16, vectorised (H % 8 == 0) and scalar (odd H) paths, more
// rows than the backward's partial blocks, saved and recomputed rstd, dweight accumulation and
// the workspace contract; plus a bandwidth line for one large bf16 shape.
#include <gtest/gtest.h>

#include <cstdio>

#include "hk/error.h"
#include "hk/kernel_loader.h"
#include "hk/stream.h"
#include "hub_fixture.h"
#include "rmsnorm_reference.h"

namespace hk {
namespace {

KernelFunction rmsnorm_cuda() {
  static const KernelFunction fn = [] {
    const auto so = test::library_path(test::embedded_hub(), "kernels-community/rmsnorm",
                                       "heads/v1", "-cu", "librmsnorm.so");
    return load_kernel_library(so, "kernels-community/rmsnorm@v1")->function("RMSNorm");
  }();
  return fn;
}

Tensor workspace_for(const KernelFunction& fn, const std::vector<TensorView>& in,
                     const std::vector<TensorView>& out, const RmsNormAttrs& attrs) {
  const size_t bytes = fn.workspace_size(true, in, out, &attrs, sizeof(attrs));
  return Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, Device::cuda());
}

struct Case {
  DType dtype;
  Shape shape;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << shape_str(c.shape);
}
class RmsNormCuda : public ::testing::TestWithParam<Case> {};

TEST_P(RmsNormCuda, MatchesTheReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Case c = GetParam();
  const int64_t h = c.shape.back();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < c.shape.size(); ++i) rows *= c.shape[i];
  const size_t n = static_cast<size_t>(rows * h);
  const Device gpu = Device::cuda();
  const Tensor x = Tensor::from_floats(test::random_values(n, 11), c.shape, c.dtype);
  const Tensor w = Tensor::from_floats(test::random_values(h, 12, 0.5f, 1.5f), {h}, c.dtype);
  const Tensor dy = Tensor::from_floats(test::random_values(n, 13), c.shape, c.dtype);
  RmsNormAttrs attrs;
  const Reference ref =
      reference(x.to_doubles(), w.to_doubles(), dy.to_doubles(), rows, h, c.dtype, attrs);

  const Tensor xg = x.to(gpu), wg = w.to(gpu), dyg = dy.to(gpu);
  const Tensor y = Tensor::zeros(c.shape, c.dtype, gpu);
  const Tensor rstd = Tensor::zeros({rows}, DType::F32, gpu);
  rmsnorm_cuda().forward({xg, wg}, {y, rstd}, attrs);
  expect_close(y.to(Device::cpu()).to_doubles(), ref.y, c.dtype, 1e-6, "y");
  expect_close(rstd.to(Device::cpu()).to_doubles(), ref.rstd, DType::F32, 0, "rstd");

  for (bool saved_rstd : {true, false}) {
    const Tensor dx = Tensor::zeros(c.shape, c.dtype, gpu);
    const Tensor dweight = Tensor::from_floats(std::vector<float>(h, 0.5f), {h}).to(gpu);
    RmsNormAttrs acc = attrs;
    acc.flags = kAccumulateWeightGrads;
    std::vector<TensorView> in = {dyg, xg, wg};
    if (saved_rstd) in.push_back(rstd);
    const Tensor ws = workspace_for(rmsnorm_cuda(), in, {dx, dweight}, acc);
    rmsnorm_cuda().backward(in, {dx, dweight}, acc, {Stream{}, ws.data_as<void>(), ws.nbytes()});
    expect_close(dx.to(Device::cpu()).to_doubles(), ref.dx, c.dtype, 1e-5, "dx");
    const auto dw = dweight.to(Device::cpu()).to_doubles();
    for (int64_t j = 0; j < h; ++j) {
      EXPECT_NEAR(dw[j], 0.5 + ref.dweight[j], 1e-5 + rtol(c.dtype) * ref.dweight_abs[j])
          << "dweight[" << j << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormCuda,
                         ::testing::Values(Case{DType::F32, {1, 1}}, Case{DType::F32, {3, 7}},
                                           Case{DType::F32, {300, 128}}, Case{DType::BF16, {5, 33}},
                                           Case{DType::BF16, {2, 257, 1024}},
                                           Case{DType::BF16, {4, 4096}}, Case{DType::F16, {7, 200}},
                                           Case{DType::F16, {513, 3}}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name = dtype_name(info.param.dtype);
                           for (int64_t d : info.param.shape) name += "_" + std::to_string(d);
                           return name;
                         });

TEST(RmsNormCudaContract, RefusesMissingWorkspaceAndCpuTensors) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda();
  const Tensor x = Tensor::zeros({4, 8}, DType::BF16, gpu),
               w = Tensor::zeros({8}, DType::BF16, gpu);
  const Tensor dx = Tensor::zeros({4, 8}, DType::BF16, gpu),
               dw = Tensor::zeros({8}, DType::F32, gpu);
  EXPECT_THROW(rmsnorm_cuda().backward({x, x, w}, {dx, dw}, RmsNormAttrs{}), InvalidArgument);
  const Tensor xc = Tensor::zeros({4, 8}, DType::BF16);
  EXPECT_THROW(rmsnorm_cuda().forward({xc, w}, {dx}, RmsNormAttrs{}), InvalidArgument);
}

TEST(RmsNormCudaBandwidth, LargeBf16Forward) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = Device::cuda();
  const int64_t rows = 16384, h = 4096;
  const Tensor x = Tensor::zeros({rows, h}, DType::BF16, gpu),
               w = Tensor::zeros({h}, DType::BF16, gpu);
  const Tensor y = Tensor::zeros({rows, h}, DType::BF16, gpu);
  RmsNormAttrs attrs;
  for (int i = 0; i < 3; ++i) rmsnorm_cuda().forward({x, w}, {y}, attrs);
  Event start, end;
  const int iters = 20;
  start.record();
  for (int i = 0; i < iters; ++i) rmsnorm_cuda().forward({x, w}, {y}, attrs);
  end.record();
  const double ms = Event::elapsed_ms(start, end) / iters;
  const double gbs = 2.0 * rows * h * 2 / (ms * 1e-3) / 1e9;
  std::printf("rmsnorm cuda forward bf16 [%ld, %ld]: %.3f ms, %.0f GB/s\n", static_cast<long>(rows),
              static_cast<long>(h), ms, gbs);
  EXPECT_GT(gbs, 0.0);
}

}  // namespace
}  // namespace hk
