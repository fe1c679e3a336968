// attn_implementation against the embedded hub (<build>/hub, which the build fills from kernels/):
// the flash-attn repos and their versions resolve as the seed's examples write them
// (flash-attn2 branch v1, @v2.1.0, @>=2.0,<3.0; flash-attn3; flash-attn4), each version being its
// own build whose metadata says which code it is; on CPU, which no flash repo serves, every flash
// request falls back to the built-in fused attention with the hub's reason in the report and a
// warning on stderr, and the logits equal eager's; versions that do not exist are errors; "sdpa"
// is the fused attention (not the eager op) with the same logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

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

class KernelizeAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("USE_HUB_KERNELS");
    unsetenv("HK_ENDPOINT");
    unsetenv("LOCAL_KERNELS");
    cache_ = fs::temp_directory_path() / ("hk-attn-cache-" + std::to_string(getpid()));
    model_ = AutoModelForCausalLM::from_pretrained(
        (fs::path(env("HK_SOURCE_DIR")) / "tests/fixtures/models/qwen3-tiny").string(), {});
    ids_ = Tensor::from_ints({1, 5, 9, 42, 7, 3, 11}, {1, 7});
    reference_ = model_.forward(ids_).logits.to_doubles();
  }
  void TearDown() override { fs::remove_all(cache_); }

  std::shared_ptr<hub::Hub> hub() {
    hub::HubConfig hc = hub::HubConfig::from_environment();
    hc.endpoint.clear();
    hc.hub_dir = fs::path(env("HK_BINARY_DIR")) / "hub";
    hc.cache_dir = cache_;
    hc.offline = false;
    hc.local_kernels.clear();
    return std::make_shared<hub::Hub>(hc);
  }
  KernelizeReport bind(const std::string& attn, std::string* err = nullptr) {
    KernelizeOptions o;
    o.device = model_.device();
    o.dtype = model_.dtype();
    o.hub = hub();
    o.attn_implementation = attn;
    std::ostringstream captured;
    std::streambuf* old = std::cerr.rdbuf(captured.rdbuf());
    KernelizeReport report;
    try {
      report = kernelize(model_.module(), Mode::Inference, o);
    } catch (...) {
      std::cerr.rdbuf(old);
      throw;
    }
    std::cerr.rdbuf(old);
    if (err) *err = captured.str();
    return report;
  }
  void expect_reference_logits(double tol) {
    const auto got = model_.forward(ids_).logits.to_doubles();
    ASSERT_EQ(got.size(), reference_.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], reference_[i], tol + tol * std::fabs(reference_[i])) << i;
  }

  fs::path cache_;
  CausalLM model_;
  Tensor ids_;
  std::vector<double> reference_;
};

const char* kAttn = "model.layers.0.self_attn";

TEST_F(KernelizeAttention, SdpaIsTheFusedAttentionWithEagersLogits) {
  std::string err;
  auto report = bind("sdpa", &err);
  const LayerDecision* d = report.find(kAttn);
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(d->kernel.empty());
  EXPECT_NE(d->reason.find("fused attention"), std::string::npos) << d->reason;
  EXPECT_TRUE(err.empty()) << err;
  expect_reference_logits(1e-5);
}

TEST_F(KernelizeAttention, FlashNamesFallBackOnCpuWithReasonAndWarning) {
  for (const char* name :
       {"flash_attention_2", "flash_attention_3", "flash_attention_4",
        "kernels-community/flash-attn2@v2.1.0", "kernels-community/flash-attn2@>=2.0,<3.0",
        "kernels-community/flash-attn3:flash_attn_func"}) {
    SCOPED_TRACE(name);
    std::string err;
    auto report = bind(name, &err);
    const LayerDecision* d = report.find(kAttn);
    ASSERT_NE(d, nullptr);
    EXPECT_TRUE(d->kernel.empty()) << d->kernel;
    EXPECT_NE(d->reason.find("cannot be used on cpu"), std::string::npos) << d->reason;
    EXPECT_NE(d->reason.find("sdpa"), std::string::npos) << d->reason;
    // the hub's own reason: the repo has cuda variants only
    EXPECT_NE(d->reason.find("cu"), std::string::npos) << d->reason;
    EXPECT_NE(err.find("warning"), std::string::npos) << err;
    EXPECT_NE(err.find(name), std::string::npos) << err;
    expect_reference_logits(1e-5);
  }
}

TEST_F(KernelizeAttention, VersionsThatDoNotExistAreErrors) {
  for (const char* name :
       {"kernels-community/flash-attn2@v9.9.9", "kernels-community/flash-attn2@>=5.0,<6.0",
        "kernels-community/flash-attn9"}) {
    SCOPED_TRACE(name);
    EXPECT_THROW(bind(name), NotFound);
  }
}

TEST_F(KernelizeAttention, FlashRepoVersionsAreRealBuildsThatSayWhatTheyAre) {
  auto h = hub();
  hub::ResolveOptions v1;
  const std::string c1 = h->resolve_commit("kernels-community/flash-attn2", v1);
  hub::ResolveOptions tag;
  tag.revision = "v2.1.0";
  const std::string c21 = h->resolve_commit("kernels-community/flash-attn2", tag);
  const std::string crange = h->resolve_commit("kernels-community/flash-attn2", {},
                                               hub::VersionRange::parse(">=2.0,<3.0"));
  EXPECT_NE(c1, c21);  // two builds, not one build under two names
  EXPECT_EQ(c21, crange);
  const auto variants = h->variants("kernels-community/flash-attn2", c21);
  ASSERT_FALSE(variants.empty());
  EXPECT_EQ(variants[0].version, "2.1.0");
  EXPECT_NE(variants[0].provenance_json.find("FA2 algorithm"), std::string::npos)
      << variants[0].provenance_json;
  for (const char* entry :
       {"FlashAttention", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"}) {
    const auto names = variants[0].entry_names();
    EXPECT_NE(std::find(names.begin(), names.end(), entry), names.end()) << entry;
  }
  const auto fa4 = h->variants("kernels-community/flash-attn4",
                               h->resolve_commit("kernels-community/flash-attn4", {}));
  ASSERT_FALSE(fa4.empty());
  EXPECT_NE(fa4[0].provenance_json.find("flash-attn3 code"), std::string::npos)
      << fa4[0].provenance_json;
}

}  // namespace
}  // namespace hk
