// The decoder-only causal LM shared by Qwen3 and Llama (private to src/models and
// src/generation): the module tree
//   <Arch>ForCausalLM
//     model: embed_tokens, layers.N {input_layernorm, self_attn, post_attention_layernorm, mlp},
//            norm, rotary_emb
//     (mlp: a gated MLP, or for Qwen3-MoE's sparse layers the MoE block {experts, gate})
//     lm_head (weight tied to model.embed_tokens.weight when tie_word_embeddings)
//     loss_function (ForCausalLMLoss, no parameters)
// and its forward. Architectures differ only in an ArchitectureSpec (class-name prefix, q/k norm).
// The training forward and its tape are in training_tape.{h,cc}.
// Deliberately no sliding-window layers here; the MoE block itself is nn::MoeMLP (hk/moe.h).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hk/layers.h"
#include "hk/models.h"
#include "hk/moe.h"

namespace hk {

class DecodeSession;  // src/generation: the device decode of generate()

struct ArchitectureSpec {
  std::string prefix;    // "Qwen3", "Llama": class names are <prefix>RMSNorm, <prefix>MLP, ...
  bool qk_norm = false;  // Qwen3: RMSNorm over head_dim on q and k before rotary
  // Qwen3-MoE: the layers ModelConfig::moe.is_sparse_layer names hold a MoE block as `mlp`.
  bool sparse_moe = false;
};

class DecoderLayer : public nn::Module {
 public:
  DecoderLayer(const ModelConfig& config, const ArchitectureSpec& spec, int64_t layer_index);
  // h [B, S, H] updated in place (residual stream); `normed` and `delta` are scratch tensors of
  // h's shape, shared by all layers of one forward.
  // `pending_delta`: `delta` still holds the previous layer's MLP output, to be added to `h`
  // (fused with this layer's input norm). On return `delta` holds this layer's MLP output, not
  // yet added: the caller adds it (see add_then_norm).
  void forward(const Tensor& h, const Tensor& normed, const Tensor& delta, bool pending_delta,
               const nn::AttentionState& state, Stream stream) const;
  // Training: returns h_out = h_mid + mlp(norm2(h_mid)), h_mid = h + attn(norm1(h)) (new tensors;
  // h is the caller's to keep). ctx keeps h_mid and the sub-layers' contexts; the norms' outputs
  // are recomputed in backward. A MoE layer sets `router_logits` ([B·S, E], when non-null).
  Tensor forward_train(const Tensor& h, const nn::AttentionState& state, nn::LayerContext& ctx,
                       Stream stream, Tensor* router_logits = nullptr) const;
  // dh holds d(h_out) on entry and d(h) on return (updated in place); parameter gradients added.
  // `drouter_logits`: a MoE layer's extra router-logit gradient (the load-balancing loss's).
  void backward(const Tensor& h, const nn::AttentionState& state, nn::LayerContext& ctx,
                const Tensor& dh, Stream stream, const Tensor* drouter_logits = nullptr) const;

  std::shared_ptr<nn::RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<nn::Attention> self_attn;
  std::shared_ptr<nn::MLP> mlp;          // the dense MLP; null on a sparse MoE layer
  std::shared_ptr<nn::MoeMLP> moe_mlp;   // the MoE block (registered as "mlp"); null when dense
};

class DecoderModel : public nn::Module {
 public:
  DecoderModel(const ModelConfig& config, const ArchitectureSpec& spec);
  std::shared_ptr<nn::Embedding> embed_tokens;
  std::vector<std::shared_ptr<DecoderLayer>> layers;
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::RotaryEmbedding> rotary_emb;
};

class DecoderLM : public nn::Module, public std::enable_shared_from_this<DecoderLM> {
 public:
  DecoderLM(const ModelConfig& config, const ArchitectureSpec& spec);

  // In training mode with labels: forward_train (a tape on the returned loss). Else inference.
  CausalLMOutput forward(const Tensor& input_ids, const ForwardOptions& options) const;
  CausalLMOutput forward_train(const Tensor& input_ids, const ForwardOptions& options) const;
  // Points every attention layer at a registered attention function ("eager", "sdpa", ...).
  void set_attn_implementation(const std::string& name);

  ModelConfig config;
  GenerationConfig generation_config;
  LoadOptions load_options;
  std::optional<KernelizeOptions> kernelize_options;  // set when the model was kernelized
  std::optional<KernelizeReport> kernelize_report;
  Device device = Device::cpu();
  DType dtype = DType::F32;
  bool gradient_checkpointing = false;
  // The device decode of the last CUDA generate (KV cache, buffers, captured graph), reused by the
  // next generate with the same batch and cache bucket; replaced when they differ or the layer
  // bindings changed. Inference only: training never touches it.
  mutable std::shared_ptr<DecodeSession> decode_session;

  std::shared_ptr<DecoderModel> model;
  std::shared_ptr<nn::Linear> lm_head;
  std::shared_ptr<nn::CausalLMLoss> loss_function;
};

// model_type -> tree builder. Each family registers itself from its own folder, optionally with a
// checkpoint adapter: a source presenting the checkpoint's tensors in the tree's layout (Qwen3-MoE:
// per-expert keys stacked), wrapped around the checkpoint before it loads.
using ModelBuilder = std::function<std::shared_ptr<DecoderLM>(const ModelConfig&)>;
using CheckpointAdapter =
    std::function<std::unique_ptr<nn::StateDictSource>(const nn::StateDictSource& checkpoint)>;
bool register_model_type(const std::string& model_type, ModelBuilder builder,
                         CheckpointAdapter adapter = {});

// What forward and forward_train share: the inputs moved to the model's device and checked, left
// padding as key_start (i32) and positions, the rotary tables.
struct PreparedInputs {
  Tensor ids, key_start, cos, sin, labels;
  int64_t batch = 0, seq = 0, past = 0;
  nn::AttentionState attention_state() const;
};
PreparedInputs prepare_inputs(const DecoderLM& lm, const Tensor& input_ids,
                              const ForwardOptions& options);

}  // namespace hk
