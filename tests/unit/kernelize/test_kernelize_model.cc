// kernelize end to end on CPU with real hub kernels: the tiny Qwen3 fixture, the embedded-style
// test hub (<build>/kernelize-test-hub), every KernelConfig form, fallbacks with their reasons
// and the explicit requests that must fail.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "hk/attention_functions.h"
#include "hk/error.h"
#include "hk/hub.h"
#include "hk/kernelize.h"
#include "hk/models.h"

namespace hk {
namespace {

namespace fs = std::filesystem;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}
fs::path fixture() {
  return fs::path(env("HK_SOURCE_DIR")) / "tests/fixtures/models/qwen3-tiny";
}
fs::path test_hub() {
  return fs::path(env("HK_BINARY_DIR")) / "kernelize-test-hub";
}

class Kernelize : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("USE_HUB_KERNELS");
    unsetenv("HK_ENDPOINT");
    unsetenv("LOCAL_KERNELS");
    cache_ = fs::temp_directory_path() / ("hk-kernelize-cache-" + std::to_string(getpid()));
    model_ = AutoModelForCausalLM::from_pretrained(fixture().string(), {});
    ids_ = Tensor::from_ints({1, 5, 9, 42, 7, 3}, {1, 6});
  }
  void TearDown() override { fs::remove_all(cache_); }

  KernelizeOptions options(KernelConfig config = {}) {
    hub::HubConfig hc = hub::HubConfig::from_environment();
    hc.endpoint.clear();
    hc.hub_dir = test_hub();
    hc.cache_dir = cache_;
    hc.offline = false;
    hc.local_kernels.clear();
    KernelizeOptions o;
    o.device = model_.device();
    o.dtype = model_.dtype();
    o.config = std::move(config);
    o.hub = std::make_shared<hub::Hub>(hc);
    return o;
  }
  std::vector<double> logits() { return model_.forward(ids_).logits.to_doubles(); }

  fs::path cache_;
  CausalLM model_;
  Tensor ids_;
};

const char* kNorm = "model.layers.0.input_layernorm";
const char* kQNorm = "model.layers.1.self_attn.q_norm";

TEST_F(Kernelize, DefaultMappingBindsEveryRMSNormAndKeepsLogits) {
  const auto reference = logits();
  auto report = kernelize(model_.module(), Mode::Inference, options());
  for (const char* path : {kNorm, kQNorm, "model.norm"}) {
    const LayerDecision* d = report.find(path);
    ASSERT_NE(d, nullptr) << path;
    EXPECT_EQ(d->layer, "RMSNorm");
    EXPECT_EQ(d->kernel, "kernels-community/rmsnorm:RMSNorm") << d->reason;
    EXPECT_EQ(d->variant, "hk1-cpu-x86_64-linux");
    EXPECT_EQ(d->revision.size(), 40u);
  }
  // the cpu default table leaves the MLP built-in (liger's cpu MLP is a reference loop)
  const LayerDecision* mlp = report.find("model.layers.0.mlp");
  ASSERT_NE(mlp, nullptr);
  EXPECT_TRUE(mlp->kernel.empty());
  EXPECT_NE(mlp->reason.find("no kernel mapped"), std::string::npos) << mlp->reason;
  // a mapped repo this hub lacks falls back with the hub's reason
  auto missing = kernelize(model_.module(), Mode::Inference,
                           options(KernelConfig{{{"MLP", "kernels-community/liger-kernels"}}}));
  const LayerDecision* m = missing.find("model.layers.0.mlp");
  EXPECT_TRUE(m->kernel.empty());
  EXPECT_NE(m->reason.find("liger-kernels"), std::string::npos) << m->reason;
  EXPECT_EQ(model_.module().find_module(kNorm)->impl()->name(),
            "kernels-community/rmsnorm:RMSNorm");
  const auto kernelized = logits();
  ASSERT_EQ(kernelized.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i)
    ASSERT_NEAR(kernelized[i], reference[i], 1e-5 + 1e-5 * std::fabs(reference[i])) << i;
  // the JSON report has the documented shape
  const std::string json = report.to_json();
  EXPECT_NE(json.find("\"layers\""), std::string::npos);
  EXPECT_NE(json.find("\"kernel\": null"), std::string::npos);
}

TEST_F(Kernelize, EveryKernelConfigValueForm) {
  const std::vector<KernelConfig> forms = {
      KernelConfig{{{"RMSNorm", "kernels-community/rmsnorm:RMSNorm"}}},
      KernelConfig{{{"RMSNorm", "kernels-community/rmsnorm"}}},
      KernelConfig{{{"RMSNorm", KernelMappingValue::devices(
                                    {{"cpu", {"kernels-community/rmsnorm:RMSNorm", {}}}})}}},
      KernelConfig{
          {{"RMSNorm", {"kernels-community/rmsnorm:RMSNorm", KernelOptions{.version = 1}}}}},
      KernelConfig{{{"RMSNorm",
                     {"kernels-community/rmsnorm:RMSNorm",
                      KernelOptions{.revision = std::string("v1.0.0")}}}}},
      KernelConfig{{{"RMSNorm", "kernels-community/rmsnorm@>=1.0,<2.0:RMSNorm"}}},
  };
  for (const auto& config : forms) {
    auto report = kernelize(model_.module(), Mode::Inference, options(config));
    const LayerDecision* d = report.find(kNorm);
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(d->kernel, "kernels-community/rmsnorm:RMSNorm") << d->reason;
    EXPECT_NE(d->reason.find("kernel_config"), std::string::npos) << d->reason;
  }
}

TEST_F(Kernelize, InheritMappingFalseKeepsOnlyGivenEntries) {
  KernelConfig config{{{"RMSNorm", "kernels-community/rmsnorm:RMSNorm"}}};
  config.inherit_mapping = false;
  auto report = kernelize(model_.module(), Mode::Inference, options(config));
  EXPECT_EQ(report.find(kNorm)->kernel, "kernels-community/rmsnorm:RMSNorm");
  const LayerDecision* mlp = report.find("model.layers.0.mlp");
  EXPECT_TRUE(mlp->kernel.empty());
  EXPECT_NE(mlp->reason.find("no kernel mapped"), std::string::npos) << mlp->reason;
}

TEST_F(Kernelize, EmptyValueDisablesTheLayer) {
  auto report =
      kernelize(model_.module(), Mode::Inference, options(KernelConfig{{{"RMSNorm", ""}}}));
  const LayerDecision* d = report.find(kNorm);
  EXPECT_TRUE(d->kernel.empty());
  EXPECT_NE(d->reason.find("disabled"), std::string::npos) << d->reason;
  EXPECT_EQ(model_.module().find_module(kNorm)->impl()->name(), "builtin");
}

TEST_F(Kernelize, LocalKernelPath) {
  // the variant directory of the test hub's rmsnorm, used as a local kernel
  fs::path variant_dir;
  for (auto& e : fs::recursive_directory_iterator(test_hub() / "kernels-community/rmsnorm"))
    if (e.path().filename() == "metadata.json") variant_dir = e.path().parent_path();
  ASSERT_FALSE(variant_dir.empty());
  KernelConfig config{{{"RMSNorm", variant_dir.string() + ":RMSNorm"}}};
  EXPECT_THROW(kernelize(model_.module(), Mode::Inference, options(config)), InvalidArgument);
  config.use_local_kernel = true;
  auto report = kernelize(model_.module(), Mode::Inference, options(config));
  const LayerDecision* d = report.find(kNorm);
  EXPECT_EQ(d->kernel, variant_dir.string() + ":RMSNorm") << d->reason;
}

TEST_F(Kernelize, UseHubKernelsZeroDisablesHubKernels) {
  for (const char* value : {"0", "OFF", "no"}) {
    setenv("USE_HUB_KERNELS", value, 1);
    auto report = kernelize(model_.module(), Mode::Inference, options());
    const LayerDecision* d = report.find(kNorm);
    EXPECT_TRUE(d->kernel.empty()) << value;
    EXPECT_NE(d->reason.find("USE_HUB_KERNELS"), std::string::npos) << d->reason;
  }
  unsetenv("USE_HUB_KERNELS");
}

TEST_F(Kernelize, PinnedVersionThatDoesNotExistIsAnError) {
  KernelConfig config{
      {{"RMSNorm", {"kernels-community/rmsnorm:RMSNorm", KernelOptions{.version = 7}}}}};
  try {
    kernelize(model_.module(), Mode::Inference, options(config));
    FAIL() << "no error";
  } catch (const NotFound& e) {
    EXPECT_NE(std::string(e.what()).find("v7"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kernelize(model_.module(), Mode::Inference,
                         options(KernelConfig{{{"RMSNorm", "kernels-community/rmsnorm@v9.9.9"}}})),
               NotFound);
}

TEST_F(Kernelize, UnknownLayerNameListsRegisteredOnes) {
  try {
    kernelize(model_.module(), Mode::Inference, options(KernelConfig{{{"RMSNrom", "a/b"}}}));
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("RMSNrom"), std::string::npos) << msg;
    EXPECT_NE(msg.find("RMSNorm"), std::string::npos) << msg;
  }
}

TEST_F(Kernelize, KernelWithoutBackwardFallsBackUnderTraining) {
  KernelConfig config{{{"RMSNorm", "kernels-community/inference-only:RMSNorm"}}};
  auto inference = kernelize(model_.module(), Mode::Inference, options(config));
  EXPECT_EQ(inference.find(kNorm)->kernel, "kernels-community/inference-only:RMSNorm")
      << inference.find(kNorm)->reason;
  auto training = kernelize(model_.module(), Mode::Training, options(config));
  const LayerDecision* d = training.find(kNorm);
  EXPECT_TRUE(d->kernel.empty());
  EXPECT_NE(d->reason.find("no backward"), std::string::npos) << d->reason;
  EXPECT_EQ(model_.module().find_module(kNorm)->impl()->name(), "builtin");
  // the real rmsnorm has backward: bound in training
  auto real = kernelize(model_.module(), Mode::Training, options());
  EXPECT_EQ(real.find(kNorm)->kernel, "kernels-community/rmsnorm:RMSNorm");
  // capture needs the capture flag, which the cpu variant does not claim
  auto capture = kernelize(model_.module(), Mode::Inference | Mode::Capture, options());
  EXPECT_TRUE(capture.find(kNorm)->kernel.empty());
  EXPECT_THROW(kernelize(model_.module(), Mode::Inference | Mode::Training, options()),
               InvalidArgument);
}

TEST_F(Kernelize, UntrustedAttentionRepoNeedsAllowAllKernels) {
  const auto reference = logits();
  auto o = options();
  o.attn_implementation = "someone-else/attention";
  try {
    kernelize(model_.module(), Mode::Inference, o);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("allow_all_kernels"), std::string::npos) << e.what();
  }
  o.allow_all_kernels = true;
  auto report = kernelize(model_.module(), Mode::Inference, o);
  const LayerDecision* d = report.find("model.layers.0.self_attn");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->kernel, "someone-else/attention:attention") << d->reason;
  const auto kernelized = logits();
  for (size_t i = 0; i < reference.size(); ++i)
    ASSERT_NEAR(kernelized[i], reference[i], 1e-4 + 1e-4 * std::fabs(reference[i])) << i;
  // flash_attention_2 has no built-in here and the hub has no flash-attn2: a clear error
  o.attn_implementation = "flash_attention_2";
  EXPECT_THROW(kernelize(model_.module(), Mode::Inference, o), NotFound);
}

TEST_F(Kernelize, RocmIsDetectedAndRoutedToRocmEntries) {
  setenv("HK_DEVICE_BACKEND", "rocm", 1);
  EXPECT_EQ(mapping_device_type(Device{DeviceType::CUDA, 0, 90}), "rocm");
  unsetenv("HK_DEVICE_BACKEND");
  EXPECT_EQ(mapping_device_type(Device{DeviceType::CUDA, 0, 90}), "cuda");
  EXPECT_EQ(mapping_device_type(Device{DeviceType::ROCM, 0, 0}), "rocm");
}

}  // namespace
}  // namespace hk

namespace hk {
namespace {

FusionRule norm_mlp_fusion(const std::string& kernel) {
  FusionRule rule;
  rule.modules = {{"RMSNorm", "model.layers.*.post_attention_layernorm"},
                  {"MLP", "model.layers.*.mlp"}};
  rule.kernel.spec = kernel;
  return rule;
}

TEST_F(Kernelize, FusionLoadsTheOriginalCheckpointAndKeepsLogits) {
  const auto reference = logits();
  KernelConfig config;
  config.inherit_mapping = false;
  config.fusions.push_back(norm_mlp_fusion("kernels-community/layout-test-kernels:RMSNormMLP"));
  auto report = kernelize(model_.module(), Mode::Inference, options(config));
  for (const char* path :
       {"model.layers.0.post_attention_layernorm", "model.layers.0.mlp", "model.layers.1.mlp"}) {
    const LayerDecision* d = report.find(path);
    ASSERT_NE(d, nullptr) << path;
    EXPECT_EQ(d->kernel, "kernels-community/layout-test-kernels:RMSNormMLP") << d->reason;
    EXPECT_NE(d->reason.find("RMSNormMLPLayout"), std::string::npos) << d->reason;
  }
  const auto fused = logits();
  for (size_t i = 0; i < reference.size(); ++i)
    ASSERT_NEAR(fused[i], reference[i], 1e-4 + 1e-4 * std::fabs(reference[i])) << i;
  // back to built-in: the original parameters were never changed
  kernelize(model_.module(), Mode::Inference, options(KernelConfig{}));
  const auto again = logits();
  for (size_t i = 0; i < reference.size(); ++i) ASSERT_NEAR(again[i], reference[i], 1e-5) << i;
}

TEST_F(Kernelize, StatefulKernelLayoutRenamesItsParameter) {
  const auto reference = logits();
  KernelConfig config{{{"RMSNorm", "kernels-community/layout-test-kernels:ScaledRMSNorm"}}};
  auto report = kernelize(model_.module(), Mode::Inference, options(config));
  const LayerDecision* d = report.find(kNorm);
  EXPECT_EQ(d->kernel, "kernels-community/layout-test-kernels:ScaledRMSNorm") << d->reason;
  EXPECT_NE(d->reason.find("ScaledRMSNormLayout"), std::string::npos) << d->reason;
  const auto out = logits();
  for (size_t i = 0; i < reference.size(); ++i)
    ASSERT_NEAR(out[i], reference[i], 1e-4 + 1e-4 * std::fabs(reference[i])) << i;
}

TEST_F(Kernelize, FusionErrors) {
  auto expect_error = [&](const FusionRule& rule, const std::string& needle) {
    KernelConfig config;
    config.fusions.push_back(rule);
    try {
      kernelize(model_.module(), Mode::Inference, options(config));
      ADD_FAILURE() << "no error for " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(norm_mlp_fusion("kernels-community/layout-test-kernels:RMSNormMLPNoLayout"),
               "Layout");
  FusionRule different = norm_mlp_fusion("kernels-community/layout-test-kernels:RMSNormMLP");
  different.modules[1].second = "model.norm_mlp.*";
  expect_error(different, "different parents");
  FusionRule nothing = norm_mlp_fusion("kernels-community/layout-test-kernels:RMSNormMLP");
  nothing.modules[1].second = "model.layers.*.feed_forward";
  expect_error(nothing, "matches no module");
}

}  // namespace
}  // namespace hk
