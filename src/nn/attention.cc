// Self-attention with GQA, optional per-head q/k RMSNorm (Qwen3), rotary, and the static KV cache.
//
// The projections, norms and rotary go through their own modules' implementations; the attention
// core goes through this module's `attention` implementation, whose built-in version calls the
// attention function named by `attn_implementation()` (hk/attention_functions.h). With a cache,
// this call's keys/values are written at positions [length, length+S) of the layer's cache and the
// core attends over [0, length+S); the model advances the cache once all layers ran.
//
// Training (no cache): the attention function's training form (hk/attention_functions.h) saves
// its state (eager: probabilities; flash-style: lse). The layer keeps the projections q, k (before
// q/k norm and rotary), v and the attention output; backward recomputes the normed, rotated q and
// k (two cheap elementwise passes) rather than keeping a second copy of them.
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
  bool supports_training() const override { return true; }
  void forward_train(const Attention& layer, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& out, const AttentionCall& call, LayerContext& ctx,
                     Stream stream) const override {
    ctx.save("saved", training_form(layer).forward(q, k, v, out, call, stream));
  }
  void backward(const Attention& layer, const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor& out, const AttentionCall& call, LayerContext& ctx, const Tensor& dout,
                const Tensor& dq, const Tensor& dk, const Tensor& dv,
                Stream stream) const override {
    training_form(layer).backward(dout, q, k, v, out, ctx.saved("saved"), dq, dk, dv, call, stream);
  }

 private:
  static const AttentionTraining& training_form(const Attention& layer) {
    const std::string& name = layer.attn_implementation();
    if (const AttentionTraining* t = attention_training(name)) return *t;
    std::string names;
    for (const std::string& n : attention_training_names())
      names += (names.empty() ? "" : ", ") + n;
    throw Unsupported("attention implementation '" + name +
                      "' has no training form (no backward), so it cannot run a training forward; "
                      "attention implementations that can train: " +
                      names);
  }
};

// The q/k that the attention core sees: q/k norm (Qwen3) into new tensors, or copies, then
// rotated in place. Used by the training forward and again, to recompute them, by backward.
void normed_rotated(const Attention& layer, const Tensor& q, const Tensor& k,
                    const AttentionState& state, Tensor& qr, Tensor& kr, LayerContext* ctx,
                    Stream stream) {
  qr = Tensor::empty(q.sizes(), q.dtype(), q.device(), stream);
  kr = Tensor::empty(k.sizes(), k.dtype(), k.device(), stream);
  if (layer.q_norm) {
    if (ctx) {
      layer.q_norm->forward_train(q, qr, ctx->child("q_norm"), stream);
      layer.k_norm->forward_train(k, kr, ctx->child("k_norm"), stream);
    } else {
      layer.q_norm->forward(q, qr, stream);
      layer.k_norm->forward(k, kr, stream);
    }
  } else {
    qr.copy_from(q, stream);
    kr.copy_from(k, stream);
  }
  const Tensor cos = Tensor::wrap(*state.cos), sin = Tensor::wrap(*state.sin);
  if (ctx)
    layer.rotary_fn->forward_train(qr, kr, cos, sin, ctx->child("rotary_fn"), stream);
  else
    layer.rotary_fn->forward(qr, kr, cos, sin, stream);
}

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
  typed_impl().forward(*this, q, keys, values, attn, call_for(state), stream);
  o_proj->forward(attn.reshape({b, s, hq * d}), out, stream);
}

void Attention::forward_train(const Tensor& x, const Tensor& out, const AttentionState& state,
                              LayerContext& ctx, Stream stream) const {
  HK_CHECK(x.ndim() == 3, "attention: input must be [batch, seq, hidden], got " + x.view().str());
  HK_CHECK(state.cos && state.sin, "attention: rotary tables are required");
  HK_CHECK(state.cache == nullptr,
           "attention: a training forward does not use a KV cache (pass cache = nullptr)");
  const int64_t b = x.size(0), s = x.size(1), d = shape_.head_dim;
  const int64_t hq = shape_.num_heads, hkv = shape_.num_kv_heads;
  Tensor q = Tensor::empty({b, s, hq, d}, x.dtype(), x.device(), stream);
  Tensor k = Tensor::empty({b, s, hkv, d}, x.dtype(), x.device(), stream);
  Tensor v = Tensor::empty({b, s, hkv, d}, x.dtype(), x.device(), stream);
  q_proj->forward_train(x, q.reshape({b, s, hq * d}), ctx.child("q_proj"), stream);
  k_proj->forward_train(x, k.reshape({b, s, hkv * d}), ctx.child("k_proj"), stream);
  v_proj->forward_train(x, v.reshape({b, s, hkv * d}), ctx.child("v_proj"), stream);
  Tensor attn = Tensor::empty({b, s, hq, d}, x.dtype(), x.device(), stream);
  {
    Tensor qr, kr;
    normed_rotated(*this, q, k, state, qr, kr, &ctx, stream);
    typed_impl().forward_train(*this, qr, kr, v, attn, call_for(state), ctx.child("core"), stream);
  }
  o_proj->forward_train(attn.reshape({b, s, hq * d}), out, ctx.child("o_proj"), stream);
  ctx.save("q", q);
  ctx.save("k", k);
  ctx.save("v", v);
  ctx.save("attn", attn);
}

void Attention::backward(const Tensor& x, const AttentionState& state, LayerContext& ctx,
                         const Tensor& dout, const Tensor& dx, Stream stream) const {
  const int64_t b = x.size(0), s = x.size(1), d = shape_.head_dim;
  const int64_t hq = shape_.num_heads, hkv = shape_.num_kv_heads;
  const Tensor q = ctx.saved("q"), k = ctx.saved("k"), v = ctx.saved("v"), attn = ctx.saved("attn");
  Tensor dq = Tensor::empty(q.sizes(), q.dtype(), q.device(), stream);
  Tensor dk = Tensor::empty(k.sizes(), k.dtype(), k.device(), stream);
  Tensor dv = Tensor::empty(v.sizes(), v.dtype(), v.device(), stream);
  {
    Tensor dattn = Tensor::empty(attn.sizes(), attn.dtype(), attn.device(), stream);
    const Tensor dattn_rows = dattn.reshape({b, s, hq * d});
    o_proj->backward(attn.reshape({b, s, hq * d}), ctx.child("o_proj"), dout, &dattn_rows, false,
                     stream);
    Tensor qr, kr;
    normed_rotated(*this, q, k, state, qr, kr, nullptr, stream);
    typed_impl().backward(*this, qr, kr, v, attn, call_for(state), ctx.child("core"), dattn, dq, dk,
                          dv, stream);
  }
  rotary_fn->backward(Tensor::wrap(*state.cos), Tensor::wrap(*state.sin), ctx.child("rotary_fn"),
                      dq, dk, stream);
  if (q_norm) {
    Tensor dqn = Tensor::empty(q.sizes(), q.dtype(), q.device(), stream);
    Tensor dkn = Tensor::empty(k.sizes(), k.dtype(), k.device(), stream);
    q_norm->backward(q, ctx.child("q_norm"), dq, dqn, stream);
    k_norm->backward(k, ctx.child("k_norm"), dk, dkn, stream);
    dq = dqn;
    dk = dkn;
  }
  q_proj->backward(x, ctx.child("q_proj"), dq.reshape({b, s, hq * d}), &dx, false, stream);
  k_proj->backward(x, ctx.child("k_proj"), dk.reshape({b, s, hkv * d}), &dx, true, stream);
  v_proj->backward(x, ctx.child("v_proj"), dv.reshape({b, s, hkv * d}), &dx, true, stream);
}

AttentionCall Attention::call_for(const AttentionState& state) const {
  AttentionCall call;
  call.scale = scaling();
  call.causal = true;
  call.key_start = state.key_start;
  return call;
}

}  // namespace hk::nn
