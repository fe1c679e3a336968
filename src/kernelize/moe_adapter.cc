// The kernel adapter of layer MoeMLP (hk/moe.h) for moe_mlp@1 entries (e.g.
// kernels-community/megablocks:MegaBlocksMoeMLP), forward and training.
//
// Inference passes x, the router and the experts' weights and gets y. The training forward also
// takes the interface's saved state — router logits, top-k ids and weights, the gate_up
// pre-activations in expert order — keeps it in the layer context and hands it back to the
// entry's backward, with the load-balancing loss's router-logit gradient when there is one. Weight
// gradients go through nn::ParamGradWriter (one accumulate flag for the three, as the kernel call
// has one). x and dy are made contiguous [rows, H] first; the interface wants dense rows.
#include "kernelize/moe_adapter.h"

#include "kernelize/adapters.h"

#include "hk/error.h"
#include "hk/layer_interfaces.h"
#include "hk/ops.h"
#include "nn/param_grad.h"

namespace hk::kernel_binding {
namespace {

uint32_t activation_code(const nn::MoeMLP& layer) {
  switch (layer.experts->act_fn->kind()) {
    case ops::Activation::GELU:
      return kActivationGELU;
    case ops::Activation::GELUTanh:
      return kActivationGELUTanh;
    default:
      return kActivationSiLU;
  }
}

Tensor dense_rows(const Tensor& t, int64_t cols, Stream stream) {
  const Tensor c = t.is_contiguous() ? t : t.contiguous(stream);
  return c.reshape({c.numel() / cols, cols});
}

class MoeMLPAdapter final : public nn::MoeMLPImpl {
 public:
  MoeMLPAdapter(std::string name, KernelFunction fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  bool supports_training() const override { return fn_.entry().has_backward; }

  void forward(const nn::MoeMLP& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    const Tensor x2 = dense_rows(Tensor::wrap(x), layer.hidden_size(), stream);
    Tensor y2 = Tensor::wrap(y);
    const bool direct = y2.is_contiguous();
    Tensor out =
        direct ? y2.reshape(x2.sizes()) : Tensor::empty(x2.sizes(), y.dtype, y.device, stream);
    run(false, inputs(layer, x2), {out}, layer, stream);
    if (!direct) copy_view(y, out.reshape(y2.sizes()), stream);
  }

  void forward_train(const nn::MoeMLP& layer, const Tensor& x, const Tensor& y,
                     const Tensor& router_logits, nn::LayerContext& ctx,
                     Stream stream) const override {
    HK_CHECK(y.is_contiguous() && router_logits.is_contiguous(),
             "MoeMLP training forward: y and router_logits must be contiguous");
    const Tensor x2 = dense_rows(x, layer.hidden_size(), stream);
    const int64_t tokens = x2.size(0), k = layer.top_k();
    Tensor ids = Tensor::empty({tokens, k}, DType::I32, x.device(), stream);
    Tensor weights = Tensor::empty({tokens, k}, DType::F32, x.device(), stream);
    Tensor gate_up =
        Tensor::empty({tokens * k, 2 * layer.intermediate_size()}, x.dtype(), x.device(), stream);
    run(false, inputs(layer, x2), {y.reshape(x2.sizes()), router_logits, ids, weights, gate_up},
        layer, stream);
    ctx.save("router_logits", router_logits);
    ctx.save("topk_ids", ids);
    ctx.save("topk_weights", weights);
    ctx.save("gate_up", gate_up);
  }

  void backward(const nn::MoeMLP& layer, const Tensor& x, nn::LayerContext& ctx, const Tensor& dy,
                const Tensor* drouter_logits, const Tensor& dx, Stream stream) const override {
    HK_CHECK(dx.is_contiguous() && dx.numel() == x.numel(),
             "MoeMLP backward: dx " + dx.view().str() + " must be contiguous, x's shape");
    const int64_t H = layer.hidden_size();
    const Tensor x2 = dense_rows(x, H, stream);
    std::vector<TensorView> in{dense_rows(dy, H, stream)};
    for (const TensorView& v : inputs(layer, x2)) in.push_back(v);
    for (const char* saved : {"router_logits", "topk_ids", "topk_weights", "gate_up"})
      in.push_back(ctx.saved(saved));
    Tensor extra;
    if (drouter_logits) {
      extra = drouter_logits->dtype() == DType::F32
                  ? *drouter_logits
                  : Tensor::empty(drouter_logits->sizes(), DType::F32, dx.device(), stream);
      if (drouter_logits->dtype() != DType::F32) ops::cast(*drouter_logits, extra, stream);
      in.push_back(extra);
    }
    const nn::MoeExperts& ex = *layer.experts;
    nn::ParamGradWriter dwr(*layer.gate, "weight", {layer.gate->weight().dtype()}, false, stream);
    nn::ParamGradWriter dgu(ex, "gate_up_proj", {ex.gate_up_proj().dtype()}, false, stream);
    nn::ParamGradWriter ddown(ex, "down_proj", {ex.down_proj().dtype()}, false, stream);
    // One flag for the three: when they disagree, the fresh ones start at zero and all add.
    const bool any = (dwr.active() && dwr.accumulate()) || (dgu.active() && dgu.accumulate()) ||
                     (ddown.active() && ddown.accumulate());
    if (any)
      for (const nn::ParamGradWriter* w : {&dwr, &dgu, &ddown})
        if (w->active() && !w->accumulate()) ops::fill(w->buffer(), 0.0, stream);
    auto out = [](const nn::ParamGradWriter& w) {
      return w.active() ? w.buffer().view() : TensorView();
    };
    run(true, in, {dx.reshape(x2.sizes()), out(dwr), out(dgu), out(ddown)}, layer, stream,
        any ? kAccumulateWeightGrads : 0u);
    dwr.commit();
    dgu.commit();
    ddown.commit();
  }

 private:
  static std::vector<TensorView> inputs(const nn::MoeMLP& layer, const Tensor& x2) {
    return {x2, layer.gate->weight(), layer.experts->gate_up_proj(), layer.experts->down_proj()};
  }
  void run(bool backward, const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           const nn::MoeMLP& layer, Stream stream, uint32_t flags = 0) const {
    MoeMlpAttrs attrs;
    attrs.top_k = static_cast<int32_t>(layer.top_k());
    attrs.norm_topk_prob = layer.norm_topk_prob() ? 1u : 0u;
    attrs.activation = activation_code(layer);
    attrs.flags = flags;
    call_kernel_pass(fn_, backward, in, out, &attrs, sizeof attrs, stream);
  }

  std::string name_;
  KernelFunction fn_;
};

}  // namespace

std::shared_ptr<nn::MoeMLPImpl> make_moe_mlp_adapter(KernelFunction fn,
                                                     const std::string& display_name) {
  return std::make_shared<MoeMLPAdapter>(display_name, std::move(fn));
}

}  // namespace hk::kernel_binding
