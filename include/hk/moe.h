// hk/moe.h — the sparse mixture-of-experts MLP of Qwen3-MoE (Transformers'
// Qwen3MoeSparseMoeBlock) and its replaceable implementation, layer interface `MoeMLP`.
//
// The block is one layer (`model.layers.N.mlp`) with two parameter-holding children named as in
// Transformers 5.x, so checkpoint keys and gradient names match its `named_parameters()`:
//   gate     Qwen3MoeTopKRouter   weight        [E, H]
//   experts  Qwen3MoeExperts      gate_up_proj  [E, 2I, H]  (rows 0..I-1 gate, I..2I-1 up)
//                                 down_proj     [E, H, I]
//                                 act_fn        the experts' activation (`SiLU`), a layer child
// (The Hub's per-expert checkpoints, `experts.M.{gate,up,down}_proj.weight`, are converted into
// these tensors when they load; see src/models/qwen3_moe/.)
//
// Semantics, as Transformers computes them for x [T, H] in dtype D:
//   logits  = x · gateᵀ                                   (D, f32 accumulation)
//   probs   = softmax(logits) in f32; top-k by probability (ties: the lower expert index first)
//   w       = the top-k probabilities, divided by their sum when norm_topk_prob, rounded to D
//   y[t]    = Σ_k w[t,k] · down_e(act(gate_e(x[t])) · up_e(x[t]))   for e = the k-th expert of t
// The routing is not differentiable through the top-k choice; backward differentiates the
// weights (and through them the router) and every expert that got tokens.
//
// Like every layer (hk/layers.h), the block's forward never calls an op itself: it calls its
// `MoeMLPImpl`, the built-in one (hk::ops, routing on the host) unless kernelize bound a kernel
// (kernels-community/megablocks, interface moe_mlp@1).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "hk/layers.h"

namespace hk::nn {

struct MoeShape {
  int64_t hidden_size = 0;
  int64_t num_experts = 0;
  int64_t top_k = 0;              // num_experts_per_tok
  int64_t intermediate_size = 0;  // moe_intermediate_size (per expert)
  bool norm_topk_prob = false;
  std::string hidden_act = "silu";
  std::string prefix = "Qwen3Moe";  // class names: <prefix>SparseMoeBlock, ...
};

// `mlp.gate`: holds the router weight [E, H]; the MoeMLP implementation computes the routing.
class MoeRouter : public Module {
 public:
  MoeRouter(std::string type_name, int64_t num_experts, int64_t hidden_size);
  const Tensor& weight() const { return param("weight"); }
};

// `mlp.experts`: the experts' weights, stacked.
class MoeExperts : public Module {
 public:
  MoeExperts(std::string type_name, const MoeShape& shape);
  const Tensor& gate_up_proj() const { return param("gate_up_proj"); }
  const Tensor& down_proj() const { return param("down_proj"); }
  std::shared_ptr<Activation> act_fn;
};

class MoeMLP;
class MoeMLPImpl : public LayerImpl {
 public:
  // x [..., H] → y [..., H] (y must not alias x).
  virtual void forward(const MoeMLP& layer, const TensorView& x, const TensorView& y,
                       Stream stream) const = 0;
  // Training forward: y as forward, and router_logits [rows, E] in x's dtype (for the
  // load-balancing loss); keeps in ctx what backward needs. x is the caller's to keep.
  virtual void forward_train(const MoeMLP& layer, const Tensor& x, const Tensor& y,
                             const Tensor& router_logits, LayerContext& ctx, Stream stream) const;
  // dx written. `drouter_logits` (optional, f32 [rows, E]): a gradient on the router logits from
  // outside the block (the load-balancing loss), added to the one the routing weights give.
  // The router's and every expert's parameter gradients are accumulated.
  virtual void backward(const MoeMLP& layer, const Tensor& x, LayerContext& ctx, const Tensor& dy,
                        const Tensor* drouter_logits, const Tensor& dx, Stream stream) const;
};

class MoeMLP : public LayerModule<MoeMLPImpl> {
 public:
  explicit MoeMLP(const MoeShape& shape);
  const MoeShape& shape() const { return shape_; }
  int64_t hidden_size() const { return shape_.hidden_size; }
  int64_t num_experts() const { return shape_.num_experts; }
  int64_t top_k() const { return shape_.top_k; }
  int64_t intermediate_size() const { return shape_.intermediate_size; }
  bool norm_topk_prob() const { return shape_.norm_topk_prob; }

  void forward(const TensorView& x, const TensorView& y, Stream stream = {}) const {
    typed_impl().forward(*this, x, y, stream);
  }
  void forward_train(const Tensor& x, const Tensor& y, const Tensor& router_logits,
                     LayerContext& ctx, Stream stream = {}) const {
    typed_impl().forward_train(*this, x, y, router_logits, ctx, stream);
  }
  void backward(const Tensor& x, LayerContext& ctx, const Tensor& dy, const Tensor* drouter_logits,
                const Tensor& dx, Stream stream = {}) const {
    typed_impl().backward(*this, x, ctx, dy, drouter_logits, dx, stream);
  }

  std::shared_ptr<MoeExperts> experts;
  std::shared_ptr<MoeRouter> gate;

 private:
  MoeShape shape_;
};

// ---- the load-balancing (router auxiliary) loss -------------------------------------------------
// Transformers' load_balancing_loss_func over the router logits of every MoE layer of one forward
// (Switch Transformer eqs. 4-6): with p = softmax(logits) per layer (in the logits' dtype), f_e =
// the share of (non-padding) top-k assignments to expert e and P_e = the mean probability of e,
// both averaged over all layers, loss = E · Σ_e f_e · P_e. Padding rows (t < key_start[b]) are
// left out, as Transformers does with the attention mask.
struct LoadBalancingLoss {
  double value = 0.0;
  // d(loss)/d(router logits of layer l), f32 (f64 for f64 logits) [rows, E] on the logits' device:
  // the top-k counts are constants (top-k is not differentiable), the gradient flows through P.
  std::vector<Tensor> grads;
};
// `router_logits`: one [B·S, E] tensor per MoE layer (any device, float dtype); `key_start`: the
// left padding per row ([B] host ints, empty = none; B·S rows in row-major [B, S] order).
// `scale` multiplies the gradients (the coefficient and upstream gradient). Runs on the host
// (copies the logits there): a training step with output_router_logits pays one device-to-host
// copy of [tokens, E] per MoE layer.
LoadBalancingLoss load_balancing_loss(const std::vector<Tensor>& router_logits, int64_t top_k,
                                      const std::vector<int64_t>& key_start, int64_t seq,
                                      double scale, Stream stream = {});

}  // namespace hk::nn
