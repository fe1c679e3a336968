// hk/attention_functions.h — the name-keyed registry of attention functions (Transformers'
// ALL_ATTENTION_FUNCTIONS): "eager" and "sdpa" are built in (both the eager op of hk/ops.h);
// kernelize registers more (e.g. a hub flash-attention entry under its hub id) and points a model's
// attention layers at them with `Attention::set_attn_implementation`. Functions take the same
// arguments as the built-in `attention` layer implementation; this header deliberately does not
// resolve hub ids — that is kernelize's job.
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

}  // namespace hk::nn
