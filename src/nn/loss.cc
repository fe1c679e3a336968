// ForCausalLMLoss: next-token cross entropy (logits[:, t] predicts labels[:, t+1]), mean over the
// targets that are not -100, computed in f32 like Transformers' ForCausalLMLoss. Forward only;
// the training path (backward, fused linear-cross-entropy) comes with the Liger work.
#include "hk/error.h"
#include "hk/layers.h"

namespace hk::nn {
namespace {

class BuiltinCausalLMLoss final : public CausalLMLossImpl {
 public:
  std::string name() const override { return "builtin"; }
  void forward(const CausalLMLoss&, const TensorView& logits, const TensorView& labels,
               const TensorView& loss, Stream stream) const override {
    HK_CHECK(logits.ndim == 3 && labels.ndim == 2 && labels.shape[0] == logits.shape[0] &&
                 labels.shape[1] == logits.shape[1],
             "ForCausalLMLoss: logits " + logits.str() + " and labels " + labels.str() +
                 " must be [B, S, V] and [B, S]");
    const int64_t b = logits.shape[0], s = logits.shape[1], v = logits.shape[2];
    if (s < 2) {
      ops::fill(loss, 0.0, stream);
      return;
    }
    Tensor shifted_logits = Tensor::wrap(logits).slice(1, 0, s - 1).contiguous(stream);
    Tensor shifted_labels = Tensor::wrap(labels).slice(1, 1, s).contiguous(stream);
    ops::cross_entropy(shifted_logits.reshape({b * (s - 1), v}),
                       shifted_labels.reshape({b * (s - 1)}), loss, {}, nullptr, stream);
  }
};

}  // namespace

CausalLMLoss::CausalLMLoss()
    : LayerModule("ForCausalLMLoss", "ForCausalLMLoss", std::make_shared<BuiltinCausalLMLoss>()) {}

}  // namespace hk::nn
