// Qwen3 (model_type "qwen3"): the shared decoder with per-head q_norm/k_norm (RMSNorm over
// head_dim) before rotary. Checkpoint keys are the module paths (Transformers' names).
#include "../decoder_lm.h"

namespace hk {
namespace {

const bool registered = register_model_type("qwen3", [](const ModelConfig& config) {
  return std::make_shared<DecoderLM>(config, ArchitectureSpec{"Qwen3", /*qk_norm=*/true});
});

}  // namespace
}  // namespace hk
