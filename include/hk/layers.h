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
// implementation.
//
// Training (no autograd graph; ARCHITECTURE.md "Training"): every Impl also has
// `forward_train(layer, inputs..., outputs..., ctx)`, which writes the outputs and keeps in `ctx`
// what its backward needs, and `backward(layer, inputs..., ctx, d_outputs..., d_inputs...)`, which
// writes the input gradients and accumulates the parameter gradients (Module::grad_target). The
// layer's *inputs* are not kept in ctx: the caller keeps them (or recomputes them, e.g. a norm's
// output) and hands them back to backward, so a model decides what it stores. `backward` consumes
// ctx (it may overwrite the saved tensors in place); the caller drops ctx afterwards. Input
// gradients are written unless the signature says they may be added to. The default training
// methods of an Impl throw Unsupported naming it (and `supports_training()` is false), so an
// implementation without a backward is refused before a training forward starts.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hk/module.h"
#include "hk/ops.h"
#include "hk/stream.h"
#include "hk/tensor.h"

namespace hk {
class KVCache;  // hk/generation.h
}  // namespace hk

namespace hk::nn {

// What one layer call of a training forward keeps for its backward: named tensors plus named
// sub-contexts (a composite layer gives each child call its own). Tensors share storage with what
// they were saved from; nothing is copied.
class LayerContext {
 public:
  void save(const std::string& name, Tensor tensor) { tensors_[name] = std::move(tensor); }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws InvalidArgument naming the tensor when it was not saved.
  const Tensor& saved(const std::string& name) const;
  LayerContext& child(const std::string& name);
  // Drops one saved tensor (a backward done with it early).
  void release(const std::string& name) { tensors_.erase(name); }
  // Drops everything (the memory goes back to the allocator once nothing else holds it).
  void clear();
  // Bytes of the distinct storages this context and its children hold (a storage saved twice,
  // or views of one storage, count once): what keeping this context costs.
  size_t bytes() const;
  // Adds the distinct storages held here to `seen` (for summing over several contexts).
  void collect_storages(std::map<const void*, size_t>& seen) const;

 private:
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::unique_ptr<LayerContext>> children_;
};

// Thrown by the default training methods of an Impl.
[[noreturn]] void throw_no_training(const LayerImpl& impl, const char* layer);

// The dtype of saved statistics (rstd, lse, probabilities) and of the loss for activations of
// dtype `x`: f32, or f64 for the f64 CPU reference path (finite-difference tests).
inline DType statistics_dtype(DType x) {
  return x == DType::F64 ? DType::F64 : DType::F32;
}

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
class LinearGroupImpl;
class LinearImpl : public LayerImpl {
 public:
  virtual void forward(const Linear& layer, const TensorView& x, const TensorView& y,
                       Stream stream) const = 0;
  // Training forward: y as forward; x is the caller's to keep for backward.
  virtual void forward_train(const Linear& layer, const Tensor& x, const Tensor& y,
                             LayerContext& ctx, Stream stream) const;
  // dx = dy·W (written, or added to dx when `accumulate_dx`; skipped when dx is null);
  // weight and bias gradients accumulated (Module::grad_target), skipped for frozen ones.
  virtual void backward(const Linear& layer, const Tensor& x, LayerContext& ctx, const Tensor& dy,
                        const Tensor* dx, bool accumulate_dx, Stream stream) const;
  // The fused group this Linear was bound into with its siblings (see LinearGroupImpl), or null.
  virtual std::shared_ptr<const LinearGroupImpl> group() const { return nullptr; }
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
  void forward_train(const Tensor& x, const Tensor& y, LayerContext& ctx,
                     Stream stream = {}) const {
    typed_impl().forward_train(*this, x, y, ctx, stream);
  }
  void backward(const Tensor& x, LayerContext& ctx, const Tensor& dy, const Tensor* dx,
                bool accumulate_dx = false, Stream stream = {}) const {
    typed_impl().backward(*this, x, ctx, dy, dx, accumulate_dx, stream);
  }

 private:
  int64_t in_, out_;
  bool bias_;
};

// ---- sibling Linears that read one input (q/k/v, gate/up) ---------------------------------------
// kernelize can bind such siblings as one group (a parallel fusion: one kernel over their
// concatenated weights). Parents run their siblings through forward_linears & co.: a group whose
// members are all in the call, in order, runs once; every other Linear runs alone. A group member
// called alone still computes its own output (from its slice of the group's parameters).
struct LinearCall {
  const Linear* layer;
  Tensor y;          // forward: the output [..., out]; backward: d(output)
  std::string name;  // the child's name: where its training context lives
};
class LinearGroupImpl {
 public:
  virtual ~LinearGroupImpl() = default;
  virtual const std::vector<const Linear*>& members() const = 0;  // in call order
  // ys[i] = members()[i](x).
  virtual void forward(const TensorView& x, const std::vector<TensorView>& ys,
                       Stream stream) const = 0;
  virtual bool supports_training() const { return false; }
  virtual void forward_train(const Tensor& x, const std::vector<Tensor>& ys, LayerContext& ctx,
                             Stream stream) const;
  // dx = Σ dys[i]·W_i written (added to when `accumulate_dx`; skipped when null); the group's
  // parameter gradients accumulated.
  virtual void backward(const Tensor& x, LayerContext& ctx, const std::vector<Tensor>& dys,
                        const Tensor* dx, bool accumulate_dx, Stream stream) const;
};
void forward_linears(const TensorView& x, const std::vector<LinearCall>& calls, Stream stream = {});
// True when `b`'s weight rows directly follow `a`'s in one buffer, both contiguous (how the loader
// stores siblings on CUDA): then the two weights can be read as one matrix.
bool weights_adjacent(const Linear& a, const Linear& b);
void forward_train_linears(const Tensor& x, const std::vector<LinearCall>& calls, LayerContext& ctx,
                           Stream stream = {});
// dx written by the first call and added to by the others.
void backward_linears(const Tensor& x, LayerContext& ctx, const std::vector<LinearCall>& calls,
                      const Tensor& dx, Stream stream = {});

// ---- Embedding: out[..., H] = weight[ids[...]]
// ----------------------------------------------------
class Embedding;
class EmbeddingImpl : public LayerImpl {
 public:
  virtual void forward(const Embedding& layer, const TensorView& ids, const TensorView& out,
                       Stream stream) const = 0;
  virtual void forward_train(const Embedding& layer, const Tensor& ids, const Tensor& out,
                             LayerContext& ctx, Stream stream) const;
  // Scatter-adds dout into the weight gradient by ids.
  virtual void backward(const Embedding& layer, const Tensor& ids, LayerContext& ctx,
                        const Tensor& dout, Stream stream) const;
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
  void forward_train(const Tensor& ids, const Tensor& out, LayerContext& ctx,
                     Stream stream = {}) const {
    typed_impl().forward_train(*this, ids, out, ctx, stream);
  }
  void backward(const Tensor& ids, LayerContext& ctx, const Tensor& dout,
                Stream stream = {}) const {
    typed_impl().backward(*this, ids, ctx, dout, stream);
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
  // Training forward: y (must not alias x) as forward; keeps rstd (f32 [rows]) in ctx.
  virtual void forward_train(const RMSNorm& layer, const Tensor& x, const Tensor& y,
                             LayerContext& ctx, Stream stream) const;
  // dx written (must not alias dy); the weight gradient accumulated.
  virtual void backward(const RMSNorm& layer, const Tensor& x, LayerContext& ctx, const Tensor& dy,
                        const Tensor& dx, Stream stream) const;
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
  void forward_train(const Tensor& x, const Tensor& y, LayerContext& ctx,
                     Stream stream = {}) const {
    typed_impl().forward_train(*this, x, y, ctx, stream);
  }
  void backward(const Tensor& x, LayerContext& ctx, const Tensor& dy, const Tensor& dx,
                Stream stream = {}) const {
    typed_impl().backward(*this, x, ctx, dy, dx, stream);
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
  virtual void forward_train(const RotaryApply& layer, const Tensor& q, const Tensor& k,
                             const Tensor& cos, const Tensor& sin, LayerContext& ctx,
                             Stream stream) const;
  // dq/dk hold d(rotated q/k) and are turned into d(q/k) in place.
  virtual void backward(const RotaryApply& layer, const Tensor& cos, const Tensor& sin,
                        LayerContext& ctx, const Tensor& dq, const Tensor& dk, Stream stream) const;
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
  void forward_train(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin,
                     LayerContext& ctx, Stream stream = {}) const {
    typed_impl().forward_train(*this, q, k, cos, sin, ctx, stream);
  }
  void backward(const Tensor& cos, const Tensor& sin, LayerContext& ctx, const Tensor& dq,
                const Tensor& dk, Stream stream = {}) const {
    typed_impl().backward(*this, cos, sin, ctx, dq, dk, stream);
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
  // Training forward: out as forward; keeps the attention function's saved state (probs or lse).
  // q, k, v and out are the caller's to keep.
  virtual void forward_train(const Attention& layer, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const AttentionCall& call,
                             LayerContext& ctx, Stream stream) const;
  // dq [B, S, Hq, D], dk/dv [B, T, Hkv, D] written (dk/dv summed over each kv group).
  virtual void backward(const Attention& layer, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const AttentionCall& call, LayerContext& ctx,
                        const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                        Stream stream) const;
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
  // Training (no KV cache): keeps in ctx the projections q, k (before q/k norm and rotary), v,
  // the attention output and the children's contexts; the normed/rotated q and k are recomputed
  // in backward. x is the caller's to keep.
  void forward_train(const Tensor& x, const Tensor& out, const AttentionState& state,
                     LayerContext& ctx, Stream stream = {}) const;
  // dx [B, S, hidden] written; every projection's (and q/k norm's) parameter gradients added.
  void backward(const Tensor& x, const AttentionState& state, LayerContext& ctx, const Tensor& dout,
                const Tensor& dx, Stream stream = {}) const;

  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
  std::shared_ptr<RMSNorm> q_norm, k_norm;  // null without qk_norm
  std::shared_ptr<RotaryApply> rotary_fn;
  // q_proj, k_proj, v_proj read the same input; with qk_norm, q_proj → q_norm and k_proj → k_norm
  // are chains (the norms take the projections' outputs, per head).
  std::vector<ChildFlow> child_flows() const override;

 private:
  AttentionCall call_for(const AttentionState& state) const;
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
  // dx = dy·act'(x). Stateless: the activations need nothing but their inputs.
  virtual void backward(const Activation& layer, const Tensor& x, const Tensor& dy,
                        const Tensor& dx, Stream stream) const;
  // The gradients of out = act(gate)·up: dgate, dup written (may alias gate, up).
  virtual void backward_mul(const Activation& layer, const Tensor& gate, const Tensor& up,
                            const Tensor& dout, const Tensor& dgate, const Tensor& dup,
                            Stream stream) const;
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
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx, Stream stream = {}) const {
    typed_impl().backward(*this, x, dy, dx, stream);
  }
  void backward_mul(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate,
                    const Tensor& dup, Stream stream = {}) const {
    typed_impl().backward_mul(*this, gate, up, dout, dgate, dup, stream);
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
  // Training forward: y as forward. The built-in keeps gate(x) and up(x) and recomputes
  // act(gate)·up in backward; x is the caller's to keep.
  virtual void forward_train(const MLP& layer, const Tensor& x, const Tensor& y, LayerContext& ctx,
                             Stream stream) const;
  // dx written; the projections' parameter gradients added.
  virtual void backward(const MLP& layer, const Tensor& x, LayerContext& ctx, const Tensor& dy,
                        const Tensor& dx, Stream stream) const;
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
  void forward_train(const Tensor& x, const Tensor& y, LayerContext& ctx,
                     Stream stream = {}) const {
    typed_impl().forward_train(*this, x, y, ctx, stream);
  }
  void backward(const Tensor& x, LayerContext& ctx, const Tensor& dy, const Tensor& dx,
                Stream stream = {}) const {
    typed_impl().backward(*this, x, ctx, dy, dx, stream);
  }
  // The built-in implementation's forward into the caller's buffers: gate and up (through
  // forward_linears: one product when their weights and these outputs are adjacent), hidden =
  // act(gate)·up (may alias gate), y = down(hidden). The decode step calls it with persistent
  // buffers; the built-in MLP with fresh ones.
  void builtin_forward(const TensorView& x, const Tensor& gate, const Tensor& up,
                       const TensorView& hidden, const TensorView& y, Stream stream = {}) const;
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
  std::shared_ptr<Activation> act_fn;
  // gate_proj and up_proj read the same input (a parallel fusion may join them).
  std::vector<ChildFlow> child_flows() const override;

 private:
  int64_t hidden_, intermediate_;
};

// ---- ForCausalLMLoss: cross entropy of logits[:, t] against labels[:, t+1] ---------------------
// As Transformers' ForCausalLMLoss: labels are padded with -100 on the right and shifted by one
// (the last position predicts nothing), f32 math, ignore_index -100; the mean over non-ignored
// targets, or their sum / num_items_in_batch when that is > 0 (gradient accumulation).
struct CausalLMLossOptions {
  int64_t num_items_in_batch = 0;
};
class CausalLMLoss;
class CausalLMLossImpl : public LayerImpl {
 public:
  // logits [B, S, V], labels [B, S] i32/i64 (unshifted); loss f32 [1].
  virtual void forward(const CausalLMLoss& layer, const TensorView& logits,
                       const TensorView& labels, const TensorView& loss,
                       const CausalLMLossOptions& options, Stream stream) const = 0;
  // Training forward from logits; logits and labels are the caller's to keep.
  virtual void forward_train(const CausalLMLoss& layer, const Tensor& logits, const Tensor& labels,
                             const Tensor& loss, const CausalLMLossOptions& options,
                             LayerContext& ctx, Stream stream) const;
  // dlogits [B, S, V] written for the upstream gradient `dloss` (1 for Loss::backward; a host
  // value, since the loss is the last step of the tape).
  virtual void backward(const CausalLMLoss& layer, const Tensor& logits, const Tensor& labels,
                        const CausalLMLossOptions& options, LayerContext& ctx, float dloss,
                        const Tensor& dlogits, Stream stream) const;

  // A fused lm_head + loss (interface fused_linear_cross_entropy@1): the training forward takes
  // the final normed hidden states [B, S, H] and lm_head's weight instead of logits, so the
  // [tokens, vocab] logits never exist. True only for such implementations.
  virtual bool fuses_lm_head() const { return false; }
  virtual void forward_train_fused(const CausalLMLoss& layer, const Linear& lm_head,
                                   const Tensor& hidden, const Tensor& labels, const Tensor& loss,
                                   const CausalLMLossOptions& options, LayerContext& ctx,
                                   Stream stream) const;
  // dhidden written; lm_head's weight gradient (the embedding's, when tied) accumulated.
  virtual void backward_fused(const CausalLMLoss& layer, const Linear& lm_head,
                              const Tensor& hidden, const Tensor& labels,
                              const CausalLMLossOptions& options, LayerContext& ctx, float dloss,
                              const Tensor& dhidden, Stream stream) const;
};
class CausalLMLoss : public LayerModule<CausalLMLossImpl> {
 public:
  CausalLMLoss();
  void forward(const TensorView& logits, const TensorView& labels, const TensorView& loss,
               const CausalLMLossOptions& options = {}, Stream stream = {}) const {
    typed_impl().forward(*this, logits, labels, loss, options, stream);
  }
};

// The built-in loss from logits (what the built-in implementation's forward computes): for
// implementations that have logits only in some forwards.
void causal_lm_loss(const TensorView& logits, const TensorView& labels, const TensorView& loss,
                    const CausalLMLossOptions& options, Stream stream = {});

// Labels [B, S] shifted as ForCausalLMLoss does: out[b, t] = labels[b, t + 1], out[b, S-1] = -100
// (i64, labels' device). Used by the loss implementations so logits need no shifted copy.
Tensor shift_labels(const Tensor& labels, Stream stream = {});

}  // namespace hk::nn
