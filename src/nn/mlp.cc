// The gated MLP (SwiGLU for "silu"): down_proj(act_fn(gate_proj(x)) * up_proj(x)). The built-in
// implementation calls its children's implementations, so kernelizing `Linear` or `SiLU` alone
// still takes effect; a fused `MLP` kernel replaces the whole thing.
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
    layer.gate_proj->forward(x, gate, stream);
    layer.up_proj->forward(x, up, stream);
    layer.act_fn->forward_mul(gate, up, gate, stream);  // in place: gate is not needed after
    layer.down_proj->forward(gate, y, stream);
  }

  bool supports_training() const override { return true; }
  void forward_train(const MLP& layer, const Tensor& x, const Tensor& y, LayerContext& ctx,
                     Stream stream) const override {
    Shape inner = x.sizes();
    inner.back() = layer.intermediate_size();
    Tensor gate = Tensor::empty(inner, x.dtype(), x.device(), stream);
    Tensor up = Tensor::empty(inner, x.dtype(), x.device(), stream);
    layer.gate_proj->forward_train(x, gate, ctx.child("gate_proj"), stream);
    layer.up_proj->forward_train(x, up, ctx.child("up_proj"), stream);
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
    layer.gate_proj->backward(x, ctx.child("gate_proj"), gate, &dx, false, stream);
    layer.up_proj->backward(x, ctx.child("up_proj"), up, &dx, true, stream);
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

}  // namespace hk::nn
