// The Embedding layer and its built-in implementation (hk::ops::embedding); backward scatter-adds
// into the weight's gradient (which, for tied embeddings, also receives the lm_head's).
#include "hk/error.h"
#include "hk/layers.h"
#include "nn/param_grad.h"

namespace hk::nn {
namespace {

class BuiltinEmbedding final : public EmbeddingImpl {
 public:
  std::string name() const override { return "builtin"; }
  void forward(const Embedding& layer, const TensorView& ids, const TensorView& out,
               Stream stream) const override {
    ops::embedding(layer.weight(), ids, out, stream);
  }
  bool supports_training() const override { return true; }
  void forward_train(const Embedding& layer, const Tensor& ids, const Tensor& out, LayerContext&,
                     Stream stream) const override {
    forward(layer, ids, out, stream);
  }
  void backward(const Embedding& layer, const Tensor& ids, LayerContext&, const Tensor& dout,
                Stream stream) const override {
    ParamGradWriter dw(layer, "weight", {layer.weight().dtype(), DType::F32}, true, stream);
    if (!dw.active()) return;
    ops::embedding_backward(dout, ids, dw.buffer(), stream);
    dw.commit();
  }
};

}  // namespace

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim)
    : LayerModule("Embedding", "Embedding", std::make_shared<BuiltinEmbedding>()),
      num_(num_embeddings),
      dim_(embedding_dim) {
  HK_CHECK(num_embeddings > 0 && embedding_dim > 0, "Embedding: sizes must be positive");
  register_parameter("weight", {num_embeddings, embedding_dim});
}

}  // namespace hk::nn
