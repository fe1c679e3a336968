// The training context of one layer call (LayerContext) and the default training methods of every
// layer Impl, which refuse with a sentence naming the implementation: an Impl that has no
// backward (a kernel adapter of an inference-only entry, a test double) cannot train, and
// `supports_training()` lets a model say so before it runs anything. Deliberately no arithmetic.
#include "hk/error.h"
#include "hk/layers.h"
#include "hk/ops.h"

namespace hk::nn {

const Tensor& LayerContext::saved(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    throw InvalidArgument("training context has no saved tensor '" + name +
                          "' (the layer's forward_train did not keep it, or backward already "
                          "consumed the context)");
  return it->second;
}

LayerContext& LayerContext::child(const std::string& name) {
  auto& slot = children_[name];
  if (!slot) slot = std::make_unique<LayerContext>();
  return *slot;
}

void LayerContext::clear() {
  tensors_.clear();
  children_.clear();
}

void LayerContext::collect_storages(std::map<const void*, size_t>& seen) const {
  for (const auto& [name, t] : tensors_) {
    if (!t.defined()) continue;
    // Owned tensors count their whole storage once; a non-owning wrap counts its own bytes.
    if (t.storage())
      seen.emplace(t.storage().get(), t.storage()->bytes());
    else
      seen.emplace(t.view().ptr(), t.nbytes());
  }
  for (const auto& [name, c] : children_) c->collect_storages(seen);
}

size_t LayerContext::bytes() const {
  std::map<const void*, size_t> seen;
  collect_storages(seen);
  size_t total = 0;
  for (const auto& [ptr, n] : seen) total += n;
  return total;
}

void throw_no_training(const LayerImpl& impl, const char* layer) {
  throw Unsupported("the " + std::string(layer) + " implementation '" + impl.name() +
                    "' has no training forward/backward, so it cannot be used in a training "
                    "forward; kernelize with Mode::Training (which binds only kernels with a "
                    "backward) or reset the layer to the built-in implementation");
}

// ---- defaults: refuse ---------------------------------------------------------------------------

void LinearImpl::forward_train(const Linear&, const Tensor&, const Tensor&, LayerContext&,
                               Stream) const {
  throw_no_training(*this, "Linear");
}
void LinearImpl::backward(const Linear&, const Tensor&, LayerContext&, const Tensor&, const Tensor*,
                          bool, Stream) const {
  throw_no_training(*this, "Linear");
}
void EmbeddingImpl::forward_train(const Embedding&, const Tensor&, const Tensor&, LayerContext&,
                                  Stream) const {
  throw_no_training(*this, "Embedding");
}
void EmbeddingImpl::backward(const Embedding&, const Tensor&, LayerContext&, const Tensor&,
                             Stream) const {
  throw_no_training(*this, "Embedding");
}
void RMSNormImpl::forward_train(const RMSNorm&, const Tensor&, const Tensor&, LayerContext&,
                                Stream) const {
  throw_no_training(*this, "RMSNorm");
}
void RMSNormImpl::backward(const RMSNorm&, const Tensor&, LayerContext&, const Tensor&,
                           const Tensor&, Stream) const {
  throw_no_training(*this, "RMSNorm");
}
void RotaryApplyImpl::forward_train(const RotaryApply&, const Tensor&, const Tensor&, const Tensor&,
                                    const Tensor&, LayerContext&, Stream) const {
  throw_no_training(*this, "rotary_pos_emb");
}
void RotaryApplyImpl::backward(const RotaryApply&, const Tensor&, const Tensor&, LayerContext&,
                               const Tensor&, const Tensor&, Stream) const {
  throw_no_training(*this, "rotary_pos_emb");
}
void AttentionImpl::forward_train(const Attention&, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&, const AttentionCall&, LayerContext&,
                                  Stream) const {
  throw_no_training(*this, "attention");
}
void AttentionImpl::backward(const Attention&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&, const AttentionCall&, LayerContext&, const Tensor&,
                             const Tensor&, const Tensor&, const Tensor&, Stream) const {
  throw_no_training(*this, "attention");
}
void ActivationImpl::backward(const Activation&, const Tensor&, const Tensor&, const Tensor&,
                              Stream) const {
  throw_no_training(*this, "activation");
}
void ActivationImpl::backward_mul(const Activation&, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&, const Tensor&, Stream) const {
  throw_no_training(*this, "activation");
}
void MLPImpl::forward_train(const MLP&, const Tensor&, const Tensor&, LayerContext&, Stream) const {
  throw_no_training(*this, "MLP");
}
void MLPImpl::backward(const MLP&, const Tensor&, LayerContext&, const Tensor&, const Tensor&,
                       Stream) const {
  throw_no_training(*this, "MLP");
}
void CausalLMLossImpl::forward_train(const CausalLMLoss&, const Tensor&, const Tensor&,
                                     const Tensor&, const CausalLMLossOptions&, LayerContext&,
                                     Stream) const {
  throw_no_training(*this, "ForCausalLMLoss");
}
void CausalLMLossImpl::backward(const CausalLMLoss&, const Tensor&, const Tensor&,
                                const CausalLMLossOptions&, LayerContext&, float, const Tensor&,
                                Stream) const {
  throw_no_training(*this, "ForCausalLMLoss");
}
void CausalLMLossImpl::forward_train_fused(const CausalLMLoss&, const Linear&, const Tensor&,
                                           const Tensor&, const Tensor&, const CausalLMLossOptions&,
                                           LayerContext&, Stream) const {
  throw Unsupported("the ForCausalLMLoss implementation '" + name() +
                    "' takes logits, not hidden states (it is not a fused linear cross-entropy)");
}
void CausalLMLossImpl::backward_fused(const CausalLMLoss&, const Linear&, const Tensor&,
                                      const Tensor&, const CausalLMLossOptions&, LayerContext&,
                                      float, const Tensor&, Stream) const {
  throw Unsupported("the ForCausalLMLoss implementation '" + name() +
                    "' takes logits, not hidden states (it is not a fused linear cross-entropy)");
}

}  // namespace hk::nn
