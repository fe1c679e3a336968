// config.json / generation_config.json parsing for decoder-only LLMs (Transformers 4.x and 5.x
// forms). Every field is type-checked and named in the error; unknown fields are ignored. Values
// a model cannot run with (a non-positive or non-finite rms_norm_eps, rope factors of 0, ...) are
// refused here rather than turning into NaNs or divisions by zero later.
//
// Files are read as regular files only (a FIFO named config.json is refused, not waited on), at
// most 64 MiB, through the strict JSON reader (nesting depth bounded). A key given twice keeps the
// last value, as Python's json.load — and so Transformers — does.
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "core/strict_json.h"
#include "hk/error.h"
#include "hk/model_config.h"

namespace hk {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr size_t kMaxConfigBytes = 64u << 20;

std::string read_text(const fs::path& path, const char* what) {
  try {
    return files::read_regular_file(path, kMaxConfigBytes, what);
  } catch (const NotFound&) {
    throw NotFound(std::string(what) + " not found at " + path.string());
  }
}

json parse_object(const std::string& text, const std::string& source) {
  JsonLimits limits;
  limits.allow_duplicate_keys = true;  // Python's json.load keeps the last; so does Transformers
  json j = parse_json_strict(text, source + " ", limits);
  if (!j.is_object()) throw InvalidArgument(source + " must hold a JSON object");
  return j;
}

struct Fields {
  const json& j;
  const std::string& source;

  [[noreturn]] void bad(const std::string& key, const std::string& expected) const {
    std::string got = j.at(key).dump(-1, ' ', false, json::error_handler_t::replace);
    if (got.size() > 120) got = got.substr(0, 120) + "...";
    throw InvalidArgument(source + ": field '" + key + "' must be " + expected + ", got " +
                          escape_control_bytes(got));
  }
  bool present(const std::string& key) const { return j.contains(key) && !j.at(key).is_null(); }
  int64_t integer(const std::string& key) const {
    if (!present(key)) throw InvalidArgument(source + ": required field '" + key + "' is missing");
    return opt_integer(key).value();
  }
  std::optional<int64_t> opt_integer(const std::string& key) const {
    if (!present(key)) return std::nullopt;
    const json& v = j.at(key);
    if (!v.is_number_integer()) bad(key, "an integer");
    return v.get<int64_t>();
  }
  int64_t positive(const std::string& key) const {
    int64_t v = integer(key);
    if (v <= 0) bad(key, "a positive integer");
    return v;
  }
  std::optional<double> opt_number(const std::string& key) const {
    if (!present(key)) return std::nullopt;
    const json& v = j.at(key);
    if (!v.is_number()) bad(key, "a number");
    return v.get<double>();
  }
  // A finite number > 0 (epsilons, rope factors: 0 or a negative value means a division by zero
  // or a NaN later).
  std::optional<double> opt_positive_number(const std::string& key) const {
    auto v = opt_number(key);
    if (v && !(std::isfinite(*v) && *v > 0)) bad(key, "a finite number greater than 0");
    return v;
  }
  std::optional<bool> opt_bool(const std::string& key) const {
    if (!present(key)) return std::nullopt;
    const json& v = j.at(key);
    if (!v.is_boolean()) bad(key, "true or false");
    return v.get<bool>();
  }
  std::optional<std::string> opt_string(const std::string& key) const {
    if (!present(key)) return std::nullopt;
    const json& v = j.at(key);
    if (!v.is_string()) bad(key, "a string");
    return v.get<std::string>();
  }
  // An id or a list of ids (eos_token_id).
  std::vector<int64_t> id_list(const std::string& key) const {
    std::vector<int64_t> out;
    if (!present(key)) return out;
    const json& v = j.at(key);
    if (v.is_number_integer()) return {v.get<int64_t>()};
    if (!v.is_array()) bad(key, "a token id or a list of token ids");
    for (const json& e : v) {
      if (!e.is_number_integer()) bad(key, "a token id or a list of token ids");
      out.push_back(e.get<int64_t>());
    }
    return out;
  }
};

void parse_rope_dict(const json& r, const std::string& source, const std::string& key,
                     nn::RopeParameters& rope) {
  if (!r.is_object()) throw InvalidArgument(source + ": field '" + key + "' must be an object");
  Fields f{r, source};
  if (auto t = f.opt_string("rope_type"))
    rope.rope_type = *t;
  else if (auto t2 = f.opt_string("type"))
    rope.rope_type = *t2;  // 4.x legacy spelling
  if (auto v = f.opt_positive_number("rope_theta")) rope.rope_theta = *v;
  if (auto v = f.opt_positive_number("factor")) rope.factor = *v;
  if (auto v = f.opt_positive_number("low_freq_factor")) rope.low_freq_factor = *v;
  if (auto v = f.opt_positive_number("high_freq_factor")) rope.high_freq_factor = *v;
  if (auto v = f.opt_integer("original_max_position_embeddings")) {
    if (*v <= 0) f.bad("original_max_position_embeddings", "a positive integer");
    rope.original_max_position_embeddings = *v;
  }
  // Llama 3 smooths between the two wavelengths: (… - low) / (high - low).
  if (rope.rope_type == "llama3" && !(rope.high_freq_factor > rope.low_freq_factor))
    throw InvalidArgument(source + ": field '" + key + "' has high_freq_factor " +
                          std::to_string(rope.high_freq_factor) + " <= low_freq_factor " +
                          std::to_string(rope.low_freq_factor) +
                          "; llama3 rope scaling needs high_freq_factor > low_freq_factor");
}

// The MoE fields (Qwen3MoeConfig's names and defaults; see hk/model_config.h).
void parse_moe(const json& j, const Fields& f, const std::string& source, ModelConfig& c) {
  MoeConfig& m = c.moe;
  const bool moe_type = c.model_type == "qwen3_moe";
  auto experts = f.opt_integer("num_experts");
  auto local = f.opt_integer("num_local_experts");
  if (experts && local && *experts != *local)
    throw InvalidArgument(source + ": num_experts (" + std::to_string(*experts) +
                          ") and num_local_experts (" + std::to_string(*local) +
                          ") disagree; they name the same field, keep one");
  m.num_experts = experts ? *experts : local ? *local : (moe_type ? 128 : 0);
  if (m.num_experts < 0 || m.num_experts > 4096)
    throw InvalidArgument(source + ": num_experts must be in [0, 4096], got " +
                          std::to_string(m.num_experts));
  m.num_experts_per_tok = f.opt_integer("num_experts_per_tok").value_or(m.num_experts_per_tok);
  m.moe_intermediate_size =
      f.opt_integer("moe_intermediate_size").value_or(m.moe_intermediate_size);
  m.decoder_sparse_step = f.opt_integer("decoder_sparse_step").value_or(m.decoder_sparse_step);
  m.norm_topk_prob = f.opt_bool("norm_topk_prob").value_or(m.norm_topk_prob);
  m.output_router_logits = f.opt_bool("output_router_logits").value_or(m.output_router_logits);
  m.router_aux_loss_coef = f.opt_number("router_aux_loss_coef").value_or(m.router_aux_loss_coef);
  if (f.present("mlp_only_layers")) {
    if (!j["mlp_only_layers"].is_array()) f.bad("mlp_only_layers", "a list of layer indices");
    for (const json& e : j["mlp_only_layers"]) {
      if (!e.is_number_integer()) f.bad("mlp_only_layers", "a list of layer indices");
      m.mlp_only_layers.push_back(e.get<int64_t>());
    }
  }
  if (m.num_experts == 0) return;
  if (m.num_experts_per_tok <= 0 || m.num_experts_per_tok > m.num_experts)
    throw InvalidArgument(source + ": num_experts_per_tok must be in [1, num_experts = " +
                          std::to_string(m.num_experts) + "], got " +
                          std::to_string(m.num_experts_per_tok));
  if (m.moe_intermediate_size <= 0 || m.moe_intermediate_size > (int64_t{1} << 22))
    f.bad("moe_intermediate_size", "a positive integer (at most 4194304)");
  if (m.decoder_sparse_step <= 0) f.bad("decoder_sparse_step", "a positive integer");
}

}  // namespace

bool MoeConfig::is_sparse_layer(int64_t layer) const {
  if (num_experts <= 0) return false;
  for (int64_t l : mlp_only_layers)
    if (l == layer) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

ModelConfig ModelConfig::from_json(const std::string& text, const std::string& source) {
  json j = parse_object(text, source);
  Fields f{j, source};
  ModelConfig c;
  auto model_type = f.opt_string("model_type");
  if (!model_type) throw InvalidArgument(source + ": required field 'model_type' is missing");
  c.model_type = *model_type;
  if (f.present("architectures")) {
    if (!j["architectures"].is_array()) f.bad("architectures", "a list of strings");
    for (const json& a : j["architectures"]) {
      if (!a.is_string()) f.bad("architectures", "a list of strings");
      c.architectures.push_back(a.get<std::string>());
    }
  }
  c.vocab_size = f.positive("vocab_size");
  c.hidden_size = f.positive("hidden_size");
  c.intermediate_size = f.positive("intermediate_size");
  c.num_hidden_layers = f.positive("num_hidden_layers");
  c.num_attention_heads = f.positive("num_attention_heads");
  // Bounds far above any real model, so a corrupt config cannot make the (unallocated) tree huge.
  auto at_most = [&](const char* key, int64_t value, int64_t limit) {
    if (value > limit)
      throw InvalidArgument(source + ": field '" + key + "' is " + std::to_string(value) +
                            ", more than hk accepts (" + std::to_string(limit) + ")");
  };
  at_most("vocab_size", c.vocab_size, int64_t{1} << 31);
  at_most("hidden_size", c.hidden_size, int64_t{1} << 20);
  at_most("intermediate_size", c.intermediate_size, int64_t{1} << 22);
  at_most("num_hidden_layers", c.num_hidden_layers, 4096);
  at_most("num_attention_heads", c.num_attention_heads, 4096);
  c.num_key_value_heads = f.opt_integer("num_key_value_heads").value_or(c.num_attention_heads);
  if (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0)
    throw InvalidArgument(
        source + ": num_key_value_heads (" + std::to_string(c.num_key_value_heads) +
        ") must divide num_attention_heads (" + std::to_string(c.num_attention_heads) + ")");
  if (auto hd = f.opt_integer("head_dim")) {
    if (*hd <= 0) f.bad("head_dim", "a positive integer");
    at_most("head_dim", *hd, 1 << 16);
    c.head_dim = *hd;
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      throw InvalidArgument(source +
                            ": hidden_size must be divisible by num_attention_heads when "
                            "head_dim is not given");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.max_position_embeddings = f.opt_integer("max_position_embeddings").value_or(2048);
  if (c.max_position_embeddings <= 0) f.bad("max_position_embeddings", "a positive integer");
  c.rms_norm_eps = f.opt_positive_number("rms_norm_eps").value_or(1e-6);
  c.tie_word_embeddings = f.opt_bool("tie_word_embeddings").value_or(false);
  c.attention_bias = f.opt_bool("attention_bias").value_or(false);
  c.mlp_bias = f.opt_bool("mlp_bias").value_or(false);
  c.hidden_act = f.opt_string("hidden_act").value_or("silu");
  if (f.opt_bool("use_sliding_window").value_or(false))
    throw Unsupported(source + ": use_sliding_window=true is not supported by hk yet");

  // RoPE: 5.x `rope_parameters`, else 4.x `rope_theta` + `rope_scaling`.
  if (auto theta = f.opt_positive_number("rope_theta")) c.rope.rope_theta = *theta;
  if (f.present("rope_scaling")) parse_rope_dict(j["rope_scaling"], source, "rope_scaling", c.rope);
  if (f.present("rope_parameters"))
    parse_rope_dict(j["rope_parameters"], source, "rope_parameters", c.rope);
  if (!(c.rope.rope_theta > 0) || !std::isfinite(c.rope.rope_theta))
    throw InvalidArgument(source + ": rope_theta must be a finite number greater than 0");

  // dtype: 5.x `dtype`, 4.x `torch_dtype`.
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (auto d = f.opt_string(key)) {
      if (*d == "auto") continue;
      try {
        c.dtype = parse_dtype(*d);
      } catch (const Error&) {
        throw InvalidArgument(source + ": field '" + key + "' names an unknown dtype '" + *d + "'");
      }
      break;
    }
  }
  c.eos_token_ids = f.id_list("eos_token_id");
  c.bos_token_id = f.opt_integer("bos_token_id");
  c.pad_token_id = f.opt_integer("pad_token_id");
  parse_moe(j, f, source, c);
  return c;
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  fs::path p(path);
  if (fs::is_directory(p)) p /= "config.json";
  return from_json(read_text(p, "config.json"), p.string());
}

GenerationConfig GenerationConfig::from_json(const std::string& text, const std::string& source) {
  json j = parse_object(text, source);
  Fields f{j, source};
  GenerationConfig g;
  g.eos_token_ids = f.id_list("eos_token_id");
  g.bos_token_id = f.opt_integer("bos_token_id");
  g.pad_token_id = f.opt_integer("pad_token_id");
  g.do_sample = f.opt_bool("do_sample");
  g.temperature = f.opt_number("temperature");
  if (g.temperature && !(std::isfinite(*g.temperature) && *g.temperature >= 0))
    f.bad("temperature", "a finite number >= 0");
  g.top_k = f.opt_integer("top_k");
  g.top_p = f.opt_number("top_p");
  if (g.top_p && !(*g.top_p >= 0 && *g.top_p <= 1)) f.bad("top_p", "a number in [0, 1]");
  g.max_new_tokens = f.opt_integer("max_new_tokens");
  return g;
}

GenerationConfig GenerationConfig::from_dir(const std::string& dir) {
  fs::path p = fs::path(dir) / "generation_config.json";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(p, ec))) return {};
  return from_json(read_text(p, "generation_config.json"), p.string());
}

}  // namespace hk
