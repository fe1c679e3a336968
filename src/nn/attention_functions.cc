// The attention-function registry with the built-in "eager" and "sdpa" entries (both the eager
// op; a fused SDPA-like path is a CUDA kernel matter, not a registry one), and the registry of
// their training forms (eager: the op's f32 probabilities saved, ops::attention_backward).
#include "hk/attention_functions.h"

#include <map>
#include <mutex>

#include "hk/error.h"

namespace hk::nn {
namespace {

ops::AttentionOptions op_options(const AttentionCall& call) {
  ops::AttentionOptions options;
  options.scale = call.scale;
  options.causal = call.causal;
  options.key_start = call.key_start;
  return options;
}

void eager_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const AttentionCall& call, Stream stream) {
  ops::attention(q, k, v, out, op_options(call), nullptr, stream);
}

// Eager training form: the f32 probabilities [B, Hq, S, T] are the saved state.
Tensor eager_attention_train(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const AttentionCall& call, Stream stream) {
  Tensor probs = Tensor::empty({q.shape[0], q.shape[2], q.shape[1], k.shape[1]},
                               statistics_dtype(q.dtype), q.device, stream);
  ops::attention(q, k, v, out, op_options(call), &probs.view(), stream);
  return probs;
}

void eager_attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                              const TensorView& v, const TensorView& /*out*/, const Tensor& saved,
                              const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const AttentionCall& call, Stream stream) {
  ops::attention_backward(dout, q, k, v, saved, dq, dk, dv, op_options(call), stream);
}

struct Registry {
  std::mutex mutex;
  std::map<std::string, AttentionFunction> functions{{"eager", eager_attention},
                                                     {"sdpa", eager_attention}};
  // "sdpa" trains like eager until a blocked (flash-style) form replaces it.
  std::map<std::string, AttentionTraining> training{
      {"eager", {eager_attention_train, eager_attention_backward}},
      {"sdpa", {eager_attention_train, eager_attention_backward}}};
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_attention_function(const std::string& name, AttentionFunction fn) {
  HK_CHECK(!name.empty() && fn, "register_attention_function: empty name or function");
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().functions[name] = std::move(fn);
}

const AttentionFunction& attention_function(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  auto it = registry().functions.find(name);
  if (it == registry().functions.end()) {
    std::string known;
    for (const auto& [n, f] : registry().functions) known += (known.empty() ? "" : ", ") + n;
    throw InvalidArgument("attention implementation '" + name +
                          "' is not registered; registered: " + known);
  }
  return it->second;  // std::map nodes are stable; entries are replaced, never erased
}

bool has_attention_function(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  return registry().functions.count(name) != 0;
}

std::vector<std::string> attention_function_names() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  std::vector<std::string> out;
  for (const auto& [n, f] : registry().functions) out.push_back(n);
  return out;
}

void register_attention_training(const std::string& name, AttentionTraining fns) {
  HK_CHECK(!name.empty() && fns.forward && fns.backward,
           "register_attention_training: empty name, forward or backward");
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().training[name] = std::move(fns);
}

const AttentionTraining* attention_training(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  auto it = registry().training.find(name);
  return it == registry().training.end() ? nullptr : &it->second;  // nodes are stable
}

std::vector<std::string> attention_training_names() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  std::vector<std::string> out;
  for (const auto& [n, f] : registry().training) out.push_back(n);
  return out;
}

}  // namespace hk::nn
