// config.json parsing: the Transformers 4.x and 5.x forms, defaults, and field-naming errors.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "hk/error.h"
#include "hk/model_config.h"

namespace hk {
namespace {

const char* kBase = R"("vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2)";

TEST(ModelConfig, Transformers5Form) {
  auto c = ModelConfig::from_json(std::string(R"({"model_type": "qwen3", )") + kBase + R"(,
    "head_dim": 32, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "dtype": "bfloat16", "eos_token_id": [7, 9], "tie_word_embeddings": true,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "architectures": ["Qwen3ForCausalLM"]})");
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.rope.rope_type, "default");
  EXPECT_DOUBLE_EQ(c.rope.rope_theta, 1e6);
  ASSERT_TRUE(c.dtype.has_value());
  EXPECT_EQ(*c.dtype, DType::BF16);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{7, 9}));
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.architectures, (std::vector<std::string>{"Qwen3ForCausalLM"}));
}

TEST(ModelConfig, Transformers4Form) {
  auto c = ModelConfig::from_json(std::string(R"({"model_type": "llama", )") + kBase + R"(,
    "rope_theta": 500000.0, "torch_dtype": "float16", "eos_token_id": 3,
    "rope_scaling": {"type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "attention_bias": true, "mlp_bias": true, "bos_token_id": 1, "pad_token_id": null})");
  EXPECT_EQ(c.head_dim, 16);  // hidden / heads
  EXPECT_DOUBLE_EQ(c.rope.rope_theta, 500000.0);
  EXPECT_EQ(c.rope.rope_type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_EQ(*c.dtype, DType::F16);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{3}));
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.mlp_bias);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_FALSE(c.pad_token_id.has_value());
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(ModelConfig, Defaults) {
  auto c = ModelConfig::from_json(std::string(R"({"model_type": "llama", "rope_scaling": null, )") +
                                  kBase + "}");
  EXPECT_DOUBLE_EQ(c.rope.rope_theta, 10000.0);
  EXPECT_EQ(c.rope.rope_type, "default");
  EXPECT_FALSE(c.dtype.has_value());
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_EQ(c.hidden_act, "silu");
}

std::string error_of(const std::string& json) {
  try {
    ModelConfig::from_json(json, "DIR/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelConfig, ErrorsNameTheFieldAndFile) {
  EXPECT_NE(error_of("{nope").find("DIR/config.json is not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("[1]").find("must hold a JSON object"), std::string::npos);
  EXPECT_NE(error_of(std::string("{") + kBase + "}").find("'model_type' is missing"),
            std::string::npos);
  std::string bad_type =
      error_of(R"({"model_type": "qwen3", "vocab_size": "many", "hidden_size": 64})");
  EXPECT_NE(bad_type.find("'vocab_size' must be an integer"), std::string::npos) << bad_type;
  EXPECT_NE(bad_type.find("DIR/config.json"), std::string::npos);
  std::string negative =
      error_of(R"({"model_type": "qwen3", "vocab_size": 100, "hidden_size": -4})");
  EXPECT_NE(negative.find("'hidden_size' must be a positive integer"), std::string::npos)
      << negative;
  std::string gqa = error_of(std::string(R"({"model_type": "qwen3", )") +
                             R"("vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 3})");
  EXPECT_NE(gqa.find("num_key_value_heads (3) must divide"), std::string::npos) << gqa;
  std::string dtype =
      error_of(std::string(R"({"model_type": "qwen3", "dtype": "float7", )") + kBase + "}");
  EXPECT_NE(dtype.find("unknown dtype 'float7'"), std::string::npos) << dtype;
}

TEST(ModelConfig, FileNotFound) {
  EXPECT_THROW(ModelConfig::from_file("/nonexistent/dir"), NotFound);
}

TEST(GenerationConfig, ParsesAndDefaultsWhenAbsent) {
  auto g = GenerationConfig::from_json(R"({"eos_token_id": [1, 2], "pad_token_id": 0,
    "do_sample": true, "temperature": 0.7, "top_k": 20, "top_p": 0.8})");
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(g.pad_token_id, 0);
  EXPECT_EQ(g.do_sample, true);
  EXPECT_DOUBLE_EQ(*g.temperature, 0.7);
  EXPECT_EQ(g.top_k, 20);
  auto none = GenerationConfig::from_dir("/nonexistent/dir");
  EXPECT_TRUE(none.eos_token_ids.empty());
}

}  // namespace
}  // namespace hk

namespace hk {
namespace {

TEST(ModelConfig, HugeSizesAreRejectedBeforeBuildingATree) {
  std::string msg = error_of(R"({"model_type": "qwen3", "vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 1000000000, "num_attention_heads": 4})");
  EXPECT_NE(msg.find("'num_hidden_layers' is 1000000000, more than hk accepts"), std::string::npos)
      << msg;
}

// Byte-level corruption of a real config.json: every outcome is a parsed config or an hk::Error
// (never a crash or another exception type).
TEST(ModelConfig, CorruptedTextOnlyEverThrowsHkErrors) {
  std::ifstream in(std::string(HK_TEST_SOURCE_DIR) +
                   "/tests/fixtures/models/llama-tiny-bf16/config.json");
  const std::string original((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  ASSERT_FALSE(original.empty());
  std::mt19937 rng(1234);
  const std::string alphabet = "{}[]\":,0123456789-eE.+ truefalsn\\x";
  int parsed = 0, rejected = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string text = original;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t pos = rng() % text.size();
      switch (rng() % 3) {
        case 0:
          text[pos] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          text.erase(pos, 1 + rng() % 8);
          break;
        default:
          text.insert(pos, 1, alphabet[rng() % alphabet.size()]);
          break;
      }
      if (text.empty()) text = "{";
    }
    try {
      ModelConfig::from_json(text);
      ++parsed;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_EQ(parsed + rejected, 3000);
}

}  // namespace
}  // namespace hk
