// The gated MLP (SwiGLU for "silu"): down_proj(act_fn(gate_proj(x)) * up_proj(x)). The built-in
// implementation calls its children's implementations, so kernelizing `Linear` or `SiLU` alone
// still takes effect; a fused `MLP` kernel replaces the whole thing. gate_proj and up_proj run
// through forward_linears, so a parallel fusion of the two runs as one kernel.
//
// Training keeps gate(x) and up(x) only; act(gate)·up (down_proj's input) is one elementwise pass,
// so backward recomputes it instead of holding a third [tokens, intermediate] tensor. Backward
// consumes the saved tensors: d(gate), d(up) overwrite gate, up in place.
#include "hk/error.h"
#include "hk/layers.h"

namespace hk::nn {
namespace {

class BuiltinMLP final : public MLPImpl {
 public:
  std::string name() const override { return "builtin"; }
  void forward(const MLP& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    Shape inner = x.sizes();
    inner.back() = layer.intermediate_size();
    Tensor gate = Tensor::empty(inner, x.dtype, x.device, stream);
    Tensor up = Tensor::empty(inner, x.dtype, x.device, stream);
    layer.builtin_forward(x, gate, up, gate, y, stream);  // in place: gate is not needed after
  }

  bool supports_training() const override { return true; }
  void forward_train(const MLP& layer, const Tensor& x, const Tensor& y, LayerContext& ctx,
                     Stream stream) const override {
    Shape inner = x.sizes();
    inner.back() = layer.intermediate_size();
    Tensor gate = Tensor::empty(inner, x.dtype(), x.device(), stream);
    Tensor up = Tensor::empty(inner, x.dtype(), x.device(), stream);
    forward_train_linears(
        x, {{layer.gate_proj.get(), gate, "gate_proj"}, {layer.up_proj.get(), up, "up_proj"}}, ctx,
        stream);
    Tensor hidden = Tensor::empty(inner, x.dtype(), x.device(), stream);
    layer.act_fn->forward_mul(gate, up, hidden, stream);
    layer.down_proj->forward_train(hidden, y, ctx.child("down_proj"), stream);
    ctx.save("gate", gate);
    ctx.save("up", up);
  }

  void backward(const MLP& layer, const Tensor& x, LayerContext& ctx, const Tensor& dy,
                const Tensor& dx, Stream stream) const override {
    const Tensor gate = ctx.saved("gate"), up = ctx.saved("up");
    Tensor dhidden = Tensor::empty(gate.sizes(), gate.dtype(), gate.device(), stream);
    {
      Tensor hidden = Tensor::empty(gate.sizes(), gate.dtype(), gate.device(), stream);
      layer.act_fn->forward_mul(gate, up, hidden, stream);
      layer.down_proj->backward(hidden, ctx.child("down_proj"), dy, &dhidden, false, stream);
    }
    layer.act_fn->backward_mul(gate, up, dhidden, gate, up, stream);  // gate, up := their grads
    backward_linears(
        x, ctx, {{layer.gate_proj.get(), gate, "gate_proj"}, {layer.up_proj.get(), up, "up_proj"}},
        dx, stream);
  }
};

}  // namespace

MLP::MLP(std::string type_name, int64_t hidden_size, int64_t intermediate_size, bool bias,
         const std::string& hidden_act)
    : LayerModule(std::move(type_name), "MLP", std::make_shared<BuiltinMLP>()),
      hidden_(hidden_size),
      intermediate_(intermediate_size) {
  gate_proj =
      register_module("gate_proj", std::make_shared<Linear>(hidden_size, intermediate_size, bias));
  up_proj =
      register_module("up_proj", std::make_shared<Linear>(hidden_size, intermediate_size, bias));
  down_proj =
      register_module("down_proj", std::make_shared<Linear>(intermediate_size, hidden_size, bias));
  act_fn = register_module("act_fn", std::make_shared<Activation>(hidden_act));
}

void MLP::builtin_forward(const TensorView& x, const Tensor& gate, const Tensor& up,
                          const TensorView& hidden, const TensorView& y, Stream stream) const {
  forward_linears(x, {{gate_proj.get(), gate, "gate_proj"}, {up_proj.get(), up, "up_proj"}},
                  stream);
  act_fn->forward_mul(gate, up, hidden, stream);
  down_proj->forward(hidden, y, stream);
}

std::vector<Module::ChildFlow> MLP::child_flows() const {
  return {{ChildFlow::Kind::SharedInput, {"gate_proj", "up_proj"}}};
}

}  // namespace hk::nn
