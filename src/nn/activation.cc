// The MLP activation (`act_fn`) and its built-in implementation. The layer name is the one
// Transformers registers for the config's hidden_act (SiLU, GeLU, GeluTanh, NewGELU, FastGELU,
// QuickGELU), so KernelConfig keys and the default table read as in Transformers.
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

// hidden_act (config.json) → the function, the layer name Transformers registers it under
// (integrations/hub_kernels.py keys: use_kernel_forward_from_hub on transformers/activations.py)
// and Transformers' class name. gelu_new and gelu_fast are the tanh approximation like
// gelu_pytorch_tanh (hk computes all three in f32 with one rounding). "swish" is nn.SiLU in
// Transformers, which is not kernelized there; hk registers it as SiLU (the same function).
struct ActSpec {
  const char* hidden_act;
  ops::Activation kind;
  const char* layer;
  const char* type_name;
};
constexpr ActSpec kActs[] = {
    {"silu", ops::Activation::SiLU, "SiLU", "SiLUActivation"},
    {"swish", ops::Activation::SiLU, "SiLU", "SiLU"},
    {"gelu", ops::Activation::GELU, "GeLU", "GELUActivation"},
    {"gelu_pytorch_tanh", ops::Activation::GELUTanh, "GeluTanh", "GELUTanh"},
    {"gelu_new", ops::Activation::GELUTanh, "NewGELU", "NewGELUActivation"},
    {"gelu_fast", ops::Activation::GELUTanh, "FastGELU", "FastGELUActivation"},
    {"quick_gelu", ops::Activation::QuickGELU, "QuickGELU", "QuickGELUActivation"},
};

const ActSpec& spec_of(const std::string& name) {
  for (const ActSpec& a : kActs)
    if (name == a.hidden_act) return a;
  std::string supported;
  for (const ActSpec& a : kActs)
    supported += std::string(supported.empty() ? "" : ", ") + a.hidden_act;
  throw InvalidArgument("hidden_act '" + name + "' is not supported; supported: " + supported);
}

}  // namespace

Activation::Activation(const std::string& hidden_act)
    : LayerModule(spec_of(hidden_act).type_name, spec_of(hidden_act).layer,
                  std::make_shared<BuiltinActivation>()),
      kind_(spec_of(hidden_act).kind) {}

}  // namespace hk::nn
