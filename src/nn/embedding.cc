// The Embedding layer and its built-in implementation (hk::ops::embedding).
#include "hk/error.h"
#include "hk/layers.h"

namespace hk::nn {
namespace {

class BuiltinEmbedding final : public EmbeddingImpl {
 public:
  std::string name() const override { return "builtin"; }
  void forward(const Embedding& layer, const TensorView& ids, const TensorView& out,
               Stream stream) const override {
    ops::embedding(layer.weight(), ids, out, stream);
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
