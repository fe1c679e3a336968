// Module tree: dotted paths, parameter declaration without allocation, counts, train/eval, to().
#include <gtest/gtest.h>

#include "hk/error.h"
#include "hk/layers.h"
#include "hk/models.h"

namespace hk {
namespace {

ModelConfig tiny_config(const std::string& type = "qwen3", bool tied = false) {
  ModelConfig c;
  c.model_type = type;
  c.vocab_size = 50;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  return c;
}

TEST(Module, Qwen3TreeHasTransformersPaths) {
  CausalLM lm = AutoModelForCausalLM::from_config(tiny_config());
  nn::Module& root = lm.module();
  EXPECT_EQ(root.type_name(), "Qwen3ForCausalLM");
  for (const char* path :
       {"model", "model.embed_tokens", "model.layers.0", "model.layers.1.mlp",
        "model.layers.0.self_attn.q_norm", "model.layers.0.self_attn.rotary_fn",
        "model.layers.1.mlp.act_fn", "model.norm", "model.rotary_emb", "lm_head"})
    EXPECT_NE(root.find_module(path), nullptr) << path;
  EXPECT_EQ(root.find_module("model.layers.2"), nullptr);
  EXPECT_EQ(root.find_module("model.layers.0.nope"), nullptr);
  EXPECT_EQ(root.find_module("model.layers.0.mlp")->layer_interface(), "MLP");
  EXPECT_EQ(root.find_module("model.layers.0.self_attn.k_norm")->layer_interface(), "RMSNorm");
  EXPECT_EQ(root.find_module("model.layers.0.self_attn.k_norm")->type_name(), "Qwen3RMSNorm");
  EXPECT_EQ(root.find_module("model.layers.0.self_attn.rotary_fn")->layer_interface(),
            "rotary_pos_emb");
  EXPECT_EQ(root.find_module("model.layers.0.self_attn")->layer_interface(), "attention");
  EXPECT_EQ(root.find_module("model.layers.0.mlp.act_fn")->layer_interface(), "SiLU");
  EXPECT_EQ(root.find_module("lm_head")->layer_interface(), "Linear");
  EXPECT_EQ(root.find_module("loss_function")->layer_interface(), "ForCausalLMLoss");

  auto modules = root.named_modules();
  EXPECT_EQ(modules.front().first, "");
  bool saw = false;
  for (auto& [path, m] : modules) saw = saw || path == "model.layers.1.self_attn.o_proj";
  EXPECT_TRUE(saw);
}

TEST(Module, LlamaHasNoQkNormAndHonoursBiasFlags) {
  ModelConfig c = tiny_config("llama");
  c.attention_bias = true;
  c.mlp_bias = true;
  CausalLM lm = AutoModelForCausalLM::from_config(c);
  nn::Module& root = lm.module();
  EXPECT_EQ(root.type_name(), "LlamaForCausalLM");
  EXPECT_EQ(root.find_module("model.layers.0.self_attn.q_norm"), nullptr);
  EXPECT_TRUE(root.find_module("model.layers.0.self_attn.q_proj")->has_parameter("bias"));
  EXPECT_TRUE(root.find_module("model.layers.0.mlp.down_proj")->has_parameter("bias"));
  EXPECT_FALSE(root.find_module("lm_head")->has_parameter("bias"));
}

TEST(Module, TreeIsBuiltWithoutAllocating) {
  CausalLM lm = AutoModelForCausalLM::from_config(tiny_config());
  auto params = lm.module().named_parameters();
  ASSERT_FALSE(params.empty());
  for (auto& [path, p] : params) EXPECT_FALSE(p->value.defined()) << path;
  EXPECT_THROW(lm.module().find_module("model.norm")->param("weight"), InvalidArgument);
}

// Transformers' num_parameters() for the same shapes, written out.
int64_t expected_count(const ModelConfig& c, bool qk_norm) {
  const int64_t h = c.hidden_size, d = c.head_dim, q = c.num_attention_heads * d,
                kv = c.num_key_value_heads * d, i = c.intermediate_size;
  int64_t per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h + (qk_norm ? 2 * d : 0);
  return c.vocab_size * h * (c.tie_word_embeddings ? 1 : 2) + c.num_hidden_layers * per_layer + h;
}

TEST(Module, ParameterCountsMatchTransformersFormula) {
  for (bool tied : {false, true}) {
    ModelConfig q = tiny_config("qwen3", tied);
    EXPECT_EQ(AutoModelForCausalLM::from_config(q).module().num_parameters(),
              expected_count(q, true));
    ModelConfig l = tiny_config("llama", tied);
    EXPECT_EQ(AutoModelForCausalLM::from_config(l).module().num_parameters(),
              expected_count(l, false));
  }
}

TEST(Module, TrainEvalPropagates) {
  CausalLM lm = AutoModelForCausalLM::from_config(tiny_config());
  EXPECT_FALSE(lm.is_training());  // from_config/from_pretrained return eval mode
  lm.train();
  EXPECT_TRUE(lm.module().find_module("model.layers.1.mlp.up_proj")->is_training());
  lm.eval();
  EXPECT_FALSE(lm.module().find_module("model.layers.1.mlp.up_proj")->is_training());
}

TEST(Module, UnknownModelTypeNamesSupportedOnes) {
  try {
    AutoModelForCausalLM::from_config(tiny_config("gpt_neox"));
    FAIL() << "expected an error";
  } catch (const InvalidArgument& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("gpt_neox"), std::string::npos) << msg;
    EXPECT_NE(msg.find("qwen3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("llama"), std::string::npos) << msg;
  }
}

TEST(Module, DuplicateChildAndMissingParameterAreErrors) {
  nn::Module m("Container");
  m.register_module("a", std::make_shared<nn::Linear>(2, 3, false));
  EXPECT_THROW(m.register_module("a", std::make_shared<nn::Linear>(2, 3, false)), InvalidArgument);
  EXPECT_THROW(m.register_module("b.c", std::make_shared<nn::Linear>(2, 3, false)),
               InvalidArgument);
  EXPECT_THROW(m.find_module("a")->slot("nope"), InvalidArgument);
}

}  // namespace
}  // namespace hk
