// hk/model_config.h — config.json and generation_config.json of a decoder-only LLM.
//
// Mixture-of-experts fields (Qwen3-MoE, `model_type` "qwen3_moe") are read for every model type;
// only the MoE models use them (see MoeConfig).
//
// Reads both the Transformers 4.x form (`rope_theta`, `rope_scaling`, `torch_dtype`) and the 5.x
// form (`rope_parameters {rope_type, rope_theta, ...}`, `dtype`). Only the fields hk's models use
// are kept; unknown fields are ignored, wrong types or impossible values are rejected with the
// field and file named. It deliberately does not decide which model class to build (see
// hk/models.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hk/dtype.h"
#include "hk/layers.h"

namespace hk {

// Transformers' Qwen3MoeConfig fields, with its defaults for `model_type` "qwen3_moe" (for other
// model types `num_experts` defaults to 0: no MoE layers). `num_experts` is read from
// `num_experts` (the Hub's configs) or `num_local_experts` (what Transformers 5.x writes).
struct MoeConfig {
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 8;     // top-k
  int64_t moe_intermediate_size = 768;
  bool norm_topk_prob = false;         // renormalise the top-k probabilities to sum to 1
  int64_t decoder_sparse_step = 1;     // layer i is sparse when (i + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;  // ... and i is not listed here
  double router_aux_loss_coef = 0.001;
  bool output_router_logits = false;  // training: add coef · load-balancing loss to the loss
  // Whether decoder layer `layer` has a sparse MoE block (Qwen3MoeDecoderLayer's rule).
  bool is_sparse_layer(int64_t layer) const;
};

struct ModelConfig {
  std::string model_type;                  // "qwen3", "llama"
  std::vector<std::string> architectures;  // e.g. {"Qwen3ForCausalLM"}
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  nn::RopeParameters rope;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  std::string hidden_act = "silu";
  std::optional<DType> dtype;  // `dtype` (5.x) or `torch_dtype` (4.x); nullopt when absent
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> pad_token_id;
  MoeConfig moe;

  // Parses config.json text; `source` names the file in errors.
  static ModelConfig from_json(const std::string& text, const std::string& source = "config.json");
  // Reads DIR/config.json (or a path to the file). NotFound when absent.
  static ModelConfig from_file(const std::string& path);
};

// generation_config.json (all optional).
struct GenerationConfig {
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> pad_token_id;
  std::optional<bool> do_sample;
  std::optional<double> temperature;
  std::optional<int64_t> top_k;
  std::optional<double> top_p;
  std::optional<int64_t> max_new_tokens;

  static GenerationConfig from_json(const std::string& text,
                                    const std::string& source = "generation_config.json");
  // Reads DIR/generation_config.json; an empty config when the file does not exist.
  static GenerationConfig from_dir(const std::string& dir);
};

}  // namespace hk
