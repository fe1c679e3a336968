// CUDA bf16 golden tests (label gpu): the bf16 fixtures on cuda give Transformers' bf16 greedy ids
// and last-position logits within bf16 tolerance. The reference was computed on the device named
// in expected.json ("bf16_device"); regenerate with --bf16-device cuda on the GPU machine for the
// tightest comparison.
#include <gtest/gtest.h>

#include <cmath>

#include "golden/fixture_util.h"
#include "hk/models.h"
#include "hk/safetensors.h"

namespace hk {
namespace {

class GoldenBF16Cuda : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(GoldenBF16Cuda, LogitsWithinBf16Tolerance) {
  const std::string dir = testing::model_fixture(GetParam());
  auto expected = testing::read_json(dir + "/expected.json");
  auto ref = SafetensorsFile::open(dir + "/expected.safetensors");
  CausalLM model =
      AutoModelForCausalLM::from_pretrained(dir, {.device = "cuda", .dtype = DType::BF16});
  for (size_t i = 0; i < expected["prompts"].size(); ++i) {
    std::vector<int64_t> ids = expected["prompts"][i]["ids"].get<std::vector<int64_t>>();
    Tensor input = Tensor::from_ints(ids, {1, static_cast<int64_t>(ids.size())});
    Tensor logits = model.forward(input, ForwardOptions{.logits_to_keep = 1}).logits;
    Tensor host = Tensor::empty(logits.sizes(), DType::F32, logits.device());
    ops::cast(logits, host);
    std::vector<double> got = host.to(Device::cpu()).to_doubles();
    std::vector<double> want =
        ref.load("logits.bf16." + std::to_string(i), Device::cpu(), DType::F32).to_doubles();
    ASSERT_EQ(got.size(), want.size());
    double scale = 0;
    for (double w : want) scale = std::max(scale, std::abs(w));
    for (size_t k = 0; k < got.size(); ++k)
      ASSERT_NEAR(got[k], want[k], 0.02 + 0.02 * scale)
          << GetParam() << " prompt " << i << " id " << k;
  }
}

TEST_P(GoldenBF16Cuda, GreedyIdsMatchTransformers) {
  const std::string dir = testing::model_fixture(GetParam());
  auto expected = testing::read_json(dir + "/expected.json");
  CausalLM model =
      AutoModelForCausalLM::from_pretrained(dir, {.device = "cuda", .dtype = DType::BF16});
  GenerateOptions options{.max_new_tokens = expected["max_new_tokens"].get<int64_t>()};
  for (size_t i = 0; i < expected["prompts"].size(); ++i) {
    auto ids = expected["prompts"][i]["ids"].get<std::vector<int64_t>>();
    EXPECT_EQ(model.generate(ids, options).sequences.at(0),
              expected["greedy_bf16"][i].get<std::vector<int64_t>>())
        << GetParam() << " prompt " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenBF16Cuda,
                         ::testing::Values("qwen3-tiny-bf16", "llama-tiny-bf16"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace hk
