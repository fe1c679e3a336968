// The Linear layer and its built-in implementation (hk::ops::linear, f32 accumulation).
#include "hk/error.h"
#include "hk/layers.h"

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
