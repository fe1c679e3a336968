// CUDA bf16 golden tests (label gpu): the bf16 fixtures on cuda give Transformers' bf16 greedy ids
// and last-position logits within bf16 tolerance. The reference was computed on the device named
// in expected.json ("bf16_device"); regenerate with --bf16-device cuda on the GPU machine for the
// tightest comparison.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

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

// f32 on cuda (no TF32 in the built-in matmul): the f32 references hold to 1e-4 as on CPU, and a
// left-padded batch gives the Transformers batch ids.
TEST(GoldenF32Cuda, LogitsAndBatchGreedyMatchTransformers) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const std::string& name : testing::model_fixture_names()) {
    const std::string dir = testing::model_fixture(name);
    auto expected = testing::read_json(dir + "/expected.json");
    auto ref = SafetensorsFile::open(dir + "/expected.safetensors");
    CausalLM model =
        AutoModelForCausalLM::from_pretrained(dir, {.device = "cuda", .dtype = DType::F32});
    const int64_t keep = expected["logits_positions"].get<int64_t>();
    std::vector<std::vector<int64_t>> prompts;
    for (size_t i = 0; i < expected["prompts"].size(); ++i) {
      prompts.push_back(expected["prompts"][i]["ids"].get<std::vector<int64_t>>());
      Tensor input =
          Tensor::from_ints(prompts.back(), {1, static_cast<int64_t>(prompts.back().size())});
      std::vector<double> got = model.forward(input, ForwardOptions{.logits_to_keep = keep})
                                    .logits.to(Device::cpu())
                                    .to_doubles();
      std::vector<double> want =
          ref.load("logits.f32." + std::to_string(i), Device::cpu(), DType::F32).to_doubles();
      ASSERT_EQ(got.size(), want.size());
      double worst = 0;
      for (size_t k = 0; k < got.size(); ++k) worst = std::max(worst, std::abs(got[k] - want[k]));
      EXPECT_LE(worst, 1e-4) << name << " prompt " << i;
    }
    GenerateOptions options{.max_new_tokens = expected["max_new_tokens"].get<int64_t>()};
    auto batch = model.generate(prompts, options).sequences;
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(batch.at(i), expected["batch_greedy"][i].get<std::vector<int64_t>>())
          << name << " row " << i;
  }
}

// The command line on cuda.
TEST(GoldenCudaCli, GenerateJsonOnCuda) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::model_fixture("qwen3-tiny-bf16");
  auto expected = testing::read_json(dir + "/expected.json");
  std::string ids;
  for (auto& id : expected["prompts"][0]["ids"])
    ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int64_t>());
  const char* bin = std::getenv("HK_BINARY_DIR");
  std::string cmd = std::string(bin ? bin : ".") + "/bin/hk generate --model " + dir +
                    " --device cuda --dtype f32 --max-new-tokens 8 --json --ids " + ids;
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out)["ids"], expected["greedy"][0]);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenBF16Cuda,
                         ::testing::Values("qwen3-tiny-bf16", "llama-tiny-bf16"),
                         [](const auto& info) { return testing::fixture_case_name(info); });

}  // namespace
}  // namespace hk
