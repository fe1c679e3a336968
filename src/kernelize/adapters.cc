// Kernel adapters for the layer interfaces models register (see adapters.h), forward and, for
// training, backward through the entry's `backward` with the tensors layer_interfaces.h fixes.
// Weight gradients go through nn::ParamGradWriter: the kernel writes (or, under
// kAccumulateWeightGrads, adds into) the parameter's gradient directly.
#include "kernelize/adapters.h"

#include <optional>

#include "hk/error.h"
#include "hk/layer_interfaces.h"
#include "kernelize/activation_binding.h"
#include "kernelize/deformable_binding.h"
#include "kernelize/moe_adapter.h"
#include "nn/param_grad.h"

namespace hk::kernel_binding {
namespace {

template <class Attrs>
void call_pass(const KernelFunction& fn, bool backward, const std::vector<TensorView>& inputs,
               const std::vector<TensorView>& outputs, const Attrs& attrs, Stream stream) {
  call_kernel_pass(fn, backward, inputs, outputs, &attrs, sizeof(Attrs), stream);
}
template <class Attrs>
void call_forward(const KernelFunction& fn, const std::vector<TensorView>& inputs,
                  const std::vector<TensorView>& outputs, const Attrs& attrs, Stream stream) {
  call_pass(fn, false, inputs, outputs, attrs, stream);
}
template <class Attrs>
void call_backward(const KernelFunction& fn, const std::vector<TensorView>& inputs,
                   const std::vector<TensorView>& outputs, const Attrs& attrs, Stream stream) {
  call_pass(fn, true, inputs, outputs, attrs, stream);
}

// An absent optional tensor of the call (layer_interfaces.h: a default TensorView).
TensorView absent() {
  return TensorView();
}
TensorView view_or_absent(const nn::ParamGradWriter& w) {
  return w.active() ? w.buffer().view() : absent();
}

// Several weight gradients written by one kernel call share its single accumulate flag: when
// they disagree (one new, one already holding a gradient), the new ones start at zero.
uint32_t shared_accumulate_flag(std::initializer_list<const nn::ParamGradWriter*> writers,
                                Stream stream) {
  bool any_accumulate = false;
  for (const auto* w : writers) any_accumulate = any_accumulate || (w->active() && w->accumulate());
  if (!any_accumulate) return 0;
  for (const auto* w : writers)
    if (w->active() && !w->accumulate()) ops::fill(w->buffer(), 0.0, stream);
  return kAccumulateWeightGrads;
}

// dx written by a kernel; `accumulate_dx` asks for dx += result instead.
template <class Call>
void into_dx(const Tensor& dx, bool accumulate_dx, Stream stream, Call&& call) {
  if (!accumulate_dx) {
    call(dx.view());
    return;
  }
  Tensor tmp = Tensor::empty(dx.sizes(), dx.dtype(), dx.device(), stream);
  call(tmp.view());
  ops::add(dx, tmp, dx, 1.0f, stream);
}

class Named {
 public:
  explicit Named(std::string name, KernelFunction fn)
      : name_(std::move(name)), fn_(std::move(fn)) {}
  virtual ~Named() = default;
  bool declares_capture() const {
    return fn_.valid() && fn_.entry().supports_mode(kKernelModeCapture);
  }

 protected:
  bool has_backward() const { return fn_.valid() && fn_.entry().has_backward; }
  std::string name_;
  KernelFunction fn_;
};

class RMSNormAdapter final : public nn::RMSNormImpl, public Named {
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
  // A layout's parameters are copies made at bind time, so gradients would not reach the
  // module's own parameters: stateful RMSNorm kernels do not train.
  bool supports_training() const override { return has_backward() && layout_params_.empty(); }
  void forward_train(const nn::RMSNorm& layer, const Tensor& x, const Tensor& y,
                     nn::LayerContext& ctx, Stream stream) const override {
    if (!supports_training()) nn::throw_no_training(*this, "RMSNorm");
    RmsNormAttrs attrs;
    attrs.eps = static_cast<float>(layer.eps());
    Tensor rstd = Tensor::empty({x.numel() / layer.dim()}, DType::F32, x.device(), stream);
    call_forward(fn_, {x, layer.weight()}, {y, rstd}, attrs, stream);
    ctx.save("rstd", rstd);
  }
  void backward(const nn::RMSNorm& layer, const Tensor& x, nn::LayerContext& ctx, const Tensor& dy,
                const Tensor& dx, Stream stream) const override {
    const Tensor& w = layer.weight();
    RmsNormAttrs attrs;
    attrs.eps = static_cast<float>(layer.eps());
    nn::ParamGradWriter dw(layer, "weight", {w.dtype(), DType::F32}, false, stream);
    attrs.flags = dw.accumulate() ? kAccumulateWeightGrads : 0;
    call_backward(fn_, {dy, x, w, ctx.saved("rstd")}, {dx, view_or_absent(dw)}, attrs, stream);
    dw.commit();
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

class FusedRMSNormMLP final : public nn::MLPImpl, public Named {
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

class RotaryAdapter final : public nn::RotaryApplyImpl, public Named {
 public:
  using Named::Named;
  std::string name() const override { return name_; }
  void forward(const nn::RotaryApply&, const TensorView& q, const TensorView& k,
               const TensorView& cos, const TensorView& sin, Stream stream) const override {
    RotaryAttrs attrs;
    call_forward(fn_, {q, k, cos, sin}, {q, k}, attrs, stream);
  }
  bool supports_training() const override { return has_backward(); }
  void forward_train(const nn::RotaryApply& layer, const Tensor& q, const Tensor& k,
                     const Tensor& cos, const Tensor& sin, nn::LayerContext&,
                     Stream stream) const override {
    forward(layer, q, k, cos, sin, stream);
  }
  void backward(const nn::RotaryApply&, const Tensor& cos, const Tensor& sin, nn::LayerContext&,
                const Tensor& dq, const Tensor& dk, Stream stream) const override {
    RotaryAttrs attrs;  // in place: the interface allows dq/dk to alias dq_out/dk_out
    call_backward(fn_, {dq, dk, cos, sin}, {dq, dk}, attrs, stream);
  }
};

class MLPAdapter final : public nn::MLPImpl, public Named {
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
  // The training forward keeps the pre-activations gate(x), up(x) (mlp@1's optional outputs), so
  // backward skips recomputing those two GEMMs; backward consumes them (dgate, dup overwrite
  // them). A kernel that predates the optional tensors leaves them unwritten and recomputes.
  bool supports_training() const override { return has_backward(); }
  void forward_train(const nn::MLP& layer, const Tensor& x, const Tensor& y, nn::LayerContext& ctx,
                     Stream stream) const override {
    Shape inner = x.sizes();
    inner.back() = layer.intermediate_size();
    Tensor gate = Tensor::empty(inner, x.dtype(), x.device(), stream);
    Tensor up = Tensor::empty(inner, x.dtype(), x.device(), stream);
    MlpAttrs attrs;
    attrs.activation = activation_code(layer.act_fn->kind());
    call_forward(fn_,
                 {x, layer.gate_proj->weight().view(), layer.up_proj->weight().view(),
                  layer.down_proj->weight().view()},
                 {y, gate, up}, attrs, stream);
    ctx.save("gate", gate);
    ctx.save("up", up);
  }
  void backward(const nn::MLP& layer, const Tensor& x, nn::LayerContext& ctx, const Tensor& dy,
                const Tensor& dx, Stream stream) const override {
    const Tensor &gw = layer.gate_proj->weight(), &uw = layer.up_proj->weight(),
                 &dw = layer.down_proj->weight();
    nn::ParamGradWriter dgate(*layer.gate_proj, "weight", {gw.dtype()}, false, stream);
    nn::ParamGradWriter dup(*layer.up_proj, "weight", {uw.dtype()}, false, stream);
    nn::ParamGradWriter ddown(*layer.down_proj, "weight", {dw.dtype()}, false, stream);
    MlpAttrs attrs;
    attrs.activation = activation_code(layer.act_fn->kind());
    attrs.flags = shared_accumulate_flag({&dgate, &dup, &ddown}, stream);
    std::vector<TensorView> inputs{dy, x, gw, uw, dw};
    if (ctx.has("gate")) {
      inputs.push_back(ctx.saved("gate"));
      inputs.push_back(ctx.saved("up"));
    }
    call_backward(fn_, inputs,
                  {dx, view_or_absent(dgate), view_or_absent(dup), view_or_absent(ddown)}, attrs,
                  stream);
    dgate.commit();
    dup.commit();
    ddown.commit();
  }
};

class LinearAdapter final : public nn::LinearImpl, public Named {
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
  bool supports_training() const override { return has_backward(); }
  void forward_train(const nn::Linear& layer, const Tensor& x, const Tensor& y, nn::LayerContext&,
                     Stream stream) const override {
    forward(layer, x, y, stream);
  }
  void backward(const nn::Linear& layer, const Tensor& x, nn::LayerContext&, const Tensor& dy,
                const Tensor* dx, bool accumulate_dx, Stream stream) const override {
    const Tensor& w = layer.weight();
    nn::ParamGradWriter dw(layer, "weight", {w.dtype()}, false, stream);
    std::optional<nn::ParamGradWriter> db;
    if (layer.has_bias())
      db.emplace(layer, "bias", std::initializer_list<DType>{w.dtype()}, false, stream);
    LinearAttrs attrs;
    attrs.flags =
        db ? shared_accumulate_flag({&dw, &*db}, stream) : shared_accumulate_flag({&dw}, stream);
    auto run = [&](const TensorView& dx_out) {
      call_backward(fn_, {dy, x, w},
                    {dx_out, view_or_absent(dw), db ? view_or_absent(*db) : absent()}, attrs,
                    stream);
    };
    if (dx)
      into_dx(*dx, accumulate_dx, stream, run);
    else
      run(absent());
    dw.commit();
    if (db) db->commit();
  }
};

class CausalLMLossAdapter final : public nn::CausalLMLossImpl, public Named {
 public:
  using Named::Named;
  std::string name() const override { return name_; }
  void forward(const nn::CausalLMLoss&, const TensorView& logits, const TensorView& labels,
               const TensorView& loss, const nn::CausalLMLossOptions& options,
               Stream stream) const override {
    CausalLmLossAttrs attrs;
    attrs.num_items_in_batch = options.num_items_in_batch;
    call_forward(fn_, {logits, labels}, {loss}, attrs, stream);
  }
  bool supports_training() const override { return has_backward(); }
  void forward_train(const nn::CausalLMLoss& layer, const Tensor& logits, const Tensor& labels,
                     const Tensor& loss, const nn::CausalLMLossOptions& options, nn::LayerContext&,
                     Stream stream) const override {
    forward(layer, logits, labels, loss, options, stream);
  }
  void backward(const nn::CausalLMLoss&, const Tensor& logits, const Tensor& labels,
                const nn::CausalLMLossOptions& options, nn::LayerContext&, float dloss,
                const Tensor& dlogits, Stream stream) const override {
    CausalLmLossAttrs attrs;
    attrs.num_items_in_batch = options.num_items_in_batch;
    Tensor upstream = Tensor::empty({1}, DType::F32, logits.device(), stream);
    ops::fill(upstream, dloss, stream);  // on the device: no host-device copy
    call_backward(fn_, {upstream, logits, labels}, {dlogits}, attrs, stream);
  }
};

// ForCausalLMLoss bound to a fused_linear_cross_entropy@1 entry (Liger's FLCE): the training
// forward takes the final normed hidden states and lm_head.weight, the kernel returns the loss and
// the gradients for dloss = 1 in the same pass (so the [tokens, vocab] logits never exist), and
// backward only scales them by dloss (and 1/num_items_in_batch, computed as a sum). A forward that
// has logits anyway (eval with labels) computes the built-in loss from them.
class FusedLinearCrossEntropyAdapter final : public nn::CausalLMLossImpl, public Named {
 public:
  using Named::Named;
  std::string name() const override { return name_; }
  void forward(const nn::CausalLMLoss&, const TensorView& logits, const TensorView& labels,
               const TensorView& loss, const nn::CausalLMLossOptions& options,
               Stream stream) const override {
    nn::causal_lm_loss(logits, labels, loss, options, stream);
  }
  bool supports_training() const override { return has_backward(); }
  bool fuses_lm_head() const override { return true; }
  void forward_train_fused(const nn::CausalLMLoss&, const nn::Linear& lm_head, const Tensor& hidden,
                           const Tensor& labels, const Tensor& loss,
                           const nn::CausalLMLossOptions& options, nn::LayerContext& ctx,
                           Stream stream) const override {
    const Tensor& w = lm_head.weight();
    const int64_t n = hidden.numel() / w.size(1);
    const Tensor x = hidden.is_contiguous() ? hidden : hidden.contiguous(stream);
    const Tensor shifted = nn::shift_labels(labels, stream);
    FusedLinearCrossEntropyAttrs attrs;
    attrs.ce.reduction = options.num_items_in_batch > 0 ? kReductionSum : kReductionMean;
    Tensor dx = Tensor::empty({n, w.size(1)}, x.dtype(), x.device(), stream);
    Tensor dw;
    if (lm_head.requires_grad("weight"))
      dw = Tensor::empty(w.sizes(), w.dtype(), w.device(), stream);
    call_forward(fn_, {x.reshape({n, w.size(1)}), w, shifted.reshape({n})},
                 {loss, dx, dw.defined() ? dw.view() : absent()}, attrs, stream);
    if (options.num_items_in_batch > 0)
      ops::scale(loss, 1.0f / static_cast<float>(options.num_items_in_batch), loss, stream);
    ctx.save("dx", dx);
    if (dw.defined()) ctx.save("dweight", dw);
  }
  void backward_fused(const nn::CausalLMLoss&, const nn::Linear& lm_head, const Tensor&,
                      const Tensor&, const nn::CausalLMLossOptions& options, nn::LayerContext& ctx,
                      float dloss, const Tensor& dhidden, Stream stream) const override {
    const float factor =
        options.num_items_in_batch > 0
            ? static_cast<float>(dloss / static_cast<double>(options.num_items_in_batch))
            : dloss;
    const Tensor& dx = ctx.saved("dx");
    const Tensor dh = dhidden.reshape(dx.sizes());
    if (factor == 1.0f)
      copy_view(dh, dx, stream);
    else
      ops::scale(dx, factor, dh, stream);
    if (ctx.has("dweight")) {
      const Tensor dw = ctx.saved("dweight");
      // Ties: into the embedding's gradient. When that is handed out for writing (the first
      // backward after zero_grad_lazily, or none yet), the scaled copy goes straight there: one
      // pass over the [vocab, hidden] table instead of scale + copy (or add).
      const nn::Module::GradTarget t = lm_head.grad_target("weight", false, stream);
      if (t.grad.defined() && !t.accumulate && t.grad.dtype() == dw.dtype()) {
        if (factor == 1.0f)
          copy_view(t.grad, dw, stream);
        else
          ops::scale(dw, factor, t.grad, stream);
      } else if (t.grad.defined()) {
        if (factor != 1.0f) ops::scale(dw, factor, dw, stream);
        if (t.accumulate) {
          Tensor addend = dw;
          if (dw.dtype() != t.grad.dtype()) {  // e.g. into f32 master gradients
            addend = Tensor::empty(dw.sizes(), t.grad.dtype(), dw.device(), stream);
            ops::cast(dw, addend, stream);
          }
          ops::add(t.grad, addend, t.grad, 1.0f, stream);
        } else {
          ops::cast(dw, t.grad, stream);
        }
      }
    }
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

void call_kernel_pass(const KernelFunction& fn, bool backward,
                      const std::vector<TensorView>& inputs, const std::vector<TensorView>& outputs,
                      const void* attrs, size_t attrs_size, Stream stream) {
  KernelCallOptions options;
  options.stream = stream;
  Tensor workspace;
  const size_t bytes = fn.workspace_size(backward, inputs, outputs, attrs, attrs_size);
  if (bytes > 0) {
    workspace =
        Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, outputs.front().device, stream);
    options.workspace = workspace.view().ptr();
    options.workspace_size = bytes;
  }
  if (backward)
    fn.backward(inputs, outputs, attrs, attrs_size, options);
  else
    fn.forward(inputs, outputs, attrs, attrs_size, options);
}

bool entry_serves(const KernelEntryInfo& entry, const std::string& layer) {
  const InterfaceInfo* info = find_interface(entry.interface, entry.interface_version);
  if (info && layer == info->layer) return true;
  if (entry.interface == "activation" && entry.interface_version == 1)
    return is_activation_layer(layer);
  return layer == "ForCausalLMLoss" && entry.interface == "fused_linear_cross_entropy" &&
         entry.interface_version == 1;
}

std::string adapter_refusal(const nn::Module& module, const std::string& layer,
                            const KernelEntryInfo& entry, Mode mode) {
  if (entry.interface == "fused_linear_cross_entropy" && !has(mode, Mode::Training))
    return "entry " + entry.name +
           " fuses lm_head and the loss for training; outside training mode the forward makes "
           "logits anyway";
  if (layer == "MLP") {
    if (const auto* mlp = dynamic_cast<const nn::MLP*>(&module); mlp && mlp->gate_proj->has_bias())
      return "entry " + entry.name + " (" + entry.interface_id() +
             ") has no biases, and this MLP has them (mlp_bias)";
  }
  if (layer == "RMSNorm" && entry.has_layout && has(mode, Mode::Training))
    return "entry " + entry.name +
           " keeps its own copy of the weight (a layout), so its gradient would not reach the "
           "model's parameter; hk trains stateful RMSNorm kernels only after that is solved";
  return "";
}

bool declares_capture(const nn::LayerImpl& impl) {
  if (dynamic_cast<const IdentityRMSNorm*>(&impl)) return true;  // a copy, no kernel call
  if (const auto* other = dynamic_cast<const CaptureDeclaring*>(&impl))
    return other->declares_capture();  // adapters of activation_binding / deformable_binding
  const auto* named = dynamic_cast<const Named*>(&impl);
  return named && named->declares_capture();
}

bool has_adapter(const std::string& layer) {
  return layer == "RMSNorm" || layer == "rotary_pos_emb" || layer == "MLP" ||
         is_activation_layer(layer) || layer == "Linear" || layer == "ForCausalLMLoss" ||
         layer == "MultiScaleDeformableAttention" || layer == "MoeMLP";
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
  if (is_activation_layer(layer))
    return make_activation_adapter(as<nn::Activation>(module, layer), std::move(fn), display_name);
  if (layer == "MultiScaleDeformableAttention")
    return make_deformable_attention_adapter(as<nn::MultiScaleDeformableAttention>(module, layer),
                                             std::move(fn), display_name);
  if (layer == "Linear") {
    as<nn::Linear>(module, layer);
    return std::make_shared<LinearAdapter>(display_name, std::move(fn));
  }
  if (layer == "MoeMLP") {
    as<nn::MoeMLP>(module, layer);
    return make_moe_mlp_adapter(std::move(fn), display_name);
  }
  if (layer == "ForCausalLMLoss") {
    as<nn::CausalLMLoss>(module, layer);
    if (fn.entry().interface == "fused_linear_cross_entropy")
      return std::make_shared<FusedLinearCrossEntropyAdapter>(display_name, std::move(fn));
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
