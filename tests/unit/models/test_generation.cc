// Generation: sampling distributions (top-k / top-p on hand-made logits), seeded determinism,
// left-padded batches equal unbatched runs, stop ids, context-length errors.
#include <gtest/gtest.h>

#include <cmath>

#include "hk/error.h"
#include "hk/generation.h"
#include "hk/models.h"

namespace hk {
namespace {

std::string fixture(const std::string& name = "qwen3-tiny") {
  return std::string(HK_TEST_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

// Probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 (log-space logits).
std::vector<float> hand_made() {
  std::vector<double> p{0.0625, 0.5, 0.125, 0.25, 0.0625};
  std::vector<float> logits;
  for (double x : p) logits.push_back(static_cast<float>(std::log(x)));
  return logits;
}

TEST(Sampling, PlainSoftmax) {
  auto logits = hand_made();
  auto p = sampling_distribution(logits.data(), 5, {});
  EXPECT_NEAR(p[1], 0.5, 1e-6);
  EXPECT_NEAR(p[3], 0.25, 1e-6);
  EXPECT_NEAR(p[0], 0.0625, 1e-6);
}

TEST(Sampling, TopKKeepsTheKLargest) {
  auto logits = hand_made();
  auto p = sampling_distribution(logits.data(), 5, {.top_k = 2});
  EXPECT_NEAR(p[1], 2.0 / 3, 1e-6);
  EXPECT_NEAR(p[3], 1.0 / 3, 1e-6);
  EXPECT_EQ(p[0], 0.0);
  EXPECT_EQ(p[2], 0.0);
  EXPECT_EQ(p[4], 0.0);
  // Ties at the boundary survive (as torch's `logits < kth value` filter).
  auto tie = sampling_distribution(logits.data(), 5, {.top_k = 4});
  EXPECT_GT(tie[0], 0.0);
  EXPECT_GT(tie[4], 0.0);
}

TEST(Sampling, TopPKeepsTheSmallestSetWithTheMass) {
  auto logits = hand_made();
  // 0.5 + 0.25 = 0.75 >= 0.7: tokens 1 and 3.
  auto p = sampling_distribution(logits.data(), 5, {.top_p = 0.7});
  EXPECT_NEAR(p[1], 2.0 / 3, 1e-6);
  EXPECT_NEAR(p[3], 1.0 / 3, 1e-6);
  EXPECT_EQ(p[2], 0.0);
  // 0.8 needs the 0.125 token too.
  auto q = sampling_distribution(logits.data(), 5, {.top_p = 0.8});
  EXPECT_NEAR(q[2], 0.125 / 0.875, 1e-6);
  EXPECT_EQ(q[0], 0.0);
  // A tiny top_p still keeps the most likely token.
  auto one = sampling_distribution(logits.data(), 5, {.top_p = 0.01});
  EXPECT_EQ(one[1], 1.0);
}

TEST(Sampling, TemperatureSharpens) {
  auto logits = hand_made();
  auto p = sampling_distribution(logits.data(), 5, {.temperature = 0.5});
  // p ∝ p0^2: 0.25, 0.0625, ... normalised.
  double z = 0.0625 * 0.0625 * 2 + 0.25 + 0.0625 + 0.015625;
  EXPECT_NEAR(p[1], 0.25 / z, 1e-6);
  EXPECT_THROW(sampling_distribution(logits.data(), 5, {.temperature = 0}), InvalidArgument);
  EXPECT_THROW(sampling_distribution(logits.data(), 5, {.top_p = 1.5}), InvalidArgument);
}

TEST(Sampling, DrawsFollowTheDistributionAndTheSeed) {
  auto logits = hand_made();
  std::mt19937_64 a(42), b(42), c(43);
  std::vector<int64_t> ra, rb, rc;
  std::vector<int> counts(5, 0);
  for (int i = 0; i < 4000; ++i) {
    ra.push_back(sample_token(logits.data(), 5, {.top_k = 3}, a));
    rb.push_back(sample_token(logits.data(), 5, {.top_k = 3}, b));
    rc.push_back(sample_token(logits.data(), 5, {.top_k = 3}, c));
    ++counts[static_cast<size_t>(ra.back())];
  }
  EXPECT_EQ(ra, rb);
  EXPECT_NE(ra, rc);
  EXPECT_EQ(counts[0] + counts[4], 0);  // removed by top-k
  EXPECT_NEAR(counts[1] / 4000.0, 0.5 / 0.875, 0.03);
  EXPECT_NEAR(counts[3] / 4000.0, 0.25 / 0.875, 0.03);
}

TEST(Generate, SeededSamplingIsDeterministic) {
  CausalLM lm = AutoModelForCausalLM::from_pretrained(fixture());
  GenerateOptions o{
      .max_new_tokens = 6, .do_sample = true, .temperature = 1.5, .top_k = 50, .seed = 7};
  auto first = lm.generate({5, 6, 7}, o).sequences[0];
  EXPECT_EQ(lm.generate({5, 6, 7}, o).sequences[0], first);
  EXPECT_EQ(first.size(), 6u);
  std::vector<int64_t> other;
  for (uint64_t seed = 8; seed < 12 && (other.empty() || other == first); ++seed) {
    o.seed = seed;
    other = lm.generate({5, 6, 7}, o).sequences[0];
  }
  EXPECT_NE(other, first);
}

TEST(Generate, LeftPaddedBatchEqualsUnbatched) {
  for (const char* name : {"qwen3-tiny", "llama-tiny-bf16"}) {
    CausalLM lm = AutoModelForCausalLM::from_pretrained(fixture(name), {.dtype = DType::F32});
    std::vector<std::vector<int64_t>> prompts{{11, 12, 13, 14, 15, 16}, {200}, {31, 32, 33}};
    GenerateOptions o{.max_new_tokens = 5, .eos_token_ids = std::vector<int64_t>{}};
    auto batch = lm.generate(prompts, o).sequences;
    ASSERT_EQ(batch.size(), 3u);
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(batch[i], lm.generate(prompts[i], o).sequences[0]) << name << " row " << i;
  }
}

TEST(Generate, TensorInputEqualsVectorInput) {
  CausalLM lm = AutoModelForCausalLM::from_pretrained(fixture());
  GenerateOptions o{.max_new_tokens = 4};
  auto from_tensor = lm.generate(Tensor::from_ints({5, 6, 7, 8, 9, 10}, {2, 3}), o).sequences;
  ASSERT_EQ(from_tensor.size(), 2u);
  EXPECT_EQ(from_tensor[0], lm.generate(std::vector<int64_t>{5, 6, 7}, o).sequences[0]);
  EXPECT_EQ(from_tensor[1], lm.generate(std::vector<int64_t>{8, 9, 10}, o).sequences[0]);
  EXPECT_THROW(lm.generate(Tensor::from_ints({5, 6}, {2})), InvalidArgument);
}

TEST(Generate, StopsAtEosAndKeepsIt) {
  CausalLM lm = AutoModelForCausalLM::from_pretrained(fixture());
  GenerateOptions o{.max_new_tokens = 6, .eos_token_ids = std::vector<int64_t>{}};
  auto free_run = lm.generate({5, 6, 7}, o).sequences[0];
  ASSERT_EQ(free_run.size(), 6u);
  o.eos_token_ids = std::vector<int64_t>{free_run[2]};
  auto stopped = lm.generate({5, 6, 7}, o).sequences[0];
  EXPECT_EQ(stopped, std::vector<int64_t>(free_run.begin(), free_run.begin() + 3));
  // In a batch, the other row keeps going.
  auto batch = lm.generate({{5, 6, 7}, {9, 10}}, o).sequences;
  EXPECT_EQ(batch[0], stopped);
  o.eos_token_ids = std::vector<int64_t>{};
  EXPECT_EQ(batch[1], lm.generate({9, 10}, o).sequences[0]);
}

TEST(Generate, OnTokenStreamsInOrderAndCanFinishARow) {
  CausalLM lm = AutoModelForCausalLM::from_pretrained(fixture());
  GenerateOptions o{.max_new_tokens = 6, .eos_token_ids = std::vector<int64_t>{}};
  const auto free_runs = lm.generate({{5, 6, 7}, {9, 10}}, o).sequences;
  // Every token reaches the callback, in production order per row.
  std::vector<std::vector<int64_t>> seen(2);
  o.on_token = [&](size_t row, int64_t token) {
    seen.at(row).push_back(token);
    return true;
  };
  EXPECT_EQ(lm.generate({{5, 6, 7}, {9, 10}}, o).sequences, free_runs);
  EXPECT_EQ(seen, free_runs);
  // Returning false finishes that row after the token (the other row keeps going), as a stop
  // string does in `hk generate --stop`.
  o.on_token = [](size_t row, int64_t) { return row != 0; };
  auto stopped = lm.generate({{5, 6, 7}, {9, 10}}, o).sequences;
  EXPECT_EQ(stopped[0], std::vector<int64_t>{free_runs[0][0]});
  EXPECT_EQ(stopped[1], free_runs[1]);
  // CPU: decoded by the model forward, and the timings say so.
  o.on_token = nullptr;
  auto timed = lm.generate({5, 6, 7}, o);
  EXPECT_EQ(timed.timings.decode_path, "forward");
}

TEST(Generate, LongerThanContextIsAClearError) {
  CausalLM lm = AutoModelForCausalLM::from_pretrained(fixture());  // context 128
  std::vector<int64_t> prompt(120, 5);
  try {
    lm.generate(prompt, {.max_new_tokens = 9});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("longer than the model's context of 128"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(lm.generate(prompt, {.max_new_tokens = 8}));
  std::vector<int64_t> too_long(129, 5);
  EXPECT_THROW(lm.forward(Tensor::from_ints(too_long, {1, 129})), InvalidArgument);
  EXPECT_THROW(lm.generate({5, 999999}, {.max_new_tokens = 1}), InvalidArgument);
  EXPECT_THROW(lm.generate(std::vector<int64_t>{}, {.max_new_tokens = 1}), InvalidArgument);
}

TEST(Generate, CacheDecodeMatchesFullForward) {
  // Logits of the last token via prefill+decode equal a full forward over the whole sequence.
  CausalLM lm = AutoModelForCausalLM::from_pretrained(fixture());
  const auto& c = lm.config();
  KVCache cache(c.num_hidden_layers, 1, 16, c.num_key_value_heads, c.head_dim, lm.dtype(),
                lm.device());
  ForwardOptions o{.cache = &cache, .logits_to_keep = 1};
  lm.forward(Tensor::from_ints({3, 4, 5, 6}, {1, 4}), o);
  auto step = lm.forward(Tensor::from_ints({7}, {1, 1}), o).logits.to_doubles();
  auto full =
      lm.forward(Tensor::from_ints({3, 4, 5, 6, 7}, {1, 5}), ForwardOptions{.logits_to_keep = 1})
          .logits.to_doubles();
  ASSERT_EQ(step.size(), full.size());
  for (size_t i = 0; i < step.size(); ++i) ASSERT_NEAR(step[i], full[i], 1e-5);
  EXPECT_EQ(cache.length(), 5);
}

TEST(Forward, LossIsNextTokenCrossEntropy) {
  CausalLM lm = AutoModelForCausalLM::from_pretrained(fixture());
  Tensor ids = Tensor::from_ints({3, 4, 5, 6}, {1, 4});
  Tensor labels = Tensor::from_ints({3, 4, -100, 6}, {1, 4});
  auto out = lm.forward(ids, labels);
  ASSERT_TRUE(out.loss.defined());
  auto logits = out.logits.to_doubles();
  const int64_t v = lm.config().vocab_size;
  auto nll = [&](int64_t pos, int64_t target) {
    double mx = -1e30, sum = 0;
    for (int64_t k = 0; k < v; ++k) mx = std::max(mx, logits[static_cast<size_t>(pos * v + k)]);
    for (int64_t k = 0; k < v; ++k) sum += std::exp(logits[static_cast<size_t>(pos * v + k)] - mx);
    return std::log(sum) + mx - logits[static_cast<size_t>(pos * v + target)];
  };
  // Targets: position 0 -> 4, position 1 -> ignored, position 2 -> 6.
  EXPECT_NEAR(out.loss.to_doubles()[0], (nll(0, 4) + nll(2, 6)) / 2, 1e-4);
}

}  // namespace
}  // namespace hk
