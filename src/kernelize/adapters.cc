// Kernel adapters for the layer interfaces models register (see adapters.h).
#include "kernelize/adapters.h"

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
  RMSNormAdapter(std::string name, KernelFunction fn, std::vector<Tensor> layout_params)
      : Named(std::move(name), std::move(fn)), layout_params_(std::move(layout_params)) {}
  std::string name() const override { return name_; }
  void forward(const nn::RMSNorm& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    RmsNormAttrs attrs;
    attrs.eps = static_cast<float>(layer.eps());
    std::vector<TensorView> inputs{x};
    if (layout_params_.empty()) inputs.push_back(layer.weight().view());
    for (const Tensor& p : layout_params_) inputs.push_back(p.view());
    call_forward(fn_, inputs, {y}, attrs, stream);
  }

 private:
  std::vector<Tensor> layout_params_;  // the kernel layout's own parameters (stateful kernels)
};

// The first module of an RMSNorm → MLP fusion: passes its input through; the MLP normalises.
class IdentityRMSNorm final : public nn::RMSNormImpl {
 public:
  explicit IdentityRMSNorm(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  void forward(const nn::RMSNorm&, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    if (x.ptr() != y.ptr()) copy_view(y, x, stream);
  }

 private:
  std::string name_;
};

class FusedRMSNormMLP final : public nn::MLPImpl, Named {
 public:
  FusedRMSNormMLP(std::string name, KernelFunction fn, float eps, std::vector<Tensor> params)
      : Named(std::move(name), std::move(fn)), eps_(eps), params_(std::move(params)) {}
  std::string name() const override { return name_; }
  void forward(const nn::MLP& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override;

 private:
  float eps_;
  std::vector<Tensor> params_;
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

void FusedRMSNormMLP::forward(const nn::MLP& layer, const TensorView& x, const TensorView& y,
                              Stream stream) const {
  RmsNormMlpAttrs attrs;
  attrs.eps = eps_;
  attrs.activation = activation_code(layer.act_fn->kind());
  std::vector<TensorView> inputs{x};
  for (const Tensor& p : params_) inputs.push_back(p.view());
  call_forward(fn_, inputs, {y}, attrs, stream);
}

Tensor layout_source(nn::Module& scope, const std::string& name, const hk_layout& layout) {
  const auto dot = name.rfind('.');
  nn::Module* owner = dot == std::string::npos ? &scope : scope.find_module(name.substr(0, dot));
  const std::string param = dot == std::string::npos ? name : name.substr(dot + 1);
  if (!owner || !owner->has_parameter(param))
    throw InvalidArgument(std::string("kernel layout ") + layout.name + " needs the parameter '" +
                          name + "', which the replaced module(s) do not have");
  return owner->param(param);
}

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
                                            KernelFunction fn, const std::string& display_name,
                                            std::vector<Tensor> layout_params) {
  if (layer == "RMSNorm") {
    as<nn::RMSNorm>(module, layer);
    return std::make_shared<RMSNormAdapter>(display_name, std::move(fn), std::move(layout_params));
  }
  if (!layout_params.empty())
    throw InvalidArgument(
        "kernelize: hk binds stateful (layout) kernels for RMSNorm and the "
        "RMSNorm → MLP fusion only, not for layer " +
        layer);
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

std::vector<Tensor> materialize_layout(const hk_layout& layout, nn::Module& scope) {
  std::vector<Tensor> out;
  for (uint32_t i = 0; i < layout.num_parameters; ++i) {
    const std::string target = layout.parameters[i];
    const hk_conversion* conversion = nullptr;
    for (uint32_t c = 0; c < layout.num_conversions; ++c)
      if (target == layout.conversions[c].target) conversion = &layout.conversions[c];
    if (!conversion) {
      out.push_back(layout_source(scope, target, layout));
      continue;
    }
    std::vector<Tensor> sources;
    for (uint32_t s = 0; s < conversion->num_sources; ++s)
      sources.push_back(layout_source(scope, conversion->sources[s], layout));
    if (sources.empty())
      throw InvalidArgument(std::string("kernel layout ") + layout.name + ": conversion of " +
                            target + " has no source");
    switch (conversion->op) {
      case HK_CONVERT_RENAME:
        out.push_back(sources[0]);
        break;
      case HK_CONVERT_TRANSPOSE:
        out.push_back(sources[0].transpose(0, 1).contiguous());
        break;
      case HK_CONVERT_CONCAT: {
        const int dim = conversion->dim;
        Shape shape = sources[0].sizes();
        if (dim < 0 || dim >= static_cast<int>(shape.size()))
          throw InvalidArgument(std::string("kernel layout ") + layout.name + ": bad concat dim");
        shape[dim] = 0;
        for (const Tensor& t : sources) shape[dim] += t.size(dim);
        Tensor joined = Tensor::empty(shape, sources[0].dtype(), sources[0].device());
        int64_t offset = 0;
        for (const Tensor& t : sources) {
          joined.slice(dim, offset, offset + t.size(dim)).copy_from(t.view());
          offset += t.size(dim);
        }
        out.push_back(joined);
        break;
      }
      default:
        throw InvalidArgument(std::string("kernel layout ") + layout.name +
                              ": unknown conversion op " + std::to_string(conversion->op));
    }
  }
  return out;
}

FusedPair make_rmsnorm_mlp_fusion(const nn::RMSNorm& norm, const nn::MLP& mlp, KernelFunction fn,
                                  const std::string& display_name, std::vector<Tensor> params) {
  (void)mlp;
  return {std::make_shared<IdentityRMSNorm>(display_name + " (fused into the MLP)"),
          std::make_shared<FusedRMSNormMLP>(display_name, std::move(fn),
                                            static_cast<float>(norm.eps()), std::move(params))};
}

}  // namespace hk::kernel_binding
