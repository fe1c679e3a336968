// Qwen3-MoE (model_type "qwen3_moe", Transformers' Qwen3MoeForCausalLM): the Qwen3 decoder (q/k
// norm) whose layers are sparse MoE blocks (hk/moe.h) where config.moe.is_sparse_layer says so
// (num_experts > 0, not in mlp_only_layers, (i + 1) % decoder_sparse_step == 0), and gated MLPs of
// intermediate_size elsewhere. Class names are Transformers' (Qwen3MoeDecoderLayer,
// Qwen3MoeSparseMoeBlock, ...). Checkpoints load in the Hub's per-expert layout or stacked (see
// stacked_experts.h); the router load-balancing loss is added in training as Transformers does
// (training_tape.cc, ForwardOptions::output_router_logits).
#include "../decoder_lm.h"
#include "stacked_experts.h"

namespace hk {
namespace {

const bool registered = register_model_type(
    "qwen3_moe",
    [](const ModelConfig& config) {
      return std::make_shared<DecoderLM>(
          config, ArchitectureSpec{"Qwen3Moe", /*qk_norm=*/true, /*sparse_moe=*/true});
    },
    [](const nn::StateDictSource& checkpoint) -> std::unique_ptr<nn::StateDictSource> {
      return std::make_unique<StackedExpertsSource>(checkpoint);
    });

}  // namespace
}  // namespace hk
