// The MLP activation (`act_fn`, interface `SiLU` for "silu") and its built-in implementation.
#include "hk/error.h"
#include "hk/layers.h"

namespace hk::nn {
namespace {

class BuiltinActivation final : public ActivationImpl {
 public:
  std::string name() const override { return "builtin"; }
  void forward(const Activation& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    ops::activation(layer.kind(), x, y, stream);
  }
  void forward_mul(const Activation& layer, const TensorView& gate, const TensorView& up,
                   const TensorView& out, Stream stream) const override {
    ops::act_mul(layer.kind(), gate, up, out, stream);
  }
  bool supports_training() const override { return true; }
  void backward(const Activation& layer, const Tensor& x, const Tensor& dy, const Tensor& dx,
                Stream stream) const override {
    ops::activation_backward(layer.kind(), dy, x, dx, stream);
  }
  void backward_mul(const Activation& layer, const Tensor& gate, const Tensor& up,
                    const Tensor& dout, const Tensor& dgate, const Tensor& dup,
                    Stream stream) const override {
    ops::act_mul_backward(layer.kind(), dout, gate, up, dgate, dup, stream);
  }
};

ops::Activation parse_act(const std::string& name) {
  if (name == "silu" || name == "swish") return ops::Activation::SiLU;
  if (name == "gelu") return ops::Activation::GELU;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new") return ops::Activation::GELUTanh;
  throw InvalidArgument("hidden_act '" + name +
                        "' is not supported; supported: silu, gelu, gelu_pytorch_tanh");
}

const char* interface_for(ops::Activation act) {
  switch (act) {
    case ops::Activation::SiLU:
      return "SiLU";
    case ops::Activation::GELU:
      return "GELU";
    case ops::Activation::GELUTanh:
      return "GELUTanh";
  }
  return "SiLU";
}

}  // namespace

Activation::Activation(const std::string& hidden_act)
    : LayerModule(std::string(interface_for(parse_act(hidden_act))) + "Activation",
                  interface_for(parse_act(hidden_act)), std::make_shared<BuiltinActivation>()),
      kind_(parse_act(hidden_act)) {}

}  // namespace hk::nn
