// hk/layers.h — the building blocks of decoder-only LLMs (Qwen3, Llama) and their replaceable
// layer implementations.
//
// Each layer is a Module with a registered layer-interface name and an implementation object
// (`<Layer>Impl`). The layer's forward never calls an op or a kernel itself: it calls `impl()`,
// which defaults to the built-in implementation (hk/ops.h). kernelize swaps it with `set_impl()`;
// an adapter for a hub kernel subclasses the same `<Layer>Impl` and reads the module's parameters
// through the accessors below. Every forward writes into a caller-provided output (shapes as
// documented) on the given stream.
//
// Interfaces registered here: `Linear`, `Embedding`, `RMSNorm`, `rotary_pos_emb`, `attention`,
// `SiLU` (the MLP's act_fn), `MLP`, `ForCausalLMLoss`. Attention functions (`eager`, `sdpa`, ...)
// are a separate, name-keyed registry (hk/attention_functions.h) used by the built-in `attention`
// implementation. This header deliberately holds no training/backward logic.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "hk/module.h"
#include "hk/ops.h"
#include "hk/stream.h"
#include "hk/tensor.h"

namespace hk {
class KVCache;  // hk/generation.h
}  // namespace hk

namespace hk::nn {

// Helper base: a module whose forward goes through an `Impl` object of one interface type.
template <class Impl>
class LayerModule : public Module {
 public:
  LayerModule(std::string type_name, std::string layer_interface, std::shared_ptr<Impl> builtin)
      : Module(std::move(type_name), std::move(layer_interface)),
        builtin_(builtin),
        impl_(std::move(builtin)) {}
  std::shared_ptr<LayerImpl> impl() const override { return impl_; }
  const Impl& typed_impl() const { return *impl_; }
  void set_impl(std::shared_ptr<LayerImpl> impl) override {
    auto typed = std::dynamic_pointer_cast<Impl>(impl);
    if (!typed) Module::set_impl(std::move(impl));  // throws with the interface name
    impl_ = std::move(typed);
  }
  void reset_impl() override { impl_ = builtin_; }
  // True while the built-in implementation is bound (callers may then use fused built-in ops).
  bool uses_builtin() const { return impl_ == builtin_; }

 private:
  std::shared_ptr<Impl> builtin_;
  std::shared_ptr<Impl> impl_;
};

// ---- Linear: y[..., out] = x[..., in] · W^T (+ b)
// ------------------------------------------------
class Linear;
class LinearImpl : public LayerImpl {
 public:
  virtual void forward(const Linear& layer, const TensorView& x, const TensorView& y,
                       Stream stream) const = 0;
};
class Linear : public LayerModule<LinearImpl> {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias);
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  bool has_bias() const { return bias_; }
  const Tensor& weight() const { return param("weight"); }
  const Tensor* bias() const;  // null without bias
  void forward(const TensorView& x, const TensorView& y, Stream stream = {}) const {
    typed_impl().forward(*this, x, y, stream);
  }

 private:
  int64_t in_, out_;
  bool bias_;
};

// ---- Embedding: out[..., H] = weight[ids[...]]
// ----------------------------------------------------
class Embedding;
class EmbeddingImpl : public LayerImpl {
 public:
  virtual void forward(const Embedding& layer, const TensorView& ids, const TensorView& out,
                       Stream stream) const = 0;
};
class Embedding : public LayerModule<EmbeddingImpl> {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  int64_t num_embeddings() const { return num_; }
  int64_t embedding_dim() const { return dim_; }
  const Tensor& weight() const { return param("weight"); }
  void forward(const TensorView& ids, const TensorView& out, Stream stream = {}) const {
    typed_impl().forward(*this, ids, out, stream);
  }

 private:
  int64_t num_, dim_;
};

// ---- RMSNorm over the last dim (hidden size, or head_dim for q_norm/k_norm) ---------------------
class RMSNorm;
class RMSNormImpl : public LayerImpl {
 public:
  virtual void forward(const RMSNorm& layer, const TensorView& x, const TensorView& y,
                       Stream stream) const = 0;
};
class RMSNorm : public LayerModule<RMSNormImpl> {
 public:
  RMSNorm(std::string type_name, int64_t dim, double eps);
  int64_t dim() const { return dim_; }
  double eps() const { return eps_; }
  const Tensor& weight() const { return param("weight"); }
  // y may alias x.
  void forward(const TensorView& x, const TensorView& y, Stream stream = {}) const {
    typed_impl().forward(*this, x, y, stream);
  }

 private:
  int64_t dim_;
  double eps_;
};

// ---- rotary_pos_emb: applies cos/sin tables to q and k in place ---------------------------------
class RotaryApply;
class RotaryApplyImpl : public LayerImpl {
 public:
  // q [B, S, Hq, D], k [B, S, Hkv, D] rotated in place; cos/sin f32 [B or 1, S, D].
  virtual void forward(const RotaryApply& layer, const TensorView& q, const TensorView& k,
                       const TensorView& cos, const TensorView& sin, Stream stream) const = 0;
};
// A parameter-free child of each attention module (`self_attn.rotary_fn`), so the function can be
// kernelized per layer like Transformers' `use_kernelized_func(apply_rotary_pos_emb)`.
class RotaryApply : public LayerModule<RotaryApplyImpl> {
 public:
  RotaryApply();
  void forward(const TensorView& q, const TensorView& k, const TensorView& cos,
               const TensorView& sin, Stream stream = {}) const {
    typed_impl().forward(*this, q, k, cos, sin, stream);
  }
};

// RoPE parameters (from config.json `rope_parameters` / `rope_theta` + `rope_scaling`).
struct RopeParameters {
  std::string rope_type = "default";  // "default" or "llama3"
  double rope_theta = 10000.0;
  // llama3 only
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// The model-level table maker (`model.rotary_emb`): cos/sin for given positions. No parameters;
// inverse frequencies are computed on the host exactly as Transformers does (f32).
class RotaryEmbedding : public Module {
 public:
  RotaryEmbedding(std::string type_name, int64_t head_dim, RopeParameters rope);
  int64_t head_dim() const { return head_dim_; }
  const RopeParameters& rope() const { return rope_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  // positions [B, S] i32/i64 on any device (host positions avoid a copy back); cos/sin f32
  // [B, S, D] allocated here on `device`.
  void tables(const Tensor& positions, Device device, Tensor& cos, Tensor& sin,
              Stream stream = {}) const;

 private:
  int64_t head_dim_;
  RopeParameters rope_;
  std::vector<float> inv_freq_;
};

// ---- attention ---------------------------------------------------------------------------------
// What the attention core gets besides q/k/v.
struct AttentionCall {
  float scale = 0.0f;  // 0 -> 1/sqrt(head_dim)
  bool causal = true;
  const TensorView* key_start = nullptr;  // i32 [B] on the device, left padding; null = none
  float softcap = 0.0f;                   // 0 = none; else scores = softcap·tanh(scores/softcap)
  int64_t window_left = -1;               // sliding window (keys this far left of the diagonal)
  // Packed sequences (varlen): q/k/v are [1, total, H, D] and sequence b is rows
  // [cu[b], cu[b+1]); i32 [B+1] on the device, max_seqlen_* bound the lengths. Null = batch.
  const TensorView* cu_seqlens_q = nullptr;
  const TensorView* cu_seqlens_k = nullptr;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  bool deterministic = false;  // backward without floating-point atomics
};
class Attention;
class AttentionImpl : public LayerImpl {
 public:
  // q [B, S, Hq, D], k/v [B, T, Hkv, D] (T ≥ S; queries are the last S positions), out [B, S, Hq,
  // D].
  virtual void forward(const Attention& layer, const TensorView& q, const TensorView& k,
                       const TensorView& v, const TensorView& out, const AttentionCall& call,
                       Stream stream) const = 0;
};

// Everything a decoder layer's attention needs for one forward.
struct AttentionState {
  const TensorView* cos = nullptr;  // f32 [B, S, D]
  const TensorView* sin = nullptr;
  const TensorView* key_start = nullptr;  // i32 [B] or null
  KVCache* cache = nullptr;               // null: attend over this call's keys only
  int64_t layer_index = 0;
};

struct AttentionShape {
  int64_t hidden_size, num_heads, num_kv_heads, head_dim;
  bool bias = false;     // q/k/v/o biases (Llama attention_bias, Qwen2-style)
  bool qk_norm = false;  // Qwen3 per-head RMSNorm on q and k
  double rms_norm_eps = 1e-6;
  std::string norm_type_name = "RMSNorm";
};

// Self-attention: q/k/v/o projections, optional q_norm/k_norm, rotary, the attention core
// (through its impl, whose built-in version calls the attention function named by
// `attn_implementation()`), KV cache update.
class Attention : public LayerModule<AttentionImpl> {
 public:
  Attention(std::string type_name, const AttentionShape& shape);
  const AttentionShape& shape() const { return shape_; }
  float scaling() const;
  // The attention function name ("eager", "sdpa", ...) the built-in implementation calls.
  const std::string& attn_implementation() const { return attn_implementation_; }
  void set_attn_implementation(const std::string& name);  // validated against the registry

  // x, out [B, S, hidden].
  void forward(const TensorView& x, const TensorView& out, const AttentionState& state,
               Stream stream = {}) const;

  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
  std::shared_ptr<RMSNorm> q_norm, k_norm;  // null without qk_norm
  std::shared_ptr<RotaryApply> rotary_fn;

 private:
  AttentionShape shape_;
  std::string attn_implementation_ = "eager";
};

// ---- activation (the MLP's act_fn, interface `SiLU`) ------------------------------------------
class Activation;
class ActivationImpl : public LayerImpl {
 public:
  virtual void forward(const Activation& layer, const TensorView& x, const TensorView& y,
                       Stream stream) const = 0;
  // out = act(gate) * up. Implementations without a fused form may compose forward + ops::mul.
  virtual void forward_mul(const Activation& layer, const TensorView& gate, const TensorView& up,
                           const TensorView& out, Stream stream) const = 0;
};
class Activation : public LayerModule<ActivationImpl> {
 public:
  // `hidden_act` as in config.json: "silu" (registered as `SiLU`), "gelu", "gelu_pytorch_tanh".
  explicit Activation(const std::string& hidden_act);
  ops::Activation kind() const { return kind_; }
  void forward(const TensorView& x, const TensorView& y, Stream stream = {}) const {
    typed_impl().forward(*this, x, y, stream);
  }
  void forward_mul(const TensorView& gate, const TensorView& up, const TensorView& out,
                   Stream stream = {}) const {
    typed_impl().forward_mul(*this, gate, up, out, stream);
  }

 private:
  ops::Activation kind_;
};

// ---- MLP: down(act(gate(x)) * up(x)) -----------------------------------------------------------
class MLP;
class MLPImpl : public LayerImpl {
 public:
  virtual void forward(const MLP& layer, const TensorView& x, const TensorView& y,
                       Stream stream) const = 0;
};
class MLP : public LayerModule<MLPImpl> {
 public:
  MLP(std::string type_name, int64_t hidden_size, int64_t intermediate_size, bool bias,
      const std::string& hidden_act);
  int64_t hidden_size() const { return hidden_; }
  int64_t intermediate_size() const { return intermediate_; }
  void forward(const TensorView& x, const TensorView& y, Stream stream = {}) const {
    typed_impl().forward(*this, x, y, stream);
  }
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
  std::shared_ptr<Activation> act_fn;

 private:
  int64_t hidden_, intermediate_;
};

// ---- ForCausalLMLoss: mean cross entropy of logits[:, t] against labels[:, t+1] ----------------
class CausalLMLoss;
class CausalLMLossImpl : public LayerImpl {
 public:
  // logits [B, S, V], labels [B, S] i64 (ignore_index -100); loss f32 scalar [1].
  virtual void forward(const CausalLMLoss& layer, const TensorView& logits,
                       const TensorView& labels, const TensorView& loss, Stream stream) const = 0;
};
class CausalLMLoss : public LayerModule<CausalLMLossImpl> {
 public:
  CausalLMLoss();
  void forward(const TensorView& logits, const TensorView& labels, const TensorView& loss,
               Stream stream = {}) const {
    typed_impl().forward(*this, logits, labels, loss, stream);
  }
};

}  // namespace hk::nn
