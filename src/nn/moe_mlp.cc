// The sparse MoE block (hk/moe.h) and its built-in implementation: hk's "eager PyTorch" of
// Transformers' Qwen3MoeSparseMoeBlock, on any device through hk::ops, correct and simple.
//
// Forward: router logits by ops::linear; the routing (softmax, top-k, renormalisation, grouping by
// expert) on the host (moe_routing.h) — on CUDA that is a device-to-host copy of the [T, E]
// logits and a sync, as Transformers' eager loop syncs on `nonzero`; the megablocks kernel does it
// on the device. Then: the tokens gathered in expert order (ops::embedding over x's rows), one
// gate_up and one down GEMM per expert that got tokens, act(gate)·up through `experts.act_fn`,
// each row scaled by its routing weight rounded to the dtype, and a scatter-add back to the tokens
// (ops::embedding_backward: index_add_). The roundings are Transformers': every GEMM output,
// act(gate), the product, and the weighted rows are rounded to the dtype; the k rows of a token
// are summed in f32 and rounded once (Transformers adds them in the dtype, expert by expert).
//
// Training keeps the router logits, the gathered gate_up pre-activations and the expert order of
// the rows; backward recomputes the routing from the logits, act(gate)·up and the expert outputs
// (their dot product with dy is the gradient of each routing weight), like the dense MLP trades a
// GEMM for memory. Deliberately no fused or fast path here: that is kernels-community/megablocks.
#include <algorithm>

#include "hk/error.h"
#include "hk/moe.h"
#include "hk/ops.h"
#include "nn/moe_routing.h"
#include "nn/param_grad.h"

namespace hk::nn {
namespace {

std::vector<double> host_doubles(const Tensor& t, Stream stream) {
  return (t.device().is_cpu() ? t : t.to(Device::cpu(), stream)).to_doubles();
}

// Host values as a tensor of `dtype` on `device` (rounded once from double).
Tensor device_tensor(const std::vector<double>& values, const Shape& shape, DType dtype,
                     Device device, Stream stream) {
  Tensor host = Tensor::empty(shape, DType::F64);
  std::copy(values.begin(), values.end(), host.data_as<double>());
  if (dtype != DType::F64) {
    Tensor cast = Tensor::empty(shape, dtype);
    ops::cast(host, cast);
    host = cast;
  }
  return device.is_cpu() ? host : host.to(device, stream);
}

Tensor device_ints(const std::vector<int64_t>& values, Device device, Stream stream) {
  Tensor host = Tensor::from_ints(values, {static_cast<int64_t>(values.size())}, DType::I64);
  return device.is_cpu() ? host : host.to(device, stream);
}

Tensor rows_of(const TensorView& v, int64_t cols, Stream stream) {
  Tensor t = Tensor::wrap(v);
  if (!t.is_contiguous()) t = t.contiguous(stream);
  return t.reshape({t.numel() / cols, cols});
}

// The routing of x's logits, with the device tensors the expert loop needs.
struct Routed {
  moe::Routing routing;
  Tensor sorted_token;    // i64 [N] on the device
  Tensor sorted_weights;  // dtype [N, 1] on the device: each sorted row's weight, rounded
};

Routed route_logits(const MoeMLP& layer, const Tensor& logits, Stream stream) {
  Routed r;
  const int64_t tokens = logits.size(0);
  r.routing = moe::route(host_doubles(logits, stream), tokens, layer.num_experts(), layer.top_k(),
                         layer.norm_topk_prob(), logits.dtype() != DType::F64);
  const auto& rt = r.routing;
  std::vector<double> w(rt.sorted_slot.size());
  for (size_t n = 0; n < w.size(); ++n) w[n] = rt.weights[static_cast<size_t>(rt.sorted_slot[n])];
  r.sorted_token = device_ints(rt.sorted_token, logits.device(), stream);
  r.sorted_weights = device_tensor(w, {static_cast<int64_t>(w.size()), 1}, logits.dtype(),
                                   logits.device(), stream);
  return r;
}

// Calls f(e, first_row, end_row) for every expert with at least one row.
template <class F>
void for_each_expert(const moe::Routing& r, F&& f) {
  for (int64_t e = 0; e < r.experts; ++e)
    if (r.offsets[e + 1] > r.offsets[e]) f(e, r.offsets[e], r.offsets[e + 1]);
}

class BuiltinMoeMLP final : public MoeMLPImpl {
 public:
  std::string name() const override { return "builtin"; }

  void forward(const MoeMLP& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    const Tensor x2 = rows_of(x, layer.hidden_size(), stream);
    Tensor logits = Tensor::empty({x2.size(0), layer.num_experts()}, x.dtype, x.device, stream);
    Tensor gate_up;
    run_forward(layer, x2, rows_of(y, layer.hidden_size(), stream), logits, gate_up, nullptr,
                stream);
  }

  bool supports_training() const override { return true; }
  void forward_train(const MoeMLP& layer, const Tensor& x, const Tensor& y,
                     const Tensor& router_logits, LayerContext& ctx, Stream stream) const override {
    Tensor gate_up, sorted_token;
    run_forward(layer, rows_of(x, layer.hidden_size(), stream),
                rows_of(y, layer.hidden_size(), stream), router_logits, gate_up, &sorted_token,
                stream);
    ctx.save("router_logits", router_logits);
    ctx.save("gate_up", gate_up);
    ctx.save("sorted_token", sorted_token);
  }

  void backward(const MoeMLP& layer, const Tensor& x, LayerContext& ctx, const Tensor& dy,
                const Tensor* drouter_logits, const Tensor& dx, Stream stream) const override;

 private:
  // y = the block of x2 [T, H]; logits [T, E] written; gate_up [N, 2I] made (sorted rows).
  void run_forward(const MoeMLP& layer, const Tensor& x2, const Tensor& y2, const Tensor& logits,
                   Tensor& gate_up, Tensor* sorted_token_out, Stream stream) const {
    const MoeExperts& ex = *layer.experts;
    const int64_t H = layer.hidden_size(), I = layer.intermediate_size();
    const DType dt = x2.dtype();
    const Device dev = x2.device();
    ops::linear(x2, layer.gate->weight(), nullptr, logits, stream);
    const Routed rt = route_logits(layer, logits, stream);
    const int64_t n = static_cast<int64_t>(rt.routing.sorted_token.size());
    Tensor xs = Tensor::empty({n, H}, dt, dev, stream);
    ops::embedding(x2, rt.sorted_token, xs, stream);
    gate_up = Tensor::empty({n, 2 * I}, dt, dev, stream);
    Tensor act = Tensor::empty({n, I}, dt, dev, stream);
    Tensor out = Tensor::empty({n, H}, dt, dev, stream);
    for_each_expert(rt.routing, [&](int64_t e, int64_t r0, int64_t r1) {
      ops::linear(xs.slice(0, r0, r1), ex.gate_up_proj().select(0, e), nullptr,
                  gate_up.slice(0, r0, r1), stream);
    });
    ex.act_fn->forward_mul(gate_up.slice(1, 0, I), gate_up.slice(1, I, 2 * I), act, stream);
    for_each_expert(rt.routing, [&](int64_t e, int64_t r0, int64_t r1) {
      ops::linear(act.slice(0, r0, r1), ex.down_proj().select(0, e), nullptr, out.slice(0, r0, r1),
                  stream);
    });
    ops::mul(out, rt.sorted_weights.expand({n, H}), out, stream);
    ops::fill(y2, 0.0, stream);
    ops::embedding_backward(out, rt.sorted_token, y2, stream);  // index_add_ over the tokens
    if (sorted_token_out) *sorted_token_out = rt.sorted_token;
  }
};

void BuiltinMoeMLP::backward(const MoeMLP& layer, const Tensor& x, LayerContext& ctx,
                             const Tensor& dy, const Tensor* drouter_logits, const Tensor& dx,
                             Stream stream) const {
  const MoeExperts& ex = *layer.experts;
  const int64_t H = layer.hidden_size(), I = layer.intermediate_size(), E = layer.num_experts(),
                k = layer.top_k();
  const Tensor x2 = rows_of(x, H, stream), dy2 = rows_of(dy, H, stream);
  HK_CHECK(dx.is_contiguous() && dx.numel() == x.numel(),
           "MoeMLP backward: dx " + dx.view().str() + " must be contiguous, x's shape");
  const Tensor dx2 = dx.reshape({x2.size(0), H});
  const DType dt = x2.dtype();
  const Device dev = x2.device();
  const int64_t tokens = x2.size(0);
  const Tensor logits = ctx.saved("router_logits");
  const Routed rt = route_logits(layer, logits, stream);
  const Tensor gate_up = ctx.saved("gate_up");
  const Tensor& sorted_token = rt.sorted_token;
  const int64_t n = gate_up.size(0);

  // Recomputed: act(gate)·up and the (unweighted) expert outputs.
  Tensor act = Tensor::empty({n, I}, dt, dev, stream);
  ex.act_fn->forward_mul(gate_up.slice(1, 0, I), gate_up.slice(1, I, 2 * I), act, stream);
  Tensor dys = Tensor::empty({n, H}, dt, dev, stream);
  ops::embedding(dy2, sorted_token, dys, stream);  // the gradient of each sorted row's token
  std::vector<double> dweight_sorted;
  {
    Tensor out = Tensor::empty({n, H}, dt, dev, stream);
    for_each_expert(rt.routing, [&](int64_t e, int64_t r0, int64_t r1) {
      ops::linear(act.slice(0, r0, r1), ex.down_proj().select(0, e), nullptr, out.slice(0, r0, r1),
                  stream);
    });
    // d(weight of row n) = Σ_h dy[token(n), h] · out[n, h] (one f32-accumulated reduction).
    ops::mul(out, dys, out, stream);
    Tensor ones = Tensor::empty({1, H}, dt, dev, stream);
    ops::fill(ones, 1.0, stream);
    Tensor dw = Tensor::empty({n, 1}, dt, dev, stream);
    ops::linear(out, ones, nullptr, dw, stream);
    dweight_sorted = host_doubles(dw, stream);
  }
  ops::mul(dys, rt.sorted_weights.expand({n, H}), dys, stream);  // d(out)

  ParamGradWriter ddown(ex, "down_proj", {ex.down_proj().dtype()}, /*zero_if_new=*/true, stream);
  ParamGradWriter dgate_up(ex, "gate_up_proj", {ex.gate_up_proj().dtype()}, true, stream);
  Tensor dact = Tensor::empty({n, I}, dt, dev, stream);
  for_each_expert(rt.routing, [&](int64_t e, int64_t r0, int64_t r1) {
    const TensorView dact_e = dact.slice(0, r0, r1);
    const TensorView dw_e = ddown.active() ? ddown.buffer().select(0, e).view() : TensorView();
    ops::linear_backward(dys.slice(0, r0, r1), act.slice(0, r0, r1), ex.down_proj().select(0, e),
                         &dact_e, ddown.active() ? &dw_e : nullptr, nullptr, true, stream);
  });
  ddown.commit();
  // d(gate), d(up) overwrite gate_up (consumed).
  Tensor gate = gate_up.slice(1, 0, I), up = gate_up.slice(1, I, 2 * I);
  ex.act_fn->backward_mul(gate, up, dact, gate, up, stream);
  {
    Tensor xs = Tensor::empty({n, H}, dt, dev, stream);
    ops::embedding(x2, sorted_token, xs, stream);
    Tensor dxs = Tensor::empty({n, H}, dt, dev, stream);
    for_each_expert(rt.routing, [&](int64_t e, int64_t r0, int64_t r1) {
      const TensorView dxs_e = dxs.slice(0, r0, r1);
      const TensorView dw_e =
          dgate_up.active() ? dgate_up.buffer().select(0, e).view() : TensorView();
      ops::linear_backward(gate_up.slice(0, r0, r1), xs.slice(0, r0, r1),
                           ex.gate_up_proj().select(0, e), &dxs_e,
                           dgate_up.active() ? &dw_e : nullptr, nullptr, true, stream);
    });
    dgate_up.commit();
    ops::fill(dx2, 0.0, stream);
    ops::embedding_backward(dxs, sorted_token, dx2, stream);
  }

  // The router: d(weights) → d(logits) on the host, then the router GEMM's backward.
  std::vector<double> dweights(static_cast<size_t>(tokens * k));
  for (size_t a = 0; a < dweights.size(); ++a)
    dweights[a] = dweight_sorted[static_cast<size_t>(rt.routing.position[a])];
  std::vector<double> dlogits = moe::route_backward(rt.routing, dweights, layer.norm_topk_prob());
  if (drouter_logits) {
    const std::vector<double> extra = host_doubles(*drouter_logits, stream);
    HK_CHECK(extra.size() == dlogits.size(),
             "MoeMLP backward: drouter_logits " + drouter_logits->view().str() + " must be [" +
                 std::to_string(tokens) + ", " + std::to_string(E) + "]");
    for (size_t i = 0; i < dlogits.size(); ++i) dlogits[i] += extra[i];
  }
  const Tensor g = device_tensor(dlogits, {tokens, E}, dt, dev, stream);
  const Tensor& wr = layer.gate->weight();
  ops::MatmulOptions mo;
  mo.beta = 1.0f;
  ops::matmul(g, wr, dx2, mo, stream);
  ParamGradWriter dwr(*layer.gate, "weight", {wr.dtype()}, false, stream);
  if (dwr.active()) {
    ops::linear_backward(g, x2, wr, nullptr, dwr.view(), nullptr, dwr.accumulate(), stream);
    dwr.commit();
  }
}

}  // namespace

MoeRouter::MoeRouter(std::string type_name, int64_t num_experts, int64_t hidden_size)
    : Module(std::move(type_name)) {
  register_parameter("weight", {num_experts, hidden_size});
}

MoeExperts::MoeExperts(std::string type_name, const MoeShape& s) : Module(std::move(type_name)) {
  register_parameter("gate_up_proj", {s.num_experts, 2 * s.intermediate_size, s.hidden_size});
  register_parameter("down_proj", {s.num_experts, s.hidden_size, s.intermediate_size});
  act_fn = register_module("act_fn", std::make_shared<Activation>(s.hidden_act));
}

MoeMLP::MoeMLP(const MoeShape& s)
    : LayerModule(s.prefix + "SparseMoeBlock", "MoeMLP", std::make_shared<BuiltinMoeMLP>()),
      shape_(s) {
  HK_CHECK(s.hidden_size > 0 && s.num_experts > 0 && s.intermediate_size > 0,
           "MoeMLP: hidden_size, num_experts and moe_intermediate_size must be positive");
  HK_CHECK(
      s.top_k > 0 && s.top_k <= s.num_experts,
      "MoeMLP: num_experts_per_tok must be in [1, num_experts], got " + std::to_string(s.top_k));
  // Transformers registers experts before gate: the same order here (named_parameters).
  experts = register_module("experts", std::make_shared<MoeExperts>(s.prefix + "Experts", s));
  gate = register_module(
      "gate", std::make_shared<MoeRouter>(s.prefix + "TopKRouter", s.num_experts, s.hidden_size));
}

void MoeMLPImpl::forward_train(const MoeMLP&, const Tensor&, const Tensor&, const Tensor&,
                               LayerContext&, Stream) const {
  throw_no_training(*this, "MoeMLP");
}
void MoeMLPImpl::backward(const MoeMLP&, const Tensor&, LayerContext&, const Tensor&, const Tensor*,
                          const Tensor&, Stream) const {
  throw_no_training(*this, "MoeMLP");
}

}  // namespace hk::nn
