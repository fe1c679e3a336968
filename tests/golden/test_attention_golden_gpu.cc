// Golden parity of the flash attention kernels on cuda (label gpu), issue 11: the head-dim-64 bf16
// fixture (qwen3-tiny-hd64-bf16: the other fixtures' head dim 16 is below what the flash kernels
// serve) loaded with attn_implementation flash_attention_2, flash_attention_3, a pinned
// kernels-community/flash-attn3 and sdpa gives
//  - the hub kernel bound to every attention layer (not a fallback),
//  - last-position logits within bf16 tolerance of Transformers bf16 and of hk's eager attention,
//  - greedy ids that follow Transformers' (teacher-forced: a bf16 near-tie may part them),
//  - in training, the loss within 1 % and every gradient within 3 % (norm-wise) of the same model
//    with the eager attention, so training parity holds through the kernels' backward.
// It does not time anything; the kernels' own numerics are tested in tests/gpu_attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "golden/fixture_util.h"
#include "golden/grad_fixture.h"
#include "hk/models.h"
#include "hk/safetensors.h"

namespace hk {
namespace {

constexpr const char* kFixture = "qwen3-tiny-hd64-bf16";

struct AttnCase {
  std::string attn;  // attn_implementation
  bool hub_kernel;   // a hub kernel must be bound (sdpa is hk's built-in fused attention)
};

class FlashGolden : public ::testing::TestWithParam<AttnCase> {
 protected:
  void SetUp() override {
    if (!cuda_available()) {
      if (std::getenv("HK_REQUIRE_GPU")) FAIL() << "no CUDA device visible";
      GTEST_SKIP() << "no CUDA device";
    }
    unsetenv("USE_HUB_KERNELS");
    setenv("HK_HUB_DIR", (testing::build_dir() / "hub").c_str(), 1);
  }
  CausalLM load(const std::string& attn) {
    CausalLM model = AutoModelForCausalLM::from_pretrained(
        testing::model_fixture(kFixture),
        {.device = "cuda", .dtype = DType::BF16, .attn_implementation = attn});
    if (GetParam().hub_kernel && attn == GetParam().attn) {
      const KernelizeReport* report = model.kernelize_report();
      EXPECT_NE(report, nullptr) << attn;
      for (int layer = 0; report && layer < 2; ++layer) {
        const LayerDecision* d =
            report->find("model.layers." + std::to_string(layer) + ".self_attn");
        EXPECT_NE(d, nullptr) << attn;
        if (!d) continue;
        EXPECT_NE(d->kernel.find("kernels-community/flash-attn"), std::string::npos)
            << attn << " fell back: " << d->reason;
      }
    }
    return model;
  }
  static std::vector<double> last_logits(const CausalLM& model, const std::vector<int64_t>& ids) {
    Tensor input = Tensor::from_ints(ids, {1, static_cast<int64_t>(ids.size())});
    return testing::host_values(model.forward(input, ForwardOptions{.logits_to_keep = 1}).logits);
  }
  static double tolerance(const std::vector<double>& ref) {
    double scale = 0;
    for (double v : ref) scale = std::max(scale, std::abs(v));
    return 0.02 + 0.02 * scale;
  }
};

TEST_P(FlashGolden, LogitsAndGreedyIdsMatchTransformers) {
  const std::string dir = testing::model_fixture(kFixture);
  auto expected = testing::read_json(dir + "/expected.json");
  auto ref = SafetensorsFile::open(dir + "/expected.safetensors");
  CausalLM model = load(GetParam().attn);
  CausalLM eager = load("eager");
  for (size_t i = 0; i < expected["prompts"].size(); ++i) {
    const auto ids = expected["prompts"][i]["ids"].get<std::vector<int64_t>>();
    const std::vector<double> got = last_logits(model, ids), mine = last_logits(eager, ids);
    const std::vector<double> want =
        ref.load("logits.bf16." + std::to_string(i), Device::cpu(), DType::F32).to_doubles();
    ASSERT_EQ(got.size(), want.size());
    const double tol = tolerance(want);
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_NEAR(got[k], want[k], tol) << GetParam().attn << " prompt " << i << " id " << k;
      ASSERT_NEAR(got[k], mine[k], tol) << GetParam().attn << " vs eager, prompt " << i;
    }
    // Greedy ids, teacher-forced over Transformers' sequence (prompt + new tokens).
    const auto seq = expected["greedy_bf16"][i].get<std::vector<int64_t>>();
    std::vector<int64_t> prefix = ids;
    for (int64_t token : seq) {
      const std::vector<double> logits = last_logits(model, prefix);
      const double top = *std::max_element(logits.begin(), logits.end());
      EXPECT_LE(top - logits.at(static_cast<size_t>(token)), tolerance(logits))
          << GetParam().attn << " prompt " << i << " after " << prefix.size() << " tokens";
      prefix.push_back(token);
    }
  }
}

TEST_P(FlashGolden, TrainingGradientsMatchTheEagerAttention) {
  const std::string dir = testing::model_fixture(kFixture);
  auto expected = testing::read_json(dir + "/expected.json");
  // One padded-free batch of the fixture prompts' ids, cut to the shortest and shifted by HF's
  // loss inside forward.
  std::vector<int64_t> tokens;
  for (const auto& p : expected["prompts"])
    for (int64_t t : p["ids"].get<std::vector<int64_t>>()) tokens.push_back(t);
  const int64_t batch = 2, seq = static_cast<int64_t>(tokens.size()) / batch;
  ASSERT_GE(seq, 8);
  tokens.resize(static_cast<size_t>(batch * seq));
  auto run = [&](const std::string& attn, double* loss) {
    CausalLM model = load(attn);
    model.train();
    Tensor ids = Tensor::from_ints(tokens, {batch, seq});
    ForwardOptions o;
    o.labels = ids;
    CausalLMOutput out = model.forward(ids.to(model.device()), o);
    out.loss.backward();
    synchronize(model.device());
    *loss = testing::host_values(out.loss).at(0);
    std::map<std::string, std::vector<double>> grads;
    for (auto& [name, p] : model.named_parameters())
      if (p->grad.defined()) grads[name] = testing::host_values(p->grad);
    return grads;
  };
  double loss = 0, eager_loss = 0;
  const auto grads = run(GetParam().attn, &loss);
  const auto eager = run("eager", &eager_loss);
  EXPECT_LE(std::abs(loss - eager_loss), 0.01 * std::abs(eager_loss))
      << GetParam().attn << ": loss " << loss << " vs eager " << eager_loss;
  ASSERT_EQ(grads.size(), eager.size());
  for (const auto& [name, want] : eager) {
    ASSERT_TRUE(grads.count(name)) << name;
    EXPECT_LE(testing::relative_error(grads.at(name), want), 0.03)
        << GetParam().attn << ": gradient of " << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Attention, FlashGolden,
                         ::testing::Values(AttnCase{"sdpa", false},
                                           AttnCase{"flash_attention_2", true},
                                           AttnCase{"flash_attention_3", true},
                                           AttnCase{"kernels-community/flash-attn3", true}),
                         [](const auto& info) {
                           std::string n = info.param.attn;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace hk
