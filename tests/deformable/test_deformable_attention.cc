// Multi-scale deformable attention (multi_scale_deformable_attention@1): the built-in op and the
// layer's hub kernel (kernels-community/deformable-detr) against Transformers'
// MultiScaleDeformableAttention (tests/fixtures/deformable/msda.json, float64, from
// tools/fixtures/make_deformable_fixture.py) and against finite differences, forward and
// backward, over dtypes, odd level sizes, points outside the maps and non-contiguous views; the
// layer bound by kernelize through the default table. Compiled twice: cpu (CI) and, with
// HK_DEFORMABLE_CUDA, the cuda op and the cuda kernel variant (label gpu), both compared with the
// f64 cpu results.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "hk/deformable_attention.h"
#include "hk/error.h"
#include "hk/hub.h"
#include "hk/kernelize.h"
#include "hk/ops.h"

namespace hk {
namespace {

#ifdef HK_DEFORMABLE_CUDA
Device dev() {
  return Device::cuda(0);
}
#else
Device dev() {
  return Device::cpu();
}
#endif

using Shapes = std::vector<std::pair<int64_t, int64_t>>;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

Tensor f64(const std::vector<double>& values, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::F64);
  std::memcpy(t.view().ptr(), values.data(), values.size() * sizeof(double));
  return t;
}

// A case: the problem's tensors in f64 on the cpu, and (from the fixture) the reference results.
struct Case {
  int64_t b, q, h, d, p;
  Shapes shapes;
  Tensor value, loc, att, dout;
  std::vector<double> out, dvalue, dloc, datt;  // empty when not from the fixture
  int64_t rows() const {
    int64_t s = 0;
    for (auto [hh, ww] : shapes) s += hh * ww;
    return s;
  }
  int64_t levels() const { return static_cast<int64_t>(shapes.size()); }
};

std::vector<Case> fixture_cases() {
  std::ifstream in(env("HK_SOURCE_DIR") + "/tests/fixtures/deformable/msda.json");
  EXPECT_TRUE(in) << "missing tests/fixtures/deformable/msda.json";
  const auto j = nlohmann::json::parse(in);
  std::vector<Case> out;
  for (const auto& c : j["cases"]) {
    Case k;
    k.b = c["batch"], k.q = c["queries"], k.h = c["heads"], k.d = c["channels"];
    k.p = c["points"];
    for (const auto& s : c["spatial_shapes"]) k.shapes.emplace_back(s[0], s[1]);
    const int64_t l = k.levels();
    k.value = f64(c["value"], {k.b, k.rows(), k.h, k.d});
    k.loc = f64(c["sampling_locations"], {k.b, k.q, k.h, l, k.p, 2});
    k.att = f64(c["attention_weights"], {k.b, k.q, k.h, l, k.p});
    k.dout = f64(c["dout"], {k.b, k.q, k.h * k.d});
    k.out = c["out"].get<std::vector<double>>();
    k.dvalue = c["dvalue"].get<std::vector<double>>();
    k.dloc = c["dsampling_locations"].get<std::vector<double>>();
    k.datt = c["dattention_weights"].get<std::vector<double>>();
    out.push_back(std::move(k));
  }
  return out;
}

Case random_case(uint32_t seed, int64_t b, int64_t q, int64_t h, int64_t d, int64_t p,
                 Shapes shapes, double spread) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  Case k{b, q, h, d, p, std::move(shapes), {}, {}, {}, {}, {}, {}, {}, {}};
  const int64_t l = k.levels();
  auto fill = [&](int64_t n, auto&& draw) {
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& x : v) x = draw();
    return v;
  };
  k.value = f64(fill(b * k.rows() * h * d, [&] { return normal(rng); }), {b, k.rows(), h, d});
  k.loc = f64(fill(b * q * h * l * p * 2, [&] { return (uniform(rng) - 0.5) * spread + 0.5; }),
              {b, q, h, l, p, 2});
  k.att = f64(fill(b * q * h * l * p, [&] { return uniform(rng); }), {b, q, h, l, p});
  k.dout = f64(fill(b * q * h * d, [&] { return normal(rng); }), {b, q, h * d});
  return k;
}

// A cpu copy of `t` in `dt` (one rounding).
Tensor as_dtype(const Tensor& t, DType dt) {
  Tensor out = Tensor::empty(t.sizes(), dt);
  ops::cast(t, out);
  return out;
}

std::vector<double> host(const Tensor& t) {
  return t.to(Device::cpu()).to_doubles();
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double atol,
                  double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i])) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
}

struct Grads {
  std::vector<double> out, dvalue, dloc, datt;
};

// The built-in op in `dt` on `device` (inputs rounded to dt first).
Grads run_op(const Case& c, DType dt, Device device) {
  const Tensor v = as_dtype(c.value, dt).to(device), l = as_dtype(c.loc, dt).to(device),
               a = as_dtype(c.att, dt).to(device), g = as_dtype(c.dout, dt).to(device);
  Tensor out = Tensor::empty({c.b, c.q, c.h * c.d}, dt, device);
  ops::ms_deform_attn(v, c.shapes, l, a, out);
  Tensor dv = Tensor::empty(v.sizes(), dt, device), dl = Tensor::empty(l.sizes(), dt, device),
         da = Tensor::empty(a.sizes(), dt, device);
  const TensorView dvv = dv, dlv = dl, dav = da;
  ops::ms_deform_attn_backward(g, v, c.shapes, l, a, &dvv, &dlv, &dav);
  return {host(out), host(dv), host(dl), host(da)};
}

double tol(DType dt) {
  return dt == DType::F64 ? 1e-11 : dt == DType::F32 ? 2e-5 : dt == DType::BF16 ? 4e-2 : 6e-3;
}

TEST(DeformableAttention, BuiltinMatchesTransformersForwardAndBackward) {
  const auto cases = fixture_cases();
  ASSERT_EQ(cases.size(), 2u);
  for (const Case& c : cases) {
    const std::vector<DType> dtypes = dev().is_cpu()
                                          ? std::vector<DType>{DType::F64, DType::F32}
                                          : std::vector<DType>{DType::F32, DType::BF16, DType::F16};
    for (DType dt : dtypes) {
      SCOPED_TRACE(dtype_name(dt));
      const Grads r = run_op(c, dt, dev());
      const double t = tol(dt);
      expect_close(r.out, c.out, t, t, "out");
      expect_close(r.dvalue, c.dvalue, t, t, "dvalue");
      expect_close(r.datt, c.datt, 4 * t, 4 * t, "dattention_weights");
      // d(location) carries the map size (x = loc·w − 0.5): scale the tolerance with it
      expect_close(r.dloc, c.dloc, 8 * t, 8 * t, "dsampling_locations");
    }
  }
}

TEST(DeformableAttention, BackwardMatchesFiniteDifferences) {
  if (!dev().is_cpu()) GTEST_SKIP() << "finite differences run in f64 on the cpu variant";
  Case c = random_case(3, 1, 3, 2, 3, 2, {{3, 5}, {2, 2}}, 1.3);
  const Grads r = run_op(c, DType::F64, Device::cpu());
  // loss = Σ out·dout; central differences on a sample of every input's elements
  auto loss = [&](const Case& k) {
    Tensor out = Tensor::empty({k.b, k.q, k.h * k.d}, DType::F64);
    ops::ms_deform_attn(k.value, k.shapes, k.loc, k.att, out);
    const auto o = out.to_doubles(), g = k.dout.to_doubles();
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * g[i];
    return s;
  };
  struct Input {
    Tensor Case::*member;
    const std::vector<double>* grad;
    const char* name;
  };
  for (const Input& in :
       {Input{&Case::value, &r.dvalue, "value"}, Input{&Case::loc, &r.dloc, "sampling_locations"},
        Input{&Case::att, &r.datt, "attention_weights"}}) {
    const int64_t n = (c.*in.member).numel();
    for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / 23)) {
      Case k = c;
      k.*in.member = (c.*in.member).clone();
      double* data = static_cast<double*>((k.*in.member).view().ptr());
      const double x = data[i], eps = 1e-6;
      data[i] = x + eps;
      const double up = loss(k);
      data[i] = x - eps;
      const double down = loss(k);
      data[i] = x;
      EXPECT_NEAR((*in.grad)[i], (up - down) / (2 * eps), 1e-6) << in.name << "[" << i << "]";
    }
  }
}

TEST(DeformableAttention, StridedViewsGiveTheContiguousResult) {
  Case c = random_case(5, 2, 4, 2, 6, 2, {{4, 3}, {3, 3}}, 1.2);
  const Grads want = run_op(c, DType::F32, dev());
  // value as a [B, S, H, D] view of a [B, S, D, H] tensor; out written through a transposed view
  const Tensor v = as_dtype(c.value, DType::F32).permute({0, 1, 3, 2}).contiguous().to(dev());
  const TensorView vview = v.view().permute({0, 1, 3, 2});
  const Tensor l = as_dtype(c.loc, DType::F32).to(dev()), a = as_dtype(c.att, DType::F32).to(dev());
  Tensor out_t = Tensor::empty({c.h * c.d, c.q, c.b}, DType::F32, dev());
  const TensorView out = out_t.view().permute({2, 1, 0});
  ops::ms_deform_attn(vview, c.shapes, l, a, out);
  expect_close(host(Tensor::wrap(out).contiguous()), want.out, 1e-6, 1e-6, "strided out");
}

TEST(DeformableAttention, BadShapesAreRefusedWithASentence) {
  Case c = random_case(7, 1, 2, 2, 3, 2, {{2, 2}, {1, 3}}, 1.0);
  Tensor out = Tensor::empty({1, 2, 6}, DType::F64);
  try {
    ops::ms_deform_attn(c.value, {{2, 2}, {1, 2}}, c.loc, c.att, out);
    ADD_FAILURE() << "levels not summing to S were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("levels' h·w sum to"), std::string::npos) << e.what();
  }
  Tensor small = Tensor::empty({1, 2, 5}, DType::F64);
  EXPECT_THROW(ops::ms_deform_attn(c.value, c.shapes, c.loc, c.att, small), InvalidArgument);
  EXPECT_THROW(ops::ms_deform_attn(c.value, c.shapes, c.att, c.att, out), InvalidArgument);
}

// The layer in a module tree, bound by kernelize through the default table.
class DeformableKernel : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::make_shared<nn::Module>("Root");
    layer_ = root_->register_module("msda", std::make_shared<nn::MultiScaleDeformableAttention>());
  }
  KernelizeReport bind(Mode mode, DType dtype) {
    hub::HubConfig hc = hub::HubConfig::from_environment();
    hc.endpoint.clear();
    hc.hub_dir = env("HK_BINARY_DIR") + "/hub";
    hc.extra_hub_dirs.clear();
    hc.local_kernels.clear();
    KernelizeOptions o;
    o.device = dev();
    o.dtype = dtype;
    o.hub = std::make_shared<hub::Hub>(hc);
    return kernelize(*root_, mode, o);
  }
  std::shared_ptr<nn::Module> root_;
  std::shared_ptr<nn::MultiScaleDeformableAttention> layer_;
};

TEST_F(DeformableKernel, HubKernelMatchesTheBuiltinForwardAndBackward) {
  for (const Case& c : fixture_cases()) {
    for (DType dt : dev().is_cpu() ? std::vector<DType>{DType::F32, DType::BF16}
                                   : std::vector<DType>{DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(dtype_name(dt));
      const KernelizeReport report = bind(Mode::Training, dt);
      const LayerDecision* d = report.find("msda");
      ASSERT_NE(d, nullptr);
      ASSERT_EQ(d->kernel, "kernels-community/deformable-detr:MultiScaleDeformableAttention")
          << d->reason;
      EXPECT_EQ(layer_->impl()->name(), d->kernel);
      const Tensor v = as_dtype(c.value, dt).to(dev()), l = as_dtype(c.loc, dt).to(dev()),
                   a = as_dtype(c.att, dt).to(dev()), g = as_dtype(c.dout, dt).to(dev());
      Tensor out = Tensor::empty({c.b, c.q, c.h * c.d}, dt, dev());
      layer_->forward(v, c.shapes, l, a, out);
      Tensor dv = Tensor::empty(v.sizes(), dt, dev()), dl = Tensor::empty(l.sizes(), dt, dev()),
             da = Tensor::empty(a.sizes(), dt, dev());
      const TensorView dvv = dv, dlv = dl, dav = da;
      layer_->backward(g, v, c.shapes, l, a, &dvv, &dlv, &dav);
      const double t = tol(dt);
      expect_close(host(out), c.out, t, t, "kernel out");
      expect_close(host(dv), c.dvalue, t, t, "kernel dvalue");
      expect_close(host(da), c.datt, 4 * t, 4 * t, "kernel dattention_weights");
      expect_close(host(dl), c.dloc, 8 * t, 8 * t, "kernel dsampling_locations");
      // a strided input goes through a contiguous copy, with the same result
      const Tensor vt = v.transpose(2, 3).contiguous();
      Tensor out2 = Tensor::empty({c.b, c.q, c.h * c.d}, dt, dev());
      layer_->forward(Tensor::wrap(vt.view().transpose(2, 3)), c.shapes, l, a, out2);
      expect_close(host(out2), host(out), 0, 0, "kernel out through a strided value");
      layer_->reset_impl();
    }
  }
}

TEST_F(DeformableKernel, WithoutKernelsTheBuiltinRuns) {
  hub::HubConfig hc;
  KernelizeOptions o;
  o.device = dev();
  o.use_kernels = false;
  const KernelizeReport report = kernelize(*root_, Mode::Inference, o);
  EXPECT_TRUE(report.find("msda")->kernel.empty());
  EXPECT_EQ(layer_->impl()->name(), "builtin");
  Case c = random_case(9, 1, 2, 1, 2, 1, {{2, 2}}, 1.0);
  Tensor out = Tensor::empty({1, 2, 2}, DType::F32, dev());
  layer_->forward(as_dtype(c.value, DType::F32).to(dev()), c.shapes,
                  as_dtype(c.loc, DType::F32).to(dev()), as_dtype(c.att, DType::F32).to(dev()),
                  out);
  const Grads want = run_op(c, DType::F32, dev());
  expect_close(host(out), want.out, 0, 0, "builtin layer");
}

}  // namespace
}  // namespace hk
