// Self-attention with GQA, optional per-head q/k RMSNorm (Qwen3), rotary, and the static KV cache.
//
// The projections, norms and rotary go through their own modules' implementations; the attention
// core goes through this module's `attention` implementation, whose built-in version calls the
// attention function named by `attn_implementation()` (hk/attention_functions.h). With a cache,
// this call's keys/values are written at positions [length, length+S) of the layer's cache and the
// core attends over [0, length+S); the model advances the cache once all layers ran.
#include <cmath>

#include "hk/attention_functions.h"
#include "hk/error.h"
#include "hk/generation.h"
#include "hk/layers.h"

namespace hk::nn {
namespace {

class BuiltinAttention final : public AttentionImpl {
 public:
  std::string name() const override { return "builtin"; }
  void forward(const Attention& layer, const TensorView& q, const TensorView& k,
               const TensorView& v, const TensorView& out, const AttentionCall& call,
               Stream stream) const override {
    attention_function(layer.attn_implementation())(q, k, v, out, call, stream);
  }
};

}  // namespace

Attention::Attention(std::string type_name, const AttentionShape& shape)
    : LayerModule(std::move(type_name), "attention", std::make_shared<BuiltinAttention>()),
      shape_(shape) {
  HK_CHECK(
      shape.num_heads > 0 && shape.num_kv_heads > 0 && shape.num_heads % shape.num_kv_heads == 0,
      "attention: num_attention_heads (" + std::to_string(shape.num_heads) +
          ") must be a positive multiple of num_key_value_heads (" +
          std::to_string(shape.num_kv_heads) + ")");
  const int64_t h = shape.hidden_size, d = shape.head_dim;
  q_proj = register_module("q_proj", std::make_shared<Linear>(h, shape.num_heads * d, shape.bias));
  k_proj =
      register_module("k_proj", std::make_shared<Linear>(h, shape.num_kv_heads * d, shape.bias));
  v_proj =
      register_module("v_proj", std::make_shared<Linear>(h, shape.num_kv_heads * d, shape.bias));
  o_proj = register_module("o_proj", std::make_shared<Linear>(shape.num_heads * d, h, shape.bias));
  if (shape.qk_norm) {
    q_norm = register_module(
        "q_norm", std::make_shared<RMSNorm>(shape.norm_type_name, d, shape.rms_norm_eps));
    k_norm = register_module(
        "k_norm", std::make_shared<RMSNorm>(shape.norm_type_name, d, shape.rms_norm_eps));
  }
  rotary_fn = register_module("rotary_fn", std::make_shared<RotaryApply>());
}

float Attention::scaling() const {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape_.head_dim)));
}

void Attention::set_attn_implementation(const std::string& name) {
  attention_function(name);  // throws with the registered names when unknown
  attn_implementation_ = name;
}

void Attention::forward(const TensorView& x, const TensorView& out, const AttentionState& state,
                        Stream stream) const {
  HK_CHECK(x.ndim == 3, "attention: input must be [batch, seq, hidden], got " + x.str());
  HK_CHECK(state.cos && state.sin, "attention: rotary tables are required");
  const int64_t b = x.shape[0], s = x.shape[1], d = shape_.head_dim;
  const int64_t hq = shape_.num_heads, hkv = shape_.num_kv_heads;

  Tensor q = Tensor::empty({b, s, hq, d}, x.dtype, x.device, stream);
  Tensor k = Tensor::empty({b, s, hkv, d}, x.dtype, x.device, stream);
  Tensor v = Tensor::empty({b, s, hkv, d}, x.dtype, x.device, stream);
  q_proj->forward(x, q.reshape({b, s, hq * d}), stream);
  k_proj->forward(x, k.reshape({b, s, hkv * d}), stream);
  v_proj->forward(x, v.reshape({b, s, hkv * d}), stream);
  if (q_norm) {
    Tensor qn = Tensor::empty(q.sizes(), q.dtype(), q.device(), stream);
    Tensor kn = Tensor::empty(k.sizes(), k.dtype(), k.device(), stream);
    q_norm->forward(q, qn, stream);
    k_norm->forward(k, kn, stream);
    q = qn;
    k = kn;
  }
  rotary_fn->forward(q, k, *state.cos, *state.sin, stream);

  Tensor keys = k, values = v;
  if (state.cache != nullptr) {
    KVCache& cache = *state.cache;
    const int64_t past = cache.length();
    if (past + s > cache.max_length())
      throw InvalidArgument("KV cache overflow: " + std::to_string(past) + " cached + " +
                            std::to_string(s) + " new positions exceed its capacity of " +
                            std::to_string(cache.max_length()));
    cache.keys(state.layer_index).slice(1, past, past + s).copy_from(k, stream);
    cache.values(state.layer_index).slice(1, past, past + s).copy_from(v, stream);
    keys = cache.keys(state.layer_index).slice(1, 0, past + s);
    values = cache.values(state.layer_index).slice(1, 0, past + s);
  }

  Tensor attn = Tensor::empty({b, s, hq, d}, x.dtype, x.device, stream);
  AttentionCall call;
  call.scale = scaling();
  call.causal = true;
  call.key_start = state.key_start;
  typed_impl().forward(*this, q, keys, values, attn, call, stream);
  o_proj->forward(attn.reshape({b, s, hq * d}), out, stream);
}

}  // namespace hk::nn
