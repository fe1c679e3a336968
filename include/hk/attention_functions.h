// hk/attention_functions.h — the name-keyed registry of attention functions (Transformers'
// ALL_ATTENTION_FUNCTIONS): "eager" (the eager op of hk/ops.h) and "sdpa" (the fused attention
// hk::ops::fused_attention: flash kernels on CUDA, a blocked online softmax on CPU) are built in;
// kernelize registers more (e.g. a hub flash-attention entry under its hub id) and points a model's
// attention layers at them with `Attention::set_attn_implementation`. Functions take the same
// arguments as the built-in `attention` layer implementation; this header deliberately does not
// resolve hub ids — that is kernelize's job.
//
// Training forms live in a second registry under the same names: a forward that also returns the
// state its backward needs, and that backward. "eager" saves the f32 probabilities, "sdpa" the f32
// lse (hk::ops::fused_attention_backward); kernelize registers hub kernels' forms under their hub
// ids. A function without a training form cannot be used in a training forward (the attention
// layer says so, naming the ones that can).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "hk/layers.h"

namespace hk::nn {

using AttentionFunction =
    std::function<void(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const AttentionCall& call, Stream stream)>;

// Registers (or replaces) a function under `name`.
void register_attention_function(const std::string& name, AttentionFunction fn);
// Throws InvalidArgument naming `name` and listing the registered names when absent.
const AttentionFunction& attention_function(const std::string& name);
bool has_attention_function(const std::string& name);
std::vector<std::string> attention_function_names();

// A training form of a registered attention function: forward that also returns what the backward
// needs.
using AttentionForwardTrain =
    std::function<Tensor(const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, const AttentionCall& call, Stream stream)>;
// returns the saved state (eager: f32 probs [B,Hq,S,T]; flash-style: f32 lse [B,Hq,S])
using AttentionBackward = std::function<void(
    const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
    const TensorView& out, const Tensor& saved, const TensorView& dq, const TensorView& dk,
    const TensorView& dv, const AttentionCall& call, Stream stream)>;
// dk/dv summed over each kv group, written
struct AttentionTraining {
  AttentionForwardTrain forward;
  AttentionBackward backward;
};
// Registers (or replaces) the training form of `name`.
void register_attention_training(const std::string& name, AttentionTraining fns);
// null: no training form
const AttentionTraining* attention_training(const std::string& name);
// Names with a training form, sorted.
std::vector<std::string> attention_training_names();

}  // namespace hk::nn
