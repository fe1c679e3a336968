// State-dict loading: success, tied weights, key mapping, and the missing / unexpected / shape
// errors (with names, counts and both shapes), and to(dtype) conversion.
#include <gtest/gtest.h>

#include "hk/error.h"
#include "hk/layers.h"
#include "hk/models.h"

namespace hk {
namespace {

ModelConfig small(bool tied) {
  ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 10;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.tie_word_embeddings = tied;
  return c;
}

// A full state dict for `root` with distinct values per tensor.
std::map<std::string, Tensor> full_state(nn::Module& root) {
  std::map<std::string, Tensor> out;
  float base = 0;
  for (auto& [path, p] : root.named_parameters()) {
    if (!p->tied_to.empty() || !p->persistent) continue;
    int64_t n = 1;
    for (int64_t d : p->shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = (base += 0.25f);
    out[path] = Tensor::from_floats(v, p->shape);
  }
  return out;
}

std::string load_error(nn::Module& root, std::map<std::string, Tensor> state,
                       nn::LoadStateOptions options = {}) {
  try {
    nn::load_state_dict(root, nn::TensorMapSource(std::move(state), "test checkpoint"), options);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(StateDict, LoadsEveryParameterAndTiesLmHead) {
  CausalLM lm = AutoModelForCausalLM::from_config(small(true));
  auto state = full_state(lm.module());
  EXPECT_EQ(state.count("lm_head.weight"), 0u);
  nn::load_state_dict(lm.module(), nn::TensorMapSource(state));
  for (auto& [path, p] : lm.module().named_parameters()) ASSERT_TRUE(p->value.defined()) << path;
  const Tensor& lm_head = lm.module().find_module("lm_head")->param("weight");
  const Tensor& embed = lm.module().find_module("model.embed_tokens")->param("weight");
  EXPECT_EQ(lm_head.data_as<float>(), embed.data_as<float>());  // shared storage
  EXPECT_EQ(lm.module().find_module("model.norm")->param("weight").to_doubles(),
            state["model.norm.weight"].to_doubles());
}

TEST(StateDict, TiedCopyInCheckpointIsIgnored) {
  CausalLM lm = AutoModelForCausalLM::from_config(small(true));
  auto state = full_state(lm.module());
  state["lm_head.weight"] = Tensor::zeros({10, 8}, DType::F32);
  EXPECT_EQ(load_error(lm.module(), state), "");
}

TEST(StateDict, MissingTensorsAreListedWithCount) {
  CausalLM lm = AutoModelForCausalLM::from_config(small(false));
  auto state = full_state(lm.module());
  for (const char* k :
       {"lm_head.weight", "model.norm.weight", "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight"})
    state.erase(k);
  std::string msg = load_error(lm.module(), state);
  EXPECT_NE(msg.find("7 tensor(s) the model needs are missing from test checkpoint"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("lm_head.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(7 in total)"), std::string::npos) << msg;
  // Nothing was loaded.
  EXPECT_FALSE(lm.module().find_module("model.embed_tokens")->slot("weight").value.defined());
}

TEST(StateDict, UnexpectedTensorsAreListed) {
  CausalLM lm = AutoModelForCausalLM::from_config(small(false));
  auto state = full_state(lm.module());
  state["model.layers.7.mlp.gate_proj.weight"] = Tensor::zeros({2}, DType::F32);
  std::string msg = load_error(lm.module(), state);
  EXPECT_NE(msg.find("1 tensor(s) in test checkpoint do not belong to the model"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("model.layers.7.mlp.gate_proj.weight"), std::string::npos) << msg;
  // Ignored suffixes (old rotary buffers) are fine.
  state.erase("model.layers.7.mlp.gate_proj.weight");
  state["model.layers.0.self_attn.rotary_emb.inv_freq"] = Tensor::zeros({2}, DType::F32);
  nn::LoadStateOptions opts;
  opts.ignore_unexpected_suffixes = {"rotary_emb.inv_freq"};
  EXPECT_EQ(load_error(lm.module(), state, opts), "");
}

TEST(StateDict, ShapeMismatchNamesTensorAndBothShapes) {
  CausalLM lm = AutoModelForCausalLM::from_config(small(false));
  auto state = full_state(lm.module());
  state["model.layers.0.mlp.down_proj.weight"] = Tensor::zeros({8, 13}, DType::F32);
  std::string msg = load_error(lm.module(), state);
  EXPECT_NE(msg.find("model.layers.0.mlp.down_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[8, 13]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[8, 12]"), std::string::npos) << msg;
}

TEST(StateDict, KeyMappingRenamesAndDrops) {
  CausalLM lm = AutoModelForCausalLM::from_config(small(false));
  std::map<std::string, Tensor> renamed;
  for (auto& [k, v] : full_state(lm.module())) renamed["base_model." + k] = v;
  renamed["base_model.extra.scale"] = Tensor::zeros({1}, DType::F32);
  nn::LoadStateOptions opts;
  opts.key_mapping = [](const std::string& key) -> std::optional<std::string> {
    if (key == "base_model.extra.scale") return std::nullopt;
    return key.substr(std::string("base_model.").size());
  };
  EXPECT_EQ(load_error(lm.module(), renamed, opts), "");
  EXPECT_TRUE(lm.module().find_module("lm_head")->slot("weight").value.defined());

  // Two keys onto one parameter is an error.
  CausalLM other = AutoModelForCausalLM::from_config(small(false));
  auto state = full_state(other.module());
  state["alias.norm"] = state["model.norm.weight"];
  opts.key_mapping = [](const std::string& key) -> std::optional<std::string> {
    return key == "alias.norm" ? std::string("model.norm.weight") : key;
  };
  EXPECT_NE(
      load_error(other.module(), state, opts).find("both map to parameter 'model.norm.weight'"),
      std::string::npos);
}

TEST(StateDict, LoadConvertsDtypeAndToConvertsBack) {
  CausalLM lm = AutoModelForCausalLM::from_config(small(true));
  auto state = full_state(lm.module());
  nn::LoadStateOptions opts;
  opts.dtype = DType::BF16;
  nn::load_state_dict(lm.module(), nn::TensorMapSource(state), opts);
  EXPECT_EQ(lm.module().find_module("model.norm")->param("weight").dtype(), DType::BF16);
  lm.to(Device::cpu(), DType::F32);
  EXPECT_EQ(lm.dtype(), DType::F32);
  const Tensor& w = lm.module().find_module("model.norm")->param("weight");
  EXPECT_EQ(w.dtype(), DType::F32);
  std::vector<double> want = state["model.norm.weight"].to_doubles();
  for (double& x : want) x = round_to(DType::BF16, static_cast<float>(x));
  EXPECT_EQ(w.to_doubles(), want);
  EXPECT_EQ(lm.module().find_module("lm_head")->param("weight").data_as<float>(),
            lm.module().find_module("model.embed_tokens")->param("weight").data_as<float>());
}

}  // namespace
}  // namespace hk
