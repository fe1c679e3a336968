// Fusion on CUDA (label gpu; scripts/gpu-test --fusion): the shipped fused RMSNorm → SwiGLU MLP,
// kernels-community/liger-kernels:LigerRMSNormSwiGLUMLP (rms_norm_mlp@1, its layout holding the
// concatenated gate_up weight), bound by a KernelConfig fusion through from_pretrained on the tiny
// Qwen3 fixtures (embedded hub):
//  * bf16 and f32 logits equal those of the unfused pair of the same library (LigerRMSNorm then
//    LigerSwiGLUMLP) within the dtype's GEMM tolerance, and those of the built-in model;
//  * the layout is declared before the checkpoint loads: the peak device memory of the load equals
//    the unfused load's (one copy of the weights);
//  * training (f32): the loss equals the unfused model's and the gradients reach gate_up.
// The kernel itself, at odd shapes and every float dtype, forward and backward against the
// unfused pair: tests/kernels/liger_hub_test.cc (liger_hub_cuda_test).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "golden/grad_fixture.h"
#include "gpu/gpu_testing.h"
#include "hk/allocator.h"
#include "hk/kernelize.h"
#include "hk/models.h"

namespace hk {
namespace {

namespace fs = std::filesystem;

const std::string kFused = "kernels-community/liger-kernels:LigerRMSNormSwiGLUMLP";

KernelConfig fused_config() {
  KernelConfig c;
  c.inherit_mapping = false;
  FusionRule r;
  r.modules = {{"RMSNorm", "model.layers.*.post_attention_layernorm"},
               {"MLP", "model.layers.*.mlp"}};
  r.kernel.spec = kFused;
  c.fusions.push_back(r);
  return c;
}
KernelConfig pair_config() {
  KernelConfig c{{{"RMSNorm", std::string("kernels-community/liger-kernels:LigerRMSNorm")},
                  {"MLP", std::string("kernels-community/liger-kernels:LigerSwiGLUMLP")}}};
  c.inherit_mapping = false;
  return c;
}

class FusionGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    HK_REQUIRE_REAL_CUDA();
    unsetenv("USE_HUB_KERNELS");
    setenv("HK_HUB_DIR", (testing::build_dir() / "hub").c_str(), 1);
    cache_ = fs::temp_directory_path() / ("hk-fusion-gpu-cache-" + std::to_string(getpid()));
    setenv("HK_KERNELS_CACHE", cache_.c_str(), 1);
  }
  void TearDown() override {
    fs::remove_all(cache_);
    unsetenv("HK_KERNELS_CACHE");
  }
  struct Loaded {
    CausalLM model;
    size_t peak = 0;
    size_t resident = 0;  // device bytes still allocated after the load
  };
  static Loaded load(const std::string& fixture, DType dt, std::optional<KernelConfig> config) {
    const Device cuda = Device::cuda(0);
    empty_cache(cuda);  // every load starts from the same (empty) cache
    reset_peak_memory_stats(cuda);
    const size_t before = memory_stats(cuda).allocated;
    LoadOptions o;
    o.device = "cuda";
    o.dtype = dt;
    o.kernel_config = std::move(config);
    Loaded out;
    out.model = AutoModelForCausalLM::from_pretrained(testing::model_fixture(fixture), o);
    out.peak = memory_stats(cuda).peak_allocated - before;
    out.resident = memory_stats(cuda).allocated - before;
    return out;
  }
  static std::vector<double> logits(const CausalLM& m) {
    const Tensor ids = Tensor::from_ints({1, 5, 9, 42, 7, 3, 11, 2, 8, 13, 21, 34}, {2, 6});
    return m.forward(ids.to(m.device())).logits.to(Device::cpu()).to_doubles();
  }
  static void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                           double atol, double rtol, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (!(std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i])) && bad++ < 5)
        ADD_FAILURE() << what << "[" << i << "] got " << got[i] << " want " << want[i];
  }
  fs::path cache_;
};

TEST_F(FusionGpu, FusedRMSNormSwiGLUMLPGivesTheUnfusedLogitsWithOneCopyOfTheWeights) {
  for (const auto& [fixture, dt] :
       {std::pair{"qwen3-tiny-bf16", DType::BF16}, std::pair{"qwen3-tiny", DType::F32}}) {
    SCOPED_TRACE(fixture);
    Loaded fused = load(fixture, dt, fused_config());
    for (const char* p : {"model.layers.0.post_attention_layernorm", "model.layers.1.mlp"}) {
      const LayerDecision* d = fused.model.kernelize_report()->find(p);
      ASSERT_NE(d, nullptr) << p;
      EXPECT_EQ(d->kernel, kFused) << d->reason;
      EXPECT_NE(d->variant.find("cu"), std::string::npos) << d->variant;
    }
    Loaded pair = load(fixture, dt, pair_config());
    Loaded plain = load(fixture, dt, std::nullopt);
    const double tol = dt == DType::F32 ? 2e-4 : 3e-2;
    const auto got = logits(fused.model);
    expect_close(got, logits(pair.model), tol, tol, "fused vs LigerRMSNorm + LigerSwiGLUMLP");
    expect_close(got, logits(plain.model), tol, tol, "fused vs built-in");
    size_t fused_params = 0, plain_params = 0;
    for (auto& [name, p] : fused.model.named_parameters()) fused_params += p->value.nbytes();
    for (auto& [name, p] : plain.model.named_parameters()) plain_params += p->value.nbytes();
    EXPECT_EQ(fused_params, plain_params);
    EXPECT_EQ(fused.peak, plain.peak)
        << "the layout must load the weights once (resident after the load: fused "
        << fused.resident << ", plain " << plain.resident << " bytes; parameters " << fused_params
        << " / " << plain_params << ")";
  }
}

TEST_F(FusionGpu, TrainingThroughTheFusedKernelGivesTheUnfusedLossAndGradients) {
  Loaded fused = load("qwen3-tiny", DType::F32, fused_config());
  Loaded plain = load("qwen3-tiny", DType::F32, std::nullopt);
  fused.model.train();
  plain.model.train();
  EXPECT_EQ(fused.model.kernelize_report()->find("model.layers.0.mlp")->kernel, kFused);
  const Tensor ids = Tensor::from_ints({1, 5, 9, 42, 7, 3, 11, 2}, {2, 4}).to(Device::cuda(0));
  auto a = fused.model.forward(ids, ids);
  auto b = plain.model.forward(ids, ids);
  const double la = a.loss.to(Device::cpu()).to_doubles()[0];
  const double lb = b.loss.to(Device::cpu()).to_doubles()[0];
  EXPECT_NEAR(la, lb, 1e-4 * std::fabs(lb));
  a.loss.backward();
  b.loss.backward();
  std::map<std::string, std::vector<double>> want, got;
  for (auto& [name, p] : plain.model.named_parameters())
    want[name] = p->grad.to(Device::cpu()).to_doubles();
  for (auto& [name, p] : fused.model.named_parameters())
    got[name] = p->grad.to(Device::cpu()).to_doubles();
  const std::string L = "model.layers.0.";
  std::vector<double> cat = want.at(L + "mlp.gate_proj.weight");
  const auto& up = want.at(L + "mlp.up_proj.weight");
  cat.insert(cat.end(), up.begin(), up.end());
  expect_close(got.at(L + "mlp.gate_up_proj.weight"), cat, 1e-4, 1e-3, "d gate_up");
  expect_close(got.at(L + "mlp.down_proj.weight"), want.at(L + "mlp.down_proj.weight"), 1e-4, 1e-3,
               "d down");
  expect_close(got.at(L + "post_attention_layernorm.weight"),
               want.at(L + "post_attention_layernorm.weight"), 1e-4, 1e-3, "d norm weight");
  expect_close(got.at("model.embed_tokens.weight"), want.at("model.embed_tokens.weight"), 1e-4,
               1e-3, "d embed");
}

}  // namespace
}  // namespace hk
