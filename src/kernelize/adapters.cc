// Kernel adapters for the layer interfaces models register (see adapters.h), forward and, for
// training, backward through the entry's `backward` with the tensors layer_interfaces.h fixes.
// Weight gradients go through nn::ParamGradWriter: the kernel writes (or, under
// kAccumulateWeightGrads, adds into) the parameter's gradient directly.
#include "kernelize/adapters.h"

#include <memory>
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

// The tensors of `params`, appended as call inputs.
void push_params(std::vector<TensorView>& inputs, const ParamRefs& params) {
  for (const ParamRef& p : params) inputs.push_back(p.value().view());
}

// One gradient buffer per parameter of a kernel call (absent for frozen ones); `with_f32`: the
// kernel may write an f32 gradient too (a norm's weight). commit() after the call.
class GradWriters {
 public:
  GradWriters(const ParamRefs& params, bool with_f32, Stream stream) {
    for (const ParamRef& p : params) {
      const DType d = p.value().dtype();
      writers_.push_back(
          with_f32
              ? std::make_unique<nn::ParamGradWriter>(
                    *p.owner, p.name, std::initializer_list<DType>{d, DType::F32}, false, stream)
              : std::make_unique<nn::ParamGradWriter>(
                    *p.owner, p.name, std::initializer_list<DType>{d}, false, stream));
    }
    // One accumulate flag for the whole call: when they disagree the new buffers start at zero.
    bool any = false;
    for (const auto& w : writers_) any = any || (w->active() && w->accumulate());
    if (any) {
      for (const auto& w : writers_)
        if (w->active() && !w->accumulate()) ops::fill(w->buffer(), 0.0, stream);
      flags_ = kAccumulateWeightGrads;
    }
  }
  uint32_t flags() const { return flags_; }
  void push_outputs(std::vector<TensorView>& outputs) const {
    for (const auto& w : writers_) outputs.push_back(view_or_absent(*w));
  }
  void commit() {
    for (const auto& w : writers_) w->commit();
  }

 private:
  std::vector<std::unique_ptr<nn::ParamGradWriter>> writers_;
  uint32_t flags_ = 0;
};

// A backward whose outputs are dx (optional: absent when `dx` is null, added to when
// `accumulate_dx`) followed by one gradient per parameter of `grads`, committed after the call.
template <class Attrs>
void backward_dx_and_grads(const KernelFunction& fn, const std::vector<TensorView>& inputs,
                           GradWriters& grads, const Attrs& attrs, const Tensor* dx,
                           bool accumulate_dx, Stream stream) {
  auto run = [&](const TensorView& dx_out) {
    std::vector<TensorView> outputs{dx_out};
    grads.push_outputs(outputs);
    call_backward(fn, inputs, outputs, attrs, stream);
  };
  if (dx)
    into_dx(*dx, accumulate_dx, stream, run);
  else
    run(absent());
  grads.commit();
}

class RMSNormAdapter final : public nn::RMSNormImpl, public Named {
 public:
  RMSNormAdapter(std::string name, KernelFunction fn, std::optional<ParamRefs> layout)
      : Named(std::move(name), std::move(fn)), layout_(std::move(layout)) {}
  std::string name() const override { return name_; }
  void forward(const nn::RMSNorm& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    std::vector<TensorView> inputs{x};
    push_params(inputs, params(layer));
    call_forward(fn_, inputs, {y}, attrs(layer), stream);
  }
  // With a layout, the gradients go to the layout's parameters: they are the module's
  // parameters now (layouts.h), so an optimizer steps them like any other.
  bool supports_training() const override { return has_backward(); }
  void forward_train(const nn::RMSNorm& layer, const Tensor& x, const Tensor& y,
                     nn::LayerContext& ctx, Stream stream) const override {
    Tensor rstd = Tensor::empty({x.numel() / layer.dim()}, DType::F32, x.device(), stream);
    std::vector<TensorView> inputs{x};
    push_params(inputs, params(layer));
    call_forward(fn_, inputs, {y, rstd}, attrs(layer), stream);
    ctx.save("rstd", rstd);
  }
  void backward(const nn::RMSNorm& layer, const Tensor& x, nn::LayerContext& ctx, const Tensor& dy,
                const Tensor& dx, Stream stream) const override {
    const ParamRefs ps = params(layer);
    GradWriters grads(ps, /*with_f32=*/true, stream);
    RmsNormAttrs a = attrs(layer);
    a.flags = grads.flags();
    std::vector<TensorView> inputs{dy, x};
    push_params(inputs, ps);
    inputs.push_back(ctx.saved("rstd"));
    std::vector<TensorView> outputs{dx};
    grads.push_outputs(outputs);
    call_backward(fn_, inputs, outputs, a, stream);
    grads.commit();
  }

 private:
  ParamRefs params(const nn::RMSNorm& layer) const {
    return layout_ ? *layout_ : ParamRefs{{&layer, "weight"}};
  }
  static RmsNormAttrs attrs(const nn::RMSNorm& layer) {
    RmsNormAttrs a;
    a.eps = static_cast<float>(layer.eps());
    return a;
  }
  std::optional<ParamRefs> layout_;  // the kernel layout's parameters (stateful kernels)
};

// The pass-through member of a fusion (an RMSNorm whose work a neighbour's kernel does): y = x,
// and in backward dx = dy.
class IdentityRMSNorm final : public nn::RMSNormImpl {
 public:
  explicit IdentityRMSNorm(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  void forward(const nn::RMSNorm&, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    if (x.ptr() != y.ptr()) copy_view(y, x, stream);
  }
  bool supports_training() const override { return true; }
  void forward_train(const nn::RMSNorm& layer, const Tensor& x, const Tensor& y, nn::LayerContext&,
                     Stream stream) const override {
    forward(layer, x, y, stream);
  }
  void backward(const nn::RMSNorm&, const Tensor&, nn::LayerContext&, const Tensor& dy,
                const Tensor& dx, Stream stream) const override {
    copy_view(dx, dy, stream);
  }

 private:
  std::string name_;
};

// RMSNorm → MLP fused (rms_norm_mlp@1), bound to the MLP: x is the norm's input (the norm passes
// it through). Trains when the entry has a backward; the gradients go to the layout's parameters.
class FusedRMSNormMLP final : public nn::MLPImpl, public Named {
 public:
  FusedRMSNormMLP(std::string name, KernelFunction fn, float eps, ParamRefs params)
      : Named(std::move(name), std::move(fn)), eps_(eps), params_(std::move(params)) {}
  std::string name() const override { return name_; }
  void forward(const nn::MLP& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    std::vector<TensorView> inputs{x};
    push_params(inputs, params_);
    call_forward(fn_, inputs, {y}, attrs(layer), stream);
  }
  bool supports_training() const override { return has_backward(); }
  void forward_train(const nn::MLP& layer, const Tensor& x, const Tensor& y, nn::LayerContext& ctx,
                     Stream stream) const override {
    const int64_t rows = x.numel() / layer.hidden_size();
    Tensor rstd = Tensor::empty({rows}, DType::F32, x.device(), stream);
    // the gate / up pre-activations, kept so that backward does not recompute them
    Tensor gate_up =
        Tensor::empty({rows, 2 * layer.intermediate_size()}, x.dtype(), x.device(), stream);
    std::vector<TensorView> inputs{x};
    push_params(inputs, params_);
    call_forward(fn_, inputs, {y, rstd, gate_up}, attrs(layer), stream);
    ctx.save("rstd", rstd);
    ctx.save("gate_up", gate_up);
  }
  void backward(const nn::MLP& layer, const Tensor& x, nn::LayerContext& ctx, const Tensor& dy,
                const Tensor& dx, Stream stream) const override {
    GradWriters grads(params_, /*with_f32=*/true, stream);
    RmsNormMlpAttrs a = attrs(layer);
    a.flags = grads.flags();
    std::vector<TensorView> inputs{dy, x};
    push_params(inputs, params_);
    inputs.push_back(ctx.saved("rstd"));
    inputs.push_back(ctx.saved("gate_up"));  // overwritten by the kernel: ctx is spent after this
    std::vector<TensorView> outputs{dx};
    grads.push_outputs(outputs);
    call_backward(fn_, inputs, outputs, a, stream);
    grads.commit();
  }

 private:
  RmsNormMlpAttrs attrs(const nn::MLP& layer) const {
    RmsNormMlpAttrs a;
    a.eps = eps_;
    a.activation = activation_code(layer.act_fn->kind());
    return a;
  }
  float eps_;
  ParamRefs params_;
};

// Linear → RMSNorm over heads fused (linear_rms_norm@1), bound to the Linear: it writes the
// normalised projection; the norm passes it through. Inference only (the interface has no
// backward).
class FusedLinearRMSNorm final : public nn::LinearImpl, public Named {
 public:
  FusedLinearRMSNorm(std::string name, KernelFunction fn, float eps, int32_t norm_dim,
                     ParamRefs params)
      : Named(std::move(name), std::move(fn)),
        eps_(eps),
        norm_dim_(norm_dim),
        params_(std::move(params)) {}
  std::string name() const override { return name_; }
  void forward(const nn::Linear&, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    LinearRmsNormAttrs a;
    a.eps = eps_;
    a.norm_dim = norm_dim_;
    std::vector<TensorView> inputs{x};
    push_params(inputs, params_);
    call_forward(fn_, inputs, {y}, a, stream);
  }

 private:
  float eps_;
  int32_t norm_dim_;
  ParamRefs params_;
};

// Sibling Linears fused (linear_group@1): the group runs once for all members
// (nn::forward_linears); its gradients go to the layout's parameters.
class LinearGroupAdapter final : public nn::LinearGroupImpl, public Named {
 public:
  LinearGroupAdapter(std::string name, KernelFunction fn, std::vector<const nn::Linear*> members,
                     ParamRefs params)
      : Named(std::move(name), std::move(fn)),
        members_(std::move(members)),
        params_(std::move(params)) {}
  const std::string& display_name() const { return name_; }
  const std::vector<const nn::Linear*>& members() const override { return members_; }
  void forward(const TensorView& x, const std::vector<TensorView>& ys,
               Stream stream) const override {
    std::vector<TensorView> inputs{x};
    push_params(inputs, params_);
    call_forward(fn_, inputs, ys, attrs(), stream);
  }
  bool supports_training() const override { return has_backward(); }
  bool capture_safe() const { return declares_capture(); }
  void forward_train(const Tensor& x, const std::vector<Tensor>& ys, nn::LayerContext& ctx,
                     Stream stream) const override {
    if (!supports_training()) nn::LinearGroupImpl::forward_train(x, ys, ctx, stream);  // refuses
    std::vector<TensorView> outs;
    for (const Tensor& y : ys) outs.push_back(y.view());
    forward(x, outs, stream);
  }
  void backward(const Tensor& x, nn::LayerContext&, const std::vector<Tensor>& dys,
                const Tensor* dx, bool accumulate_dx, Stream stream) const override {
    GradWriters grads(params_, /*with_f32=*/false, stream);
    LinearGroupAttrs a = attrs();
    a.flags = grads.flags();
    std::vector<TensorView> inputs;
    for (const Tensor& dy : dys)
      inputs.push_back(dy.is_contiguous() ? dy.view() : dy.contiguous(stream).view());
    inputs.push_back(x);
    push_params(inputs, params_);
    backward_dx_and_grads(fn_, inputs, grads, a, dx, accumulate_dx, stream);
  }

 private:
  LinearGroupAttrs attrs() const {
    LinearGroupAttrs a;
    a.num_members = static_cast<uint32_t>(members_.size());
    return a;
  }
  std::vector<const nn::Linear*> members_;
  ParamRefs params_;
};

// A member of a fused Linear group. Its parent runs the group once (nn::forward_linears); called
// alone (a caller that runs the projections one by one), it runs the whole group with scratch
// outputs for its siblings and keeps its own — correct, at the cost of the siblings' work.
class GroupMemberLinear final : public nn::LinearImpl {
 public:
  GroupMemberLinear(std::shared_ptr<const LinearGroupAdapter> group, size_t index)
      : group_(std::move(group)), index_(index) {}
  std::string name() const override {
    return group_->display_name() + " (fused group member " + std::to_string(index_) + ")";
  }
  std::shared_ptr<const nn::LinearGroupImpl> group() const override { return group_; }
  bool capture_safe() const { return group_->capture_safe(); }
  void forward(const nn::Linear& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    std::vector<Tensor> scratch;
    std::vector<TensorView> ys = outputs_for(layer, x, y, scratch, stream);
    group_->forward(x, ys, stream);
  }
  bool supports_training() const override { return group_->supports_training(); }
  void forward_train(const nn::Linear& layer, const Tensor& x, const Tensor& y, nn::LayerContext&,
                     Stream stream) const override {
    if (!supports_training()) nn::throw_no_training(*this, "Linear");
    forward(layer, x, y, stream);
  }
  void backward(const nn::Linear&, const Tensor& x, nn::LayerContext& ctx, const Tensor& dy,
                const Tensor* dx, bool accumulate_dx, Stream stream) const override {
    // The siblings' output gradients are zero here: their own calls add their parts.
    std::vector<Tensor> dys;
    const auto& members = group_->members();
    for (size_t i = 0; i < members.size(); ++i) {
      if (i == index_) {
        dys.push_back(dy);
        continue;
      }
      Shape shape = dy.sizes();
      shape.back() = members[i]->out_features();
      dys.push_back(Tensor::zeros(shape, dy.dtype(), dy.device(), stream));
    }
    group_->backward(x, ctx, dys, dx, accumulate_dx, stream);
  }

 private:
  std::vector<TensorView> outputs_for(const nn::Linear&, const TensorView& x, const TensorView& y,
                                      std::vector<Tensor>& scratch, Stream stream) const {
    std::vector<TensorView> ys;
    const auto& members = group_->members();
    for (size_t i = 0; i < members.size(); ++i) {
      if (i == index_) {
        ys.push_back(y);
        continue;
      }
      Shape shape = x.sizes();
      shape.back() = members[i]->out_features();
      scratch.push_back(Tensor::empty(shape, y.dtype, y.device, stream));
      ys.push_back(scratch.back().view());
    }
    return ys;
  }
  std::shared_ptr<const LinearGroupAdapter> group_;
  size_t index_;
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
  MLPAdapter(std::string name, KernelFunction fn, std::optional<ParamRefs> layout)
      : Named(std::move(name), std::move(fn)), layout_(std::move(layout)) {}
  std::string name() const override { return name_; }
  void forward(const nn::MLP& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    std::vector<TensorView> inputs{x};
    push_params(inputs, params(layer));
    call_forward(fn_, inputs, {y}, attrs(layer), stream);
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
    std::vector<TensorView> inputs{x};
    push_params(inputs, params(layer));
    call_forward(fn_, inputs, {y, gate, up}, attrs(layer), stream);
    ctx.save("gate", gate);
    ctx.save("up", up);
  }
  void backward(const nn::MLP& layer, const Tensor& x, nn::LayerContext& ctx, const Tensor& dy,
                const Tensor& dx, Stream stream) const override {
    const ParamRefs ps = params(layer);
    GradWriters grads(ps, /*with_f32=*/false, stream);
    MlpAttrs a = attrs(layer);
    a.flags = grads.flags();
    std::vector<TensorView> inputs{dy, x};
    push_params(inputs, ps);
    if (ctx.has("gate")) {
      inputs.push_back(ctx.saved("gate"));
      inputs.push_back(ctx.saved("up"));
    }
    std::vector<TensorView> outputs{dx};
    grads.push_outputs(outputs);
    call_backward(fn_, inputs, outputs, a, stream);
    grads.commit();
  }

 private:
  ParamRefs params(const nn::MLP& layer) const {
    if (layout_) return *layout_;
    return {{layer.gate_proj.get(), "weight"},
            {layer.up_proj.get(), "weight"},
            {layer.down_proj.get(), "weight"}};
  }
  static MlpAttrs attrs(const nn::MLP& layer) {
    MlpAttrs a;
    a.activation = activation_code(layer.act_fn->kind());
    return a;
  }
  std::optional<ParamRefs> layout_;
};

class LinearAdapter final : public nn::LinearImpl, public Named {
 public:
  LinearAdapter(std::string name, KernelFunction fn, std::optional<ParamRefs> layout)
      : Named(std::move(name), std::move(fn)), layout_(std::move(layout)) {}
  std::string name() const override { return name_; }
  void forward(const nn::Linear& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    LinearAttrs attrs;
    std::vector<TensorView> inputs{x};
    if (layout_) {
      push_params(inputs, *layout_);
    } else {
      inputs.push_back(layer.weight().view());
      if (const Tensor* bias = layer.bias()) inputs.push_back(bias->view());
    }
    call_forward(fn_, inputs, {y}, attrs, stream);
  }
  bool supports_training() const override { return has_backward(); }
  void forward_train(const nn::Linear& layer, const Tensor& x, const Tensor& y, nn::LayerContext&,
                     Stream stream) const override {
    forward(layer, x, y, stream);
  }
  // linear@1's backward takes the weight (not the bias) and gives dweight, dbias; with a layout
  // it takes the layout's parameters and gives one gradient for each.
  void backward(const nn::Linear& layer, const Tensor& x, nn::LayerContext&, const Tensor& dy,
                const Tensor* dx, bool accumulate_dx, Stream stream) const override {
    ParamRefs ps;
    if (layout_) {
      ps = *layout_;
    } else {
      ps.push_back({&layer, "weight"});
      if (layer.has_bias()) ps.push_back({&layer, "bias"});
    }
    GradWriters grads(ps, /*with_f32=*/false, stream);
    LinearAttrs attrs;
    attrs.flags = grads.flags();
    std::vector<TensorView> inputs{dy, x};
    if (layout_)
      push_params(inputs, ps);
    else
      inputs.push_back(layer.weight().view());
    backward_dx_and_grads(fn_, inputs, grads, attrs, dx, accumulate_dx, stream);
  }

 private:
  std::optional<ParamRefs> layout_;
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
  if (layer == "MLP" && !entry.has_layout) {  // a layout holds (or refuses) the biases itself
    if (const auto* mlp = dynamic_cast<const nn::MLP*>(&module); mlp && mlp->gate_proj->has_bias())
      return "entry " + entry.name + " (" + entry.interface_id() +
             ") has no biases, and this MLP has them (mlp_bias)";
  }
  if (entry.has_layout && layer != "RMSNorm" && layer != "MLP" && layer != "Linear")
    return "entry " + entry.name + " has a layout, but hk's adapter for layer " + layer +
           " takes no layout parameters (stateful kernels bind for RMSNorm, MLP and Linear)";
  return "";
}

bool declares_capture(const nn::LayerImpl& impl) {
  if (dynamic_cast<const IdentityRMSNorm*>(&impl)) return true;  // a copy, no kernel call
  if (const auto* member = dynamic_cast<const GroupMemberLinear*>(&impl))
    return member->capture_safe();
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
                                            std::optional<ParamRefs> layout) {
  // A layout of a parameter-less layer can only be empty (check_layout refuses any other): the
  // adapter then has nothing to take from it.
  if (layer == "RMSNorm") {
    as<nn::RMSNorm>(module, layer);
    return std::make_shared<RMSNormAdapter>(display_name, std::move(fn), std::move(layout));
  }
  if (layer == "MLP") {
    as<nn::MLP>(module, layer);
    return std::make_shared<MLPAdapter>(display_name, std::move(fn), std::move(layout));
  }
  if (layer == "Linear") {
    as<nn::Linear>(module, layer);
    return std::make_shared<LinearAdapter>(display_name, std::move(fn), std::move(layout));
  }
  if (layout && !layout->empty())
    throw InvalidArgument("kernelize: layer " + layer +
                          " has no parameters for the kernel layout of " + display_name);
  if (layer == "rotary_pos_emb") {
    as<nn::RotaryApply>(module, layer);
    return std::make_shared<RotaryAdapter>(display_name, std::move(fn));
  }
  if (is_activation_layer(layer))
    return make_activation_adapter(as<nn::Activation>(module, layer), std::move(fn), display_name);
  if (layer == "MultiScaleDeformableAttention")
    return make_deformable_attention_adapter(as<nn::MultiScaleDeformableAttention>(module, layer),
                                             std::move(fn), display_name);
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

FusedImpls make_rmsnorm_mlp_fusion(const nn::RMSNorm& norm, const nn::MLP&, KernelFunction fn,
                                   const std::string& display_name, ParamRefs params) {
  return {{std::make_shared<IdentityRMSNorm>(display_name + " (fused into the MLP)"),
           std::make_shared<FusedRMSNormMLP>(display_name, std::move(fn),
                                             static_cast<float>(norm.eps()), std::move(params))}};
}

FusedImpls make_linear_rmsnorm_fusion(const nn::Linear&, const nn::RMSNorm& norm, KernelFunction fn,
                                      const std::string& display_name, ParamRefs params) {
  return {{std::make_shared<FusedLinearRMSNorm>(
               display_name, std::move(fn), static_cast<float>(norm.eps()),
               static_cast<int32_t>(norm.dim()), std::move(params)),
           std::make_shared<IdentityRMSNorm>(display_name + " (fused into the projection)")}};
}

FusedImpls make_linear_group_fusion(const std::vector<const nn::Linear*>& members,
                                    KernelFunction fn, const std::string& display_name,
                                    ParamRefs params) {
  auto group =
      std::make_shared<LinearGroupAdapter>(display_name, std::move(fn), members, std::move(params));
  FusedImpls out;
  for (size_t i = 0; i < members.size(); ++i)
    out.members.push_back(std::make_shared<GroupMemberLinear>(group, i));
  return out;
}

}  // namespace hk::kernel_binding
