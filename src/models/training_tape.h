// The tape of a training forward of the decoder LM (private to src/models; tests read its byte
// counts): the layer calls of one forward, in order, each with the input its caller keeps and the
// LayerContext its implementation filled. Backward walks it in reverse, releasing each step's
// tensors as soon as that step's backward ran, and then the whole tape.
//
// What a decoder layer keeps (no gradient checkpointing): its input h and h_mid = h + attn (the two
// RMSNorm inputs), their rstd, the q/k/v projections (before q/k norm and rotary), the attention
// output, the attention function's state (probs or lse), and the MLP's gate(x), up(x). The norms'
// outputs, the normed/rotated q and k and act(gate)·up are recomputed in backward. With gradient
// checkpointing a layer keeps only its input and re-runs its training forward inside backward.
// A MoE layer keeps, instead of gate and up, what its MoeMLP implementation saves (built-in: the
// router logits, the expert-sorted gate_up pre-activations [T·k, 2I] and the row order; megablocks
// adds the top-k ids and weights). A MoE model with output_router_logits adds the load-balancing
// loss once all layers ran; each MoE layer's step then keeps that loss's gradient on its router
// logits for its backward. decoder_layer_tape_bytes counts dense layers.
#pragma once

#include <memory>
#include <vector>

#include "decoder_lm.h"

namespace hk {

class TrainingTape {
 public:
  // Runs the recorded backward (d loss = 1) and releases everything. Throws on a second call.
  void backward(Stream stream);
  bool consumed() const { return consumed_; }

  // Bytes of the distinct storages decoder layer i's step keeps (its input included); a
  // checkpointed layer keeps its input only.
  size_t layer_bytes(size_t i) const;
  size_t num_layers() const { return layers_.size(); }
  // Everything the tape holds.
  size_t total_bytes() const;
  // The tape a training forward attached to `loss` (null for an eval loss).
  static const TrainingTape* of(const Loss& loss) { return loss.tape_.get(); }

 private:
  friend class DecoderLM;
  struct LayerStep {
    Tensor input;  // the layer's h; the previous step's output
    nn::LayerContext ctx;
    Tensor drouter_logits;  // MoE layers with the load-balancing loss: its router-logit gradient
  };

  std::shared_ptr<const DecoderLM> model_;
  Stream stream_;
  bool checkpointing_ = false;
  bool fused_loss_ = false;
  nn::CausalLMLossOptions loss_options_;
  PreparedInputs inputs_;
  nn::LayerContext embed_;
  std::vector<LayerStep> layers_;
  Tensor final_hidden_;  // the final norm's input
  nn::LayerContext final_norm_, lm_head_, loss_;
  Tensor logits_;  // undefined with a fused loss
  bool consumed_ = false;
};

// What one decoder layer's step keeps without gradient checkpointing, for `tokens` = B·S tokens
// in `dtype` (see the top of this file): 2 hidden-state tensors, q/k/v and the attention output,
// gate and up, the rstd rows, plus `attention_state_bytes`, what the attention function saves
// (eager: f32 probabilities [B, Hq, S, S]; flash-style: f32 lse [B, Hq, S]).
size_t decoder_layer_tape_bytes(const ModelConfig& config, bool qk_norm, int64_t tokens,
                                DType dtype, size_t attention_state_bytes);

}  // namespace hk
