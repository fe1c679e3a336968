// ForCausalLMLoss: next-token cross entropy, as Transformers' ForCausalLMLoss computes it: labels
// padded with -100 on the right and shifted by one (logits[:, t] predicts labels[:, t+1], the last
// position predicts nothing), f32 math, ignore_index -100, the mean over the non-ignored targets or
// their sum / num_items_in_batch. Shifting the labels (not the logits) means the [B, S, V] logits
// are used in place, never copied. The built-in training form keeps the per-row logsumexp and the
// shifted labels; its backward writes d(logits) in the logits' dtype (f32 math, one rounding, as
// the backward of Transformers' `logits.float()` does). The fused linear + cross-entropy form is a
// kernel's (kernelize binds it); the built-in takes logits.
#include "hk/error.h"
#include "hk/layers.h"

namespace hk::nn {
namespace {

void check_shapes(const TensorView& logits, const TensorView& labels) {
  HK_CHECK(logits.ndim == 3 && labels.ndim == 2 && labels.shape[0] == logits.shape[0] &&
               labels.shape[1] == logits.shape[1],
           "ForCausalLMLoss: logits " + logits.str() + " and labels " + labels.str() +
               " must be [B, S, V] and [B, S]");
}

ops::CrossEntropyOptions ce_options(const CausalLMLossOptions& options) {
  ops::CrossEntropyOptions o;
  o.reduction = options.num_items_in_batch > 0 ? ops::Reduction::Sum : ops::Reduction::Mean;
  return o;
}

// loss = CE(logits, shifted labels) (mean, or sum / num_items_in_batch); lse written when given.
void shifted_loss(const TensorView& logits, const Tensor& shifted, const TensorView& loss,
                  const CausalLMLossOptions& options, const TensorView* lse, Stream stream) {
  const int64_t n = logits.shape[0] * logits.shape[1], v = logits.shape[2];
  Tensor dense = Tensor::wrap(logits);
  if (!dense.is_contiguous()) dense = dense.contiguous(stream);
  ops::cross_entropy(dense.reshape({n, v}), shifted.reshape({n}), loss, ce_options(options), lse,
                     stream);
  if (options.num_items_in_batch > 0)
    ops::scale(loss, 1.0f / static_cast<float>(options.num_items_in_batch), loss, stream);
}

class BuiltinCausalLMLoss final : public CausalLMLossImpl {
 public:
  std::string name() const override { return "builtin"; }
  bool supports_training() const override { return true; }

  void forward(const CausalLMLoss&, const TensorView& logits, const TensorView& labels,
               const TensorView& loss, const CausalLMLossOptions& options,
               Stream stream) const override {
    check_shapes(logits, labels);
    nn::causal_lm_loss(logits, labels, loss, options, stream);
  }

  void forward_train(const CausalLMLoss&, const Tensor& logits, const Tensor& labels,
                     const Tensor& loss, const CausalLMLossOptions& options, LayerContext& ctx,
                     Stream stream) const override {
    check_shapes(logits, labels);
    Tensor shifted = shift_labels(labels, stream);
    Tensor lse = Tensor::empty({logits.size(0) * logits.size(1)}, statistics_dtype(logits.dtype()),
                               logits.device(), stream);
    shifted_loss(logits, shifted, loss, options, &lse.view(), stream);
    ctx.save("shifted_labels", shifted);
    ctx.save("lse", lse);
  }

  void backward(const CausalLMLoss&, const Tensor& logits, const Tensor&,
                const CausalLMLossOptions& options, LayerContext& ctx, float dloss,
                const Tensor& dlogits, Stream stream) const override {
    HK_CHECK(logits.is_contiguous() && dlogits.is_contiguous() && dlogits.sizes() == logits.sizes(),
             "ForCausalLMLoss backward: logits " + logits.view().str() + " and dlogits " +
                 dlogits.view().str() + " must be contiguous and of one shape");
    const int64_t n = logits.size(0) * logits.size(1), v = logits.size(2);
    // d(sum / n) = dloss / n per summed term. Filled on the device: no host-device copy.
    Tensor upstream = Tensor::empty({1}, statistics_dtype(logits.dtype()), logits.device(), stream);
    const double n_items = static_cast<double>(options.num_items_in_batch);
    ops::fill(upstream, options.num_items_in_batch > 0 ? dloss / n_items : dloss, stream);
    const Tensor& lse = ctx.saved("lse");
    ops::cross_entropy_backward(upstream, logits.reshape({n, v}),
                                ctx.saved("shifted_labels").reshape({n}), dlogits.reshape({n, v}),
                                ce_options(options), &lse.view(), stream);
  }
};

}  // namespace

void causal_lm_loss(const TensorView& logits, const TensorView& labels, const TensorView& loss,
                    const CausalLMLossOptions& options, Stream stream) {
  check_shapes(logits, labels);
  shifted_loss(logits, shift_labels(Tensor::wrap(labels), stream), loss, options, nullptr, stream);
}

Tensor shift_labels(const Tensor& labels, Stream stream) {
  HK_CHECK(labels.ndim() == 2, "shift_labels: labels must be [B, S], got " + labels.view().str());
  const int64_t s = labels.size(1);
  Tensor out = Tensor::empty(labels.sizes(), DType::I64, labels.device(), stream);
  if (s > 1) ops::cast(labels.slice(1, 1, s), out.slice(1, 0, s - 1), stream);
  ops::fill(out.slice(1, s - 1, s), -100.0, stream);
  return out;
}

CausalLMLoss::CausalLMLoss()
    : LayerModule("ForCausalLMLoss", "ForCausalLMLoss", std::make_shared<BuiltinCausalLMLoss>()) {}

}  // namespace hk::nn
