// The Linear layer and its built-in implementation (hk::ops::linear, f32 accumulation) with its
// backward: dx = dy·W by one GEMM (beta 1 when the caller sums several projections' dx into one
// buffer), dW += dyᵀ·x and db += Σ dy into the parameters' gradients (ops::linear_backward).
#include "hk/error.h"
#include "hk/layers.h"
#include "nn/param_grad.h"

namespace hk::nn {
namespace {

class BuiltinLinear final : public LinearImpl {
 public:
  std::string name() const override { return "builtin"; }
  void forward(const Linear& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    const Tensor* bias = layer.bias();
    ops::linear(x, layer.weight(), bias ? &bias->view() : nullptr, y, stream);
  }
  bool supports_training() const override { return true; }
  void forward_train(const Linear& layer, const Tensor& x, const Tensor& y, LayerContext&,
                     Stream stream) const override {
    forward(layer, x, y, stream);
  }
  void backward(const Linear& layer, const Tensor& x, LayerContext&, const Tensor& dy,
                const Tensor* dx, bool accumulate_dx, Stream stream) const override {
    const Tensor& w = layer.weight();
    const int64_t n = layer.out_features(), k = layer.in_features();
    const Tensor g = dy.is_contiguous() ? dy : dy.contiguous(stream);
    if (dx) {
      HK_CHECK(dx->is_contiguous() && dx->numel() == x.numel(),
               "Linear backward: dx " + dx->view().str() + " must be contiguous, x's shape");
      ops::MatmulOptions mo;
      mo.beta = accumulate_dx ? 1.0f : 0.0f;
      ops::matmul(g.reshape({g.numel() / n, n}), w, dx->reshape({dx->numel() / k, k}), mo, stream);
    }
    ParamGradWriter dw(layer, "weight", {w.dtype()}, false, stream);
    if (dw.active()) {
      ops::linear_backward(g, x, w, nullptr, dw.view(), nullptr, dw.accumulate(), stream);
      dw.commit();
    }
    if (layer.has_bias()) {
      ParamGradWriter db(layer, "bias", {w.dtype()}, false, stream);
      if (db.active()) {
        ops::linear_backward(g, x, w, nullptr, nullptr, db.view(), db.accumulate(), stream);
        db.commit();
      }
    }
  }
};

}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : LayerModule("Linear", "Linear", std::make_shared<BuiltinLinear>()),
      in_(in_features),
      out_(out_features),
      bias_(bias) {
  HK_CHECK(in_features > 0 && out_features > 0,
           "Linear: features must be positive, got in=" + std::to_string(in_features) +
               " out=" + std::to_string(out_features));
  register_parameter("weight", {out_features, in_features});
  if (bias) register_parameter("bias", {out_features});
}

const Tensor* Linear::bias() const {
  return bias_ ? &param("bias") : nullptr;
}

// ---- sibling Linears (q/k/v, gate/up): one call for a fused group, else one per Linear
// -----------

void LinearGroupImpl::forward_train(const Tensor&, const std::vector<Tensor>&, LayerContext&,
                                    Stream) const {
  throw Unsupported(
      "this fused Linear group has no training forward/backward (its kernel has no backward); "
      "kernelize with Mode::Training, which binds only kernels with a backward");
}
void LinearGroupImpl::backward(const Tensor& x, LayerContext& ctx, const std::vector<Tensor>&,
                               const Tensor*, bool, Stream stream) const {
  forward_train(x, {}, ctx, stream);  // the same refusal
}

namespace {

// The group that calls[i..] start, when all its members follow in order; else null.
std::shared_ptr<const LinearGroupImpl> group_at(const std::vector<LinearCall>& calls, size_t i) {
  auto group = calls[i].layer->typed_impl().group();
  if (!group) return nullptr;
  const auto& members = group->members();
  if (i + members.size() > calls.size()) return nullptr;
  for (size_t m = 0; m < members.size(); ++m)
    if (calls[i + m].layer != members[m]) return nullptr;
  return group;
}

}  // namespace

void forward_linears(const TensorView& x, const std::vector<LinearCall>& calls, Stream stream) {
  for (size_t i = 0; i < calls.size();) {
    if (auto group = group_at(calls, i)) {
      std::vector<TensorView> ys;
      for (size_t m = 0; m < group->members().size(); ++m) ys.push_back(calls[i + m].y.view());
      group->forward(x, ys, stream);
      i += ys.size();
    } else {
      calls[i].layer->forward(x, calls[i].y, stream);
      ++i;
    }
  }
}

void forward_train_linears(const Tensor& x, const std::vector<LinearCall>& calls, LayerContext& ctx,
                           Stream stream) {
  for (size_t i = 0; i < calls.size();) {
    if (auto group = group_at(calls, i)) {
      std::vector<Tensor> ys;
      for (size_t m = 0; m < group->members().size(); ++m) ys.push_back(calls[i + m].y);
      group->forward_train(x, ys, ctx.child(calls[i].name), stream);
      i += ys.size();
    } else {
      calls[i].layer->forward_train(x, calls[i].y, ctx.child(calls[i].name), stream);
      ++i;
    }
  }
}

void backward_linears(const Tensor& x, LayerContext& ctx, const std::vector<LinearCall>& calls,
                      const Tensor& dx, Stream stream) {
  for (size_t i = 0; i < calls.size();) {
    const bool accumulate = i > 0;
    if (auto group = group_at(calls, i)) {
      std::vector<Tensor> dys;
      for (size_t m = 0; m < group->members().size(); ++m) dys.push_back(calls[i + m].y);
      group->backward(x, ctx.child(calls[i].name), dys, &dx, accumulate, stream);
      i += dys.size();
    } else {
      calls[i].layer->backward(x, ctx.child(calls[i].name), calls[i].y, &dx, accumulate, stream);
      ++i;
    }
  }
}

}  // namespace hk::nn
