// Kernel adapters for the layer interfaces models register (see adapters.h).
#include "kernelize/adapters.h"

#include "hk/attention_functions.h"
#include "hk/error.h"
#include "hk/layer_interfaces.h"

namespace hk::kernel_binding {
namespace {

// Calls `fn` with a workspace from the caching allocator when the entry asks for one.
template <class Attrs>
void call_forward(const KernelFunction& fn, const std::vector<TensorView>& inputs,
                  const std::vector<TensorView>& outputs, const Attrs& attrs, Stream stream) {
  KernelCallOptions options;
  options.stream = stream;
  Tensor workspace;
  const size_t bytes = fn.workspace_size(false, inputs, outputs, &attrs, sizeof(Attrs));
  if (bytes > 0) {
    workspace =
        Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, outputs.front().device, stream);
    options.workspace = workspace.view().ptr();
    options.workspace_size = bytes;
  }
  fn.forward(inputs, outputs, attrs, options);
}

class Named {
 public:
  explicit Named(std::string name, KernelFunction fn)
      : name_(std::move(name)), fn_(std::move(fn)) {}

 protected:
  std::string name_;
  KernelFunction fn_;
};

class RMSNormAdapter final : public nn::RMSNormImpl, Named {
 public:
  using Named::Named;
  std::string name() const override { return name_; }
  void forward(const nn::RMSNorm& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    RmsNormAttrs attrs;
    attrs.eps = static_cast<float>(layer.eps());
    call_forward(fn_, {x, layer.weight().view()}, {y}, attrs, stream);
  }
};

class RotaryAdapter final : public nn::RotaryApplyImpl, Named {
 public:
  using Named::Named;
  std::string name() const override { return name_; }
  void forward(const nn::RotaryApply&, const TensorView& q, const TensorView& k,
               const TensorView& cos, const TensorView& sin, Stream stream) const override {
    RotaryAttrs attrs;
    call_forward(fn_, {q, k, cos, sin}, {q, k}, attrs, stream);
  }
};

uint32_t activation_code(ops::Activation kind) {
  switch (kind) {
    case ops::Activation::SiLU:
      return kActivationSiLU;
    case ops::Activation::GELU:
      return kActivationGELU;
    case ops::Activation::GELUTanh:
      return kActivationGELUTanh;
  }
  return kActivationSiLU;
}

class MLPAdapter final : public nn::MLPImpl, Named {
 public:
  using Named::Named;
  std::string name() const override { return name_; }
  void forward(const nn::MLP& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    MlpAttrs attrs;
    attrs.activation = activation_code(layer.act_fn->kind());
    call_forward(fn_,
                 {x, layer.gate_proj->weight().view(), layer.up_proj->weight().view(),
                  layer.down_proj->weight().view()},
                 {y}, attrs, stream);
  }
};

class ActivationAdapter final : public nn::ActivationImpl, Named {
 public:
  using Named::Named;
  std::string name() const override { return name_; }
  void forward(const nn::Activation&, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    SiluAttrs attrs;
    call_forward(fn_, {x}, {y}, attrs, stream);
  }
  void forward_mul(const nn::Activation& layer, const TensorView& gate, const TensorView& up,
                   const TensorView& out, Stream stream) const override {
    // silu@1 has no fused form: act into `out`, rounded to the dtype like Transformers, then ·up.
    forward(layer, gate, out, stream);
    ops::mul(out, up, out, stream);
  }
};

class LinearAdapter final : public nn::LinearImpl, Named {
 public:
  using Named::Named;
  std::string name() const override { return name_; }
  void forward(const nn::Linear& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    LinearAttrs attrs;
    std::vector<TensorView> inputs{x, layer.weight().view()};
    if (const Tensor* bias = layer.bias()) inputs.push_back(bias->view());
    call_forward(fn_, inputs, {y}, attrs, stream);
  }
};

class CausalLMLossAdapter final : public nn::CausalLMLossImpl, Named {
 public:
  using Named::Named;
  std::string name() const override { return name_; }
  void forward(const nn::CausalLMLoss&, const TensorView& logits, const TensorView& labels,
               const TensorView& loss, Stream stream) const override {
    CausalLmLossAttrs attrs;
    call_forward(fn_, {logits, labels}, {loss}, attrs, stream);
  }
};

template <class Module>
const Module& as(const nn::Module& module, const std::string& layer) {
  auto* typed = dynamic_cast<const Module*>(&module);
  if (!typed)
    throw InvalidArgument("kernelize: module of class " + module.type_name() +
                          " is registered as layer " + layer + " but is not that layer's class");
  return *typed;
}

}  // namespace

bool has_adapter(const std::string& layer) {
  return layer == "RMSNorm" || layer == "rotary_pos_emb" || layer == "MLP" || layer == "SiLU" ||
         layer == "Linear" || layer == "ForCausalLMLoss";
}

std::shared_ptr<nn::LayerImpl> make_adapter(const nn::Module& module, const std::string& layer,
                                            KernelFunction fn, const std::string& display_name) {
  if (layer == "RMSNorm") {
    as<nn::RMSNorm>(module, layer);
    return std::make_shared<RMSNormAdapter>(display_name, std::move(fn));
  }
  if (layer == "rotary_pos_emb") {
    as<nn::RotaryApply>(module, layer);
    return std::make_shared<RotaryAdapter>(display_name, std::move(fn));
  }
  if (layer == "MLP") {
    as<nn::MLP>(module, layer);
    return std::make_shared<MLPAdapter>(display_name, std::move(fn));
  }
  if (layer == "SiLU") {
    as<nn::Activation>(module, layer);
    return std::make_shared<ActivationAdapter>(display_name, std::move(fn));
  }
  if (layer == "Linear") {
    as<nn::Linear>(module, layer);
    return std::make_shared<LinearAdapter>(display_name, std::move(fn));
  }
  if (layer == "ForCausalLMLoss") {
    as<nn::CausalLMLoss>(module, layer);
    return std::make_shared<CausalLMLossAdapter>(display_name, std::move(fn));
  }
  throw InvalidArgument("kernelize: layer " + layer + " has no kernel adapter in hk");
}

nn::AttentionFunction make_attention_function(KernelFunction fn) {
  return [fn = std::move(fn)](const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const nn::AttentionCall& call, Stream stream) {
    AttentionAttrs attrs;
    attrs.scale = call.scale;
    attrs.causal = call.causal ? 1u : 0u;
    std::vector<TensorView> inputs{q, k, v};
    if (call.key_start) inputs.push_back(*call.key_start);
    call_forward(fn, inputs, {out}, attrs, stream);
  };
}

}  // namespace hk::kernel_binding
