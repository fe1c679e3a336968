// Fuzz target for config.json and generation_config.json (hk/model_config.h): the same bytes go
// to ModelConfig::from_json and GenerationConfig::from_json.
//
// Valid outcomes: an hk::Error with a non-empty message, or a config a model can be built from —
// positive sizes within hk's bounds, num_attention_heads divisible by num_key_value_heads, a
// finite positive rms_norm_eps and rope_theta, positive rope factors — whose derived sizes
// (heads × head_dim, the per-layer KV cache row at max_position_embeddings) go through hk's
// checked size arithmetic without wrapping. A crash (deep nesting used to reach recursive code),
// a non-hk exception or a broken invariant (abort) is a bug. Seeds and every crash input:
// tests/fuzz/corpus/model_config/.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "hk/error.h"
#include "hk/model_config.h"
#include "hk/tensor.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const hk::ModelConfig c = hk::ModelConfig::from_json(text, "fuzz/config.json");
    if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 ||
        c.num_hidden_layers <= 0 || c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 ||
        c.head_dim <= 0 || c.max_position_embeddings <= 0)
      std::abort();
    if (c.num_attention_heads % c.num_key_value_heads != 0) std::abort();
    if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps)) std::abort();
    if (!(c.rope.rope_theta > 0) || !std::isfinite(c.rope.rope_theta)) std::abort();
    if (!(c.rope.factor > 0) || !(c.rope.low_freq_factor > 0) || !(c.rope.high_freq_factor > 0))
      std::abort();
    try {  // what generate() sizes from this config; may be too large, never wrapped
      const int64_t row = hk::checked_mul(c.num_key_value_heads, c.head_dim, "kv row");
      hk::checked_mul(row, c.max_position_embeddings, "kv cache");
      hk::checked_numel(hk::Shape{1, c.max_position_embeddings, c.num_key_value_heads, c.head_dim});
    } catch (const hk::InvalidArgument& e) {
      if (e.what()[0] == '\0') std::abort();
    }
  } catch (const hk::Error& e) {
    if (e.what()[0] == '\0') std::abort();
  }
  try {
    const hk::GenerationConfig g = hk::GenerationConfig::from_json(text, "fuzz/generation.json");
    if (g.temperature && !(std::isfinite(*g.temperature) && *g.temperature >= 0)) std::abort();
    if (g.top_p && !(*g.top_p >= 0 && *g.top_p <= 1)) std::abort();
  } catch (const hk::Error& e) {
    if (e.what()[0] == '\0') std::abort();
  }
  return 0;
}
