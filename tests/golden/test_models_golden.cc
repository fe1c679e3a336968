// CPU f32 golden tests: for every model fixture, hk's logits are within 1e-4 of Transformers'
// (float32), greedy ids (single prompts and a left-padded batch) are identical.
#include <gtest/gtest.h>

#include <cmath>

#include "golden/fixture_util.h"
#include "hk/models.h"
#include "hk/safetensors.h"

namespace hk {
namespace {

class GoldenF32 : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenF32, LogitsMatchTransformers) {
  const std::string dir = testing::model_fixture(GetParam());
  auto expected = testing::read_json(dir + "/expected.json");
  auto ref = SafetensorsFile::open(dir + "/expected.safetensors");
  CausalLM model =
      AutoModelForCausalLM::from_pretrained(dir, {.device = "cpu", .dtype = DType::F32});
  ASSERT_EQ(model.dtype(), DType::F32);
  const int64_t keep = expected["logits_positions"].get<int64_t>();
  for (size_t i = 0; i < expected["prompts"].size(); ++i) {
    std::vector<int64_t> ids = expected["prompts"][i]["ids"].get<std::vector<int64_t>>();
    Tensor input = Tensor::from_ints(ids, {1, static_cast<int64_t>(ids.size())});
    CausalLMOutput out = model.forward(input, ForwardOptions{.logits_to_keep = keep});
    Tensor want = ref.load("logits.f32." + std::to_string(i), Device::cpu(), DType::F32);
    ASSERT_EQ(out.logits.size(1) * out.logits.size(2), want.numel()) << "prompt " << i;
    std::vector<double> got = out.logits.to_doubles(), exp = want.to_doubles();
    double worst = 0;
    for (size_t k = 0; k < got.size(); ++k) worst = std::max(worst, std::abs(got[k] - exp[k]));
    EXPECT_LE(worst, 1e-4) << GetParam() << " prompt " << i << ": max |hk - transformers|";
    RecordProperty("max_abs_diff_prompt_" + std::to_string(i), std::to_string(worst));
  }
}

TEST_P(GoldenF32, FullLogitsEqualLastPositions) {
  // logits_to_keep = 0 gives every position; its tail equals the logits_to_keep slice.
  const std::string dir = testing::model_fixture(GetParam());
  auto expected = testing::read_json(dir + "/expected.json");
  CausalLM model = AutoModelForCausalLM::from_pretrained(dir, {.dtype = DType::F32});
  std::vector<int64_t> ids = expected["prompts"][0]["ids"].get<std::vector<int64_t>>();
  const int64_t s = static_cast<int64_t>(ids.size());
  Tensor input = Tensor::from_ints(ids, {1, s});
  Tensor all = model.forward(input).logits;
  Tensor last = model.forward(input, ForwardOptions{.logits_to_keep = 1}).logits;
  ASSERT_EQ(all.sizes(), (Shape{1, s, model.config().vocab_size}));
  std::vector<double> a = all.slice(1, s - 1, s).contiguous().to_doubles(), b = last.to_doubles();
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) ASSERT_NEAR(a[k], b[k], 1e-5);
}

TEST_P(GoldenF32, GreedyIdsMatchTransformers) {
  const std::string dir = testing::model_fixture(GetParam());
  auto expected = testing::read_json(dir + "/expected.json");
  CausalLM model = AutoModelForCausalLM::from_pretrained(dir, {.dtype = DType::F32});
  GenerateOptions options{.max_new_tokens = expected["max_new_tokens"].get<int64_t>()};
  std::vector<std::vector<int64_t>> prompts;
  for (size_t i = 0; i < expected["prompts"].size(); ++i) {
    prompts.push_back(expected["prompts"][i]["ids"].get<std::vector<int64_t>>());
    GenerateOutput out = model.generate(prompts.back(), options);
    EXPECT_EQ(out.sequences.at(0), expected["greedy"][i].get<std::vector<int64_t>>())
        << GetParam() << " prompt " << i;
  }
  GenerateOutput batch = model.generate(prompts, options);
  ASSERT_EQ(batch.sequences.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(batch.sequences[i], expected["batch_greedy"][i].get<std::vector<int64_t>>())
        << GetParam() << " batch row " << i;
}

TEST_P(GoldenF32, AutoDtypeIsTheCheckpointDtype) {
  const std::string dir = testing::model_fixture(GetParam());
  CausalLM model = AutoModelForCausalLM::from_pretrained(dir);
  const bool bf16 = GetParam().find("bf16") != std::string::npos;
  EXPECT_EQ(model.dtype(), bf16 ? DType::BF16 : DType::F32);
  EXPECT_EQ(model.module().find_module("model.norm")->param("weight").dtype(), model.dtype());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenF32, ::testing::ValuesIn(testing::model_fixture_names()),
                         [](const auto& info) { return testing::fixture_case_name(info); });

}  // namespace
}  // namespace hk
