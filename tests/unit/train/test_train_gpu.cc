// Training on the GPU (ctest label gpu): the fused multi-tensor AdamW and the device grad norm
// against the CPU implementation (f32, bf16, f32 masters over bf16, odd sizes across chunk
// boundaries, undefined gradients, gradient buffers that move), a step captured into a CUDA graph
// (proof that it neither synchronises nor allocates), and the Trainer's bf16 curves on the GPU
// against Transformers in bf16 on the same GPU (golden-bf16-cuda.json, written there by
// tools/fixtures/make_trainer_fixtures.py --bf16-device cuda --bf16-only; scripts/gpu-test --train
// runs it first), with the built-in layers and with Liger's CUDA kernels, plus --bf16 over an f32
// model against the f32 curve.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "common/cuda_graph_testing.h"
#include "gpu/gpu_testing.h"
#include "hk/optim.h"
#include "trainer_test_util.h"

namespace hk {
namespace {

using gpu_testing::random_cpu;

struct OptimCase {
  const char* name;
  DType param, grad;
  bool master;
};

// A set of tensors: sizes below, at and across the 16384-element chunk, one that starts 2 bytes
// (bf16) or 4 bytes (f32) into its allocation (not 16-byte aligned: the fused kernels' element-wise
// path), and a last one without a gradient.
struct TensorSet {
  std::vector<Tensor> values, grads;
  std::vector<optim::OptimTensor> list() {
    std::vector<optim::OptimTensor> out;
    for (size_t i = 0; i < values.size(); ++i)
      out.push_back({"t" + std::to_string(i), &values[i], &grads[i], i % 2 == 0});
    return out;
  }
};

const std::vector<Shape> kShapes = {{1}, {7}, {3, 1000}, {2 * 16384 + 5}, {16384}, {4099}, {5, 3}};
constexpr size_t kMisaligned = 5;

// random_cpu on `device`; the kMisaligned tensor is a view one element into a longer one.
Tensor random_on(size_t i, DType dtype, Device device, uint32_t seed, float lo, float hi) {
  if (i != kMisaligned) {
    Tensor t = random_cpu(kShapes[i], dtype, seed, lo, hi);
    return device.is_cpu() ? t : t.to(device);
  }
  Tensor t = random_cpu({kShapes[i][0] + 1}, dtype, seed, lo, hi);
  if (!device.is_cpu()) t = t.to(device);
  return t.slice(0, 1, kShapes[i][0] + 1);
}

TensorSet make_set(const OptimCase& c, Device device, uint32_t seed) {
  TensorSet s;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    const uint32_t k = static_cast<uint32_t>(i);
    s.values.push_back(random_on(i, c.param, device, seed + k, -1.0f, 1.0f));
    s.grads.push_back(i + 1 == kShapes.size()  // no gradient
                          ? Tensor()
                          : random_on(i, c.grad, device, seed + 100 + k, -0.3f, 0.3f));
  }
  return s;
}

void new_grads(TensorSet& s, const OptimCase& c, Device device, uint32_t seed) {
  for (size_t i = 0; i + 1 < s.grads.size(); ++i)  // a new buffer: the table must follow
    s.grads[i] = random_on(i, c.grad, device, seed + static_cast<uint32_t>(i), -0.3f, 0.3f);
}

const OptimCase kOptimCases[] = {
    {"f32", DType::F32, DType::F32, false},
    {"bf16", DType::BF16, DType::BF16, false},
    {"bf16 model, f32 masters and grads", DType::BF16, DType::F32, true}};

double rtol_of(DType d) {
  return d == DType::F32 ? 2e-6 : 8e-3;  // f32: FMA contraction on the device; bf16: one ulp
}

// No two live device buffers of the case overlap: values, gradients, moments, masters. (A write
// through one into another — e.g. the bf16 model-copy store into the low half of an f32
// gradient — is the one way the f32-master case's moments can drift from the CPU's by bf16-sized
// amounts on a few elements while the f32 case, which runs the same moment arithmetic on the same
// data, matches: see FusedAdamWAndGradNormMatchTheCpu.)
::testing::AssertionResult no_overlaps(const TensorSet& set, const optim::AdamW& opt) {
  std::vector<std::pair<std::string, const Tensor*>> all;
  for (size_t i = 0; i < set.values.size(); ++i) {
    all.emplace_back("value " + std::to_string(i), &set.values[i]);
    all.emplace_back("grad " + std::to_string(i), &set.grads[i]);
  }
  const auto state = opt.state();
  for (const auto& [name, t] : state) all.emplace_back(name, &t);
  for (size_t a = 0; a < all.size(); ++a)
    for (size_t b = a + 1; b < all.size(); ++b) {
      const Tensor &x = *all[a].second, &y = *all[b].second;
      if (!x.defined() || !y.defined()) continue;
      const auto* x0 = static_cast<const char*>(x.view().ptr());
      const auto* y0 = static_cast<const char*>(y.view().ptr());
      if (x0 < y0 + y.nbytes() && y0 < x0 + x.nbytes())
        return ::testing::AssertionFailure()
               << all[a].first << " and " << all[b].first << " share device memory";
    }
  return ::testing::AssertionSuccess();
}

// Every step is compared, not only the last, so a divergence names its step. Tolerances: the
// device contracts a·b + c into FMAs (the CPU loop does not); replaying this test's arithmetic on
// the host with and without contraction moves m by at most 2e-9 and v by 2e-11 (v sums positive
// terms, so nothing cancels), far inside atol 1e-9 + 2e-6·|ref|. A bf16-sized relative error in
// a few moments is a data error, not rounding, and must fail here.
TEST(TrainGpu, FusedAdamWAndGradNormMatchTheCpu) {
  HK_REQUIRE_REAL_CUDA();
  for (const auto& c : kOptimCases) {
    TensorSet cpu = make_set(c, Device::cpu(), 11), gpu = make_set(c, Device::cuda(0), 11);
    optim::AdamWOptions o{.lr = 1e-2, .weight_decay = 0.1, .master_weights = c.master};
    optim::AdamW a_cpu(cpu.list(), o), a_gpu(gpu.list(), o);
    for (int step = 0; step < 4; ++step) {
      const double max_norm = step == 1 ? 1e9 : 0.5;  // clipping active except on step 2
      optim::GradNorm n_cpu = a_cpu.clip_grad_norm(max_norm);
      optim::GradNorm n_gpu = a_gpu.clip_grad_norm(max_norm);
      const double nc = n_cpu.norm.to_doubles()[0];
      const double ng = gpu_testing::to_cpu(n_gpu.norm).to_doubles()[0];
      EXPECT_NEAR(ng, nc, 1e-5 * nc) << c.name << " step " << step;
      EXPECT_NEAR(gpu_testing::to_cpu(n_gpu.clip_coef).to_doubles()[0],
                  n_cpu.clip_coef.to_doubles()[0], 1e-6)
          << c.name;
      // The free function over the same tensors agrees too.
      EXPECT_NEAR(
          gpu_testing::to_cpu(optim::clip_grad_norm(gpu.list(), max_norm).norm).to_doubles()[0], nc,
          1e-5 * nc);
      // The device norm (f32 partials, summed in double) may be an ulp off the CPU's double sum
      // (7e-8 relative at step 3 here); that moves m by ~3e-11.
      const double cc = n_cpu.clip_coef.to_doubles()[0];
      EXPECT_NEAR(gpu_testing::to_cpu(n_gpu.clip_coef).to_doubles()[0], cc, 1e-6 * cc)
          << c.name << " step " << step << ": clipping coefficients differ";
      a_cpu.step(1e-2 * (step + 1), &n_cpu.clip_coef);
      a_gpu.step(1e-2 * (step + 1), &n_gpu.clip_coef);
      EXPECT_TRUE(no_overlaps(gpu, a_gpu)) << c.name << " step " << step;
      {
        const auto s_cpu = a_cpu.state(), s_gpu = a_gpu.state();
        for (size_t i = 0; i < s_cpu.size(); ++i)
          if (s_cpu[i].first.rfind("exp_avg", 0) == 0)
            EXPECT_TRUE(gpu_testing::close(s_gpu[i].second, s_cpu[i].second, 1e-9,
                                           rtol_of(s_cpu[i].second.dtype())))
                << c.name << " " << s_cpu[i].first << ": first diverges at step " << step;
      }
      if (step == 2) {
        new_grads(cpu, c, Device::cpu(), 50);
        new_grads(gpu, c, Device::cuda(0), 50);
      }
    }
    for (size_t i = 0; i < cpu.values.size(); ++i)
      EXPECT_TRUE(gpu_testing::close(gpu.values[i], cpu.values[i], 1e-7, rtol_of(c.param)))
          << c.name << " tensor " << i;
    // The moments keep atol 1e-9. f32 master weights are weights: each step moves them by
    // lr·(update + wd·w) with lr up to 4e-2 here, so one f32 ulp of that product (~3e-9), taken
    // with and without FMA contraction over four steps, reaches ~1e-8 on small weights (measured on
    // the H200: ≤ 1e-8 where |w| ~ 1e-3). They get the parameters' atol (1e-7), still 1000× below
    // a bf16-sized error.
    const auto s_cpu = a_cpu.state(), s_gpu = a_gpu.state();
    ASSERT_EQ(s_cpu.size(), s_gpu.size());
    for (size_t i = 0; i < s_cpu.size(); ++i) {
      const bool master = s_cpu[i].first.rfind("master", 0) == 0;
      EXPECT_TRUE(gpu_testing::close(s_gpu[i].second, s_cpu[i].second, master ? 1e-7 : 1e-9,
                                     rtol_of(s_cpu[i].second.dtype())))
          << c.name << " " << s_cpu[i].first;
    }
  }
}

TEST(TrainGpu, ClippedAdamWStepCapturesIntoACudaGraph) {
  HK_REQUIRE_REAL_CUDA();
  const OptimCase c = kOptimCases[1];
  TensorSet cpu = make_set(c, Device::cpu(), 21), gpu = make_set(c, Device::cuda(0), 21);
  optim::AdamW a_cpu(cpu.list(), {.weight_decay = 0.01}), a_gpu(gpu.list(), {.weight_decay = 0.01});
  OwnedStream stream(Device::cuda(0));
  // First step: uploads the table, allocates the norm buffers.
  {
    optim::GradNorm n_gpu = a_gpu.clip_grad_norm(1.0, stream), n_cpu = a_cpu.clip_grad_norm(1.0);
    a_gpu.step(1e-3, &n_gpu.clip_coef, stream);
    a_cpu.step(1e-3, &n_cpu.clip_coef);
  }
  synchronize(Device::cuda(0), stream);
  // Second step captured: only kernel launches are allowed inside a capture.
  ASSERT_NO_FATAL_FAILURE(testing::capture_and_replay(
      static_cast<cudaStream_t>(stream.get().handle),
      [&] {
        optim::GradNorm n = a_gpu.clip_grad_norm(1.0, stream);
        a_gpu.step(1e-3, &n.clip_coef, stream);
      },
      1, "the step synchronised or allocated"));
  {
    optim::GradNorm n_cpu = a_cpu.clip_grad_norm(1.0);
    a_cpu.step(1e-3, &n_cpu.clip_coef);
  }
  for (size_t i = 0; i < cpu.values.size(); ++i)
    EXPECT_TRUE(gpu_testing::close(gpu.values[i], cpu.values[i], 1e-7, rtol_of(c.param))) << i;
}

nlohmann::json bf16_cuda_fixture() {
  const std::string path = test::train_fixture("golden-bf16-cuda.json");
  if (!std::filesystem::exists(path))
    throw std::runtime_error(path +
                             " is missing: run python3 tools/fixtures/make_trainer_fixtures.py "
                             "--bf16-device cuda --bf16-only on this machine (scripts/gpu-test "
                             "--train does it first)");
  return test::read_json(path)["cases"];
}

const std::vector<std::pair<std::string, std::string>> kBf16Cases = {
    {"qwen3-b2-bf16", "qwen3-tiny-bf16"}, {"llama-b2-bf16", "llama-tiny-bf16"}};

TEST(TrainGpu, Bf16CurvesMatchTransformersBf16OnTheGpu) {
  HK_REQUIRE_REAL_CUDA();
  const auto ref = bf16_cuda_fixture();
  for (const auto& [name, model] : kBf16Cases) {
    test::RunSpec spec;
    spec.model = model;
    spec.device = "cuda";
    spec.dtype = DType::BF16;
    test::expect_matches_golden(test::train_curve(spec), ref[name], test::kBf16LossTolerance,
                                name + " (cuda, built-in)", test::kBf16GradNormTolerance);
  }
}

TEST(TrainGpu, Bf16CurvesWithLigerKernelsMatchTransformersBf16) {
  HK_REQUIRE_REAL_CUDA();
  const auto ref = bf16_cuda_fixture();
  const std::vector<std::map<std::string, bool>> configs = {
      {}, {{"cross_entropy", true}, {"fused_linear_cross_entropy", false}}};
  for (const auto& [name, model] : kBf16Cases)
    for (const auto& config : configs) {
      test::RunSpec spec;
      spec.model = model;
      spec.device = "cuda";
      spec.dtype = DType::BF16;
      spec.liger = true;
      spec.liger_config = config;
      std::optional<KernelizeReport> report;
      const test::Curve curve = test::train_curve(spec, &report);
      ASSERT_TRUE(report.has_value());
      const bool mlp_bias = model == "llama-tiny-bf16";  // LigerSwiGLUMLP has no biases
      for (const auto& d : report->layers)
        if (d.layer == "RMSNorm" || (d.layer == "MLP" && !mlp_bias) ||
            d.layer == "rotary_pos_emb" || d.layer == "ForCausalLMLoss")
          EXPECT_EQ(d.kernel.rfind("kernels-community/liger-kernels:", 0), 0u)
              << name << " " << d.path << ": " << d.reason;
      test::expect_matches_golden(
          curve, ref[name], test::kBf16LossTolerance,
          name + " (cuda, liger " + (config.empty() ? "defaults" : "cross_entropy") + ")",
          test::kBf16GradNormTolerance);
    }
}

TEST(TrainGpu, Bf16OverAnF32ModelFollowsTheF32Curve) {
  HK_REQUIRE_REAL_CUDA();
  const auto ref = test::read_json(test::train_fixture("golden-qwen3-b2.json"));
  test::RunSpec spec;
  spec.model = "qwen3-tiny";
  spec.device = "cuda";
  spec.bf16 = true;
  test::expect_matches_golden(test::train_curve(spec), ref, test::kBf16LossTolerance,
                              "qwen3-b2 --bf16 (cuda, f32 masters)", test::kBf16GradNormTolerance);
}

}  // namespace
}  // namespace hk
