// Llama (model_type "llama"): the shared decoder without q/k norm; attention_bias / mlp_bias from
// the config; default or "llama3" RoPE scaling. Checkpoint keys are Transformers' names.
#include "../decoder_lm.h"

namespace hk {
namespace {

const bool registered = register_model_type("llama", [](const ModelConfig& config) {
  return std::make_shared<DecoderLM>(config, ArchitectureSpec{"Llama", /*qk_norm=*/false});
});

}  // namespace
}  // namespace hk
