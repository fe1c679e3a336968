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

}  // namespace hk::nn
