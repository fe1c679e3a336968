// The attention-function registry with its built-in entries, and the registry of training forms.
//
//   "eager": hk::ops::attention (the eager op: Transformers' eager attention, S×T scores in f32).
//   "sdpa":  hk::ops::fused_attention — flash kernels on CUDA (bf16/f16, head_dim 64/128/256), a
//            blocked online softmax on CPU; never materialises the scores. On CUDA, a case the
//            flash kernels do not serve (f32, other head dims) runs the eager op instead when the
//            call uses only what the eager op has (no softcap, window or packed sequences).
// Training forms: "eager" saves the op's f32 probabilities [B, Hq, S, T] (ops::attention_backward);
// "sdpa" saves the f32 lse [B, Hq, S] ([Hq, total] for packed sequences) and
// its backward is hk::ops::fused_attention_backward; when the flash kernels cannot serve a CUDA
// call it delegates to the registered "eager" training form (its saved state is then the eager
// one, which its backward recognises by rank). Kernelize registers hub kernels' forms under their
// hub ids. Packed calls (AttentionCall::cu_seqlens_q) carry q/k/v as [1, total, H, D].
#include "hk/attention_functions.h"

#include <map>
#include <mutex>

#include "hk/error.h"
#include "hk/ops.h"

namespace hk::nn {
namespace {

void require_eager_call(const AttentionCall& call) {
  if (call.softcap > 0.0f || call.window_left >= 0 || call.cu_seqlens_q != nullptr)
    throw Unsupported(
        "attn_implementation=eager has no softcap, sliding window or packed sequences; use "
        "sdpa or a flash kernel");
}

ops::AttentionOptions op_options(const AttentionCall& call) {
  require_eager_call(call);
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

bool packed(const AttentionCall& call) {
  return call.cu_seqlens_q != nullptr;
}

ops::FusedAttentionOptions fused_options(const AttentionCall& call) {
  ops::FusedAttentionOptions o;
  o.scale = call.scale;
  o.causal = call.causal;
  o.softcap = call.softcap;
  o.window_left = call.window_left;
  o.key_start = call.key_start;
  o.cu_seqlens_q = call.cu_seqlens_q;
  o.cu_seqlens_k = call.cu_seqlens_k;
  o.max_seqlen_q = call.max_seqlen_q;
  o.max_seqlen_k = call.max_seqlen_k;
  o.deterministic = call.deterministic;
  return o;
}

// [1, total, H, D] → [total, H, D] for packed calls; the view itself otherwise.
TensorView unbatched(const TensorView& t, const AttentionCall& call) {
  if (!packed(call)) return t;
  if (t.ndim != 4 || t.shape[0] != 1)
    throw InvalidArgument(
        "attention with cu_seqlens takes q/k/v as [1, total, heads, head_dim], got " + t.str());
  return t.select(0, 0);
}

bool eager_can_serve(const AttentionCall& call) {
  return call.softcap == 0.0f && call.window_left < 0 && !packed(call);
}

void sdpa_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& out, const AttentionCall& call, Stream stream) {
  try {
    ops::fused_attention(unbatched(q, call), unbatched(k, call), unbatched(v, call),
                         unbatched(out, call), fused_options(call), nullptr, stream);
  } catch (const Unsupported&) {
    if (!q.device.is_cuda() || !eager_can_serve(call)) throw;
    eager_attention(q, k, v, out, call, stream);
  }
}

Shape lse_shape(const TensorView& q, const AttentionCall& call) {
  if (packed(call)) return {q.shape[2], q.shape[1]};
  return {q.shape[0], q.shape[2], q.shape[1]};
}

Tensor sdpa_forward_train(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& out, const AttentionCall& call, Stream stream);

void sdpa_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                   const TensorView& v, const TensorView& out, const Tensor& saved,
                   const TensorView& dq, const TensorView& dk, const TensorView& dv,
                   const AttentionCall& call, Stream stream);

struct Registry {
  std::mutex mutex;
  std::map<std::string, AttentionFunction> functions{{"eager", eager_attention},
                                                     {"sdpa", sdpa_attention}};
  std::map<std::string, AttentionTraining> training{
      {"eager", {eager_attention_train, eager_attention_backward}},
      {"sdpa", {sdpa_forward_train, sdpa_backward}}};
};

Registry& registry() {
  static Registry r;
  return r;
}

const AttentionTraining* eager_training() {
  const AttentionTraining* eager = attention_training("eager");
  HK_CHECK(eager != nullptr, "sdpa training: no \"eager\" training form to fall back to");
  return eager;
}

Tensor sdpa_forward_train(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& out, const AttentionCall& call, Stream stream) {
  Tensor lse = Tensor::empty(lse_shape(q, call), DType::F32, q.device, stream);
  try {
    const TensorView lse_view = lse.view();
    ops::fused_attention(unbatched(q, call), unbatched(k, call), unbatched(v, call),
                         unbatched(out, call), fused_options(call), &lse_view, stream);
  } catch (const Unsupported&) {
    if (!q.device.is_cuda() || !eager_can_serve(call)) throw;
    return eager_training()->forward(q, k, v, out, call, stream);
  }
  return lse;
}

void sdpa_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                   const TensorView& v, const TensorView& out, const Tensor& saved,
                   const TensorView& dq, const TensorView& dk, const TensorView& dv,
                   const AttentionCall& call, Stream stream) {
  const size_t lse_rank = lse_shape(q, call).size();
  if (saved.ndim() != static_cast<int>(lse_rank) || saved.dtype() != DType::F32) {
    // the forward delegated to the eager form: so does the backward
    eager_training()->backward(dout, q, k, v, out, saved, dq, dk, dv, call, stream);
    return;
  }
  ops::fused_attention_backward(unbatched(dout, call), unbatched(q, call), unbatched(k, call),
                                unbatched(v, call), unbatched(out, call), saved.view(),
                                unbatched(dq, call), unbatched(dk, call), unbatched(dv, call),
                                fused_options(call), stream);
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
  return it == registry().training.end() ? nullptr : &it->second;
}

std::vector<std::string> attention_training_names() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  std::vector<std::string> out;
  for (const auto& [n, f] : registry().training) out.push_back(n);
  return out;
}

}  // namespace hk::nn
