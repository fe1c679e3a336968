// Forward of the shared decoder-only LM: embeddings, N pre-norm decoder layers with residual
// adds, final norm, lm_head on the last `logits_to_keep` positions, optional loss.
//
// Positions: given, or computed on the host as `cache length + s - key_start[b]` (clamped at 0) so
// each left-padded row starts at 0 on its first real token, as Transformers does from an attention
// mask. The KV cache advances once, after every layer wrote this call's keys.
#include "decoder_lm.h"

#include <algorithm>

#include "hk/error.h"
#include "hk/ops.h"

namespace hk {
namespace {

class ModuleList : public nn::Module {
 public:
  ModuleList() : Module("ModuleList") {}
};

nn::AttentionShape attention_shape(const ModelConfig& c, const ArchitectureSpec& spec) {
  nn::AttentionShape s;
  s.hidden_size = c.hidden_size;
  s.num_heads = c.num_attention_heads;
  s.num_kv_heads = c.num_key_value_heads;
  s.head_dim = c.head_dim;
  s.bias = c.attention_bias;
  s.qk_norm = spec.qk_norm;
  s.rms_norm_eps = c.rms_norm_eps;
  s.norm_type_name = spec.prefix + "RMSNorm";
  return s;
}

// Host vector of a small integer tensor on any device.
std::vector<int64_t> host_ints(const Tensor& t, Stream stream) {
  return (t.device().is_cpu() ? t : t.to(Device::cpu(), stream)).to_int64s();
}

}  // namespace

DecoderLayer::DecoderLayer(const ModelConfig& c, const ArchitectureSpec& spec, int64_t layer_index)
    : Module(spec.prefix + "DecoderLayer") {
  self_attn = register_module(
      "self_attn",
      std::make_shared<nn::Attention>(spec.prefix + "Attention", attention_shape(c, spec)));
  if (spec.sparse_moe && c.moe.is_sparse_layer(layer_index)) {
    nn::MoeShape moe{c.hidden_size,           c.moe.num_experts, c.moe.num_experts_per_tok,
                     c.moe.moe_intermediate_size, c.moe.norm_topk_prob, c.hidden_act,
                     spec.prefix};
    moe_mlp = register_module("mlp", std::make_shared<nn::MoeMLP>(moe));
  } else {
    mlp = register_module(
        "mlp", std::make_shared<nn::MLP>(spec.prefix + "MLP", c.hidden_size, c.intermediate_size,
                                         c.mlp_bias, c.hidden_act));
  }
  input_layernorm = register_module(
      "input_layernorm",
      std::make_shared<nn::RMSNorm>(spec.prefix + "RMSNorm", c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm = register_module(
      "post_attention_layernorm",
      std::make_shared<nn::RMSNorm>(spec.prefix + "RMSNorm", c.hidden_size, c.rms_norm_eps));
}

namespace {
// out = norm(h), after h += delta when `pending`. With the built-in RMSNorm the add and the norm
// are one fused op (one launch and one pass fewer per residual step); a kernelized norm gets the
// two steps separately so its own implementation still runs. Same numbers either way.
void add_then_norm(bool pending, const Tensor& h, const Tensor& delta, const nn::RMSNorm& norm,
                   const Tensor& out, Stream stream) {
  if (!pending) {
    norm.forward(h, out, stream);
  } else if (norm.uses_builtin()) {
    ops::add_rms_norm(h, delta, norm.weight(), static_cast<float>(norm.eps()), out, stream);
  } else {
    ops::add(h, delta, h, 1.0f, stream);
    norm.forward(h, out, stream);
  }
}
}  // namespace

void DecoderLayer::forward(const Tensor& h, const Tensor& normed, const Tensor& delta,
                           bool pending_delta, const nn::AttentionState& state,
                           Stream stream) const {
  add_then_norm(pending_delta, h, delta, *input_layernorm, normed, stream);
  self_attn->forward(normed, delta, state, stream);
  add_then_norm(true, h, delta, *post_attention_layernorm, normed, stream);
  if (moe_mlp)
    moe_mlp->forward(normed, delta, stream);
  else
    mlp->forward(normed, delta, stream);
}

DecoderModel::DecoderModel(const ModelConfig& c, const ArchitectureSpec& spec)
    : Module(spec.prefix + "Model") {
  embed_tokens =
      register_module("embed_tokens", std::make_shared<nn::Embedding>(c.vocab_size, c.hidden_size));
  auto list = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers.push_back(
        list->register_module(std::to_string(i), std::make_shared<DecoderLayer>(c, spec, i)));
  norm = register_module("norm", std::make_shared<nn::RMSNorm>(spec.prefix + "RMSNorm",
                                                               c.hidden_size, c.rms_norm_eps));
  rotary_emb = register_module(
      "rotary_emb",
      std::make_shared<nn::RotaryEmbedding>(spec.prefix + "RotaryEmbedding", c.head_dim, c.rope));
}

DecoderLM::DecoderLM(const ModelConfig& c, const ArchitectureSpec& spec)
    : Module(spec.prefix + "ForCausalLM"), config(c) {
  model = register_module("model", std::make_shared<DecoderModel>(c, spec));
  lm_head =
      register_module("lm_head", std::make_shared<nn::Linear>(c.hidden_size, c.vocab_size, false));
  if (c.tie_word_embeddings)
    lm_head->tie_parameter("weight", {c.vocab_size, c.hidden_size}, "model.embed_tokens.weight");
  loss_function = register_module("loss_function", std::make_shared<nn::CausalLMLoss>());
}

void DecoderLM::set_attn_implementation(const std::string& name) {
  for (const auto& layer : model->layers) layer->self_attn->set_attn_implementation(name);
}

PreparedInputs prepare_inputs(const DecoderLM& lm, const Tensor& input_ids,
                              const ForwardOptions& options) {
  const ModelConfig& config = lm.config;
  const Device device = lm.device;
  Stream stream = options.stream;
  HK_CHECK(
      input_ids.ndim() == 2 && input_ids.size(0) > 0 && input_ids.size(1) > 0,
      "forward: input_ids must be a non-empty [batch, seq] tensor, got " + input_ids.view().str());
  HK_CHECK(
      input_ids.dtype() == DType::I64 || input_ids.dtype() == DType::I32,
      "forward: input_ids must be i32 or i64, got " + std::string(dtype_name(input_ids.dtype())));
  PreparedInputs in;
  const int64_t b = in.batch = input_ids.size(0), s = in.seq = input_ids.size(1);
  KVCache* cache = options.cache;
  const int64_t past = in.past = cache ? cache->length() : 0;
  if (cache) {
    HK_CHECK(cache->batch() == b, "forward: KV cache batch " + std::to_string(cache->batch()) +
                                      " does not match input batch " + std::to_string(b));
    HK_CHECK(cache->num_layers() == config.num_hidden_layers,
             "forward: KV cache has the wrong layer count");
  }
  if (past + s > config.max_position_embeddings)
    throw InvalidArgument(
        "sequence of " + std::to_string(past + s) +
        " positions is longer than the model's context (max_position_embeddings = " +
        std::to_string(config.max_position_embeddings) + ")");

  in.ids = input_ids.device() == device ? input_ids : input_ids.to(device, stream);

  // Left padding -> key_start (i32 on the device) and default positions.
  std::vector<int64_t> pad(static_cast<size_t>(b), 0);
  if (options.key_start.defined()) {
    HK_CHECK(options.key_start.ndim() == 1 && options.key_start.size(0) == b,
             "forward: key_start must be [batch], got " + options.key_start.view().str());
    pad = host_ints(options.key_start, stream);
    in.key_start = Tensor::from_ints(pad, {b}, DType::I32);
    if (!device.is_cpu()) in.key_start = in.key_start.to(device, stream);
  }
  Tensor positions = options.position_ids;
  if (!positions.defined()) {
    std::vector<int64_t> pos(static_cast<size_t>(b * s));
    for (int64_t r = 0; r < b; ++r)
      for (int64_t t = 0; t < s; ++t)
        pos[static_cast<size_t>(r * s + t)] =
            std::max<int64_t>(0, past + t - pad[static_cast<size_t>(r)]);
    positions = Tensor::from_ints(pos, {b, s}, DType::I64);
  } else {
    HK_CHECK(
        positions.ndim() == 2 && positions.size(0) == b && positions.size(1) == s,
        "forward: position_ids must be [batch, seq] like input_ids, got " + positions.view().str());
  }
  lm.model->rotary_emb->tables(positions, device, in.cos, in.sin, stream);

  if (options.labels.defined()) {
    HK_CHECK(
        options.labels.ndim() == 2 && options.labels.size(0) == b && options.labels.size(1) == s,
        "forward: labels must be [batch, seq] like input_ids, got " + options.labels.view().str());
    HK_CHECK(options.labels.dtype() == DType::I64 || options.labels.dtype() == DType::I32,
             "forward: labels must be i32 or i64, got " +
                 std::string(dtype_name(options.labels.dtype())));
    HK_CHECK(options.num_items_in_batch >= 0, "forward: num_items_in_batch must be >= 0, got " +
                                                  std::to_string(options.num_items_in_batch));
    in.labels =
        options.labels.device() == device ? options.labels : options.labels.to(device, stream);
  }
  return in;
}

nn::AttentionState PreparedInputs::attention_state() const {
  nn::AttentionState state;
  state.cos = &cos.view();
  state.sin = &sin.view();
  state.key_start = key_start.defined() ? &key_start.view() : nullptr;
  return state;
}

CausalLMOutput DecoderLM::forward(const Tensor& input_ids, const ForwardOptions& options) const {
  if (is_training() && options.labels.defined()) return forward_train(input_ids, options);
  Stream stream = options.stream;
  const PreparedInputs in = prepare_inputs(*this, input_ids, options);
  const int64_t b = in.batch, s = in.seq;
  KVCache* cache = options.cache;

  Tensor h = Tensor::empty({b, s, config.hidden_size}, dtype, device, stream);
  model->embed_tokens->forward(in.ids, h, stream);
  nn::AttentionState state = in.attention_state();
  state.cache = cache;
  Tensor scratch_normed = Tensor::empty(h.sizes(), dtype, device, stream);
  Tensor scratch_delta = Tensor::empty(h.sizes(), dtype, device, stream);
  for (size_t i = 0; i < model->layers.size(); ++i) {
    state.layer_index = static_cast<int64_t>(i);
    model->layers[i]->forward(h, scratch_normed, scratch_delta, /*pending_delta=*/i > 0, state,
                              stream);
  }
  if (!model->layers.empty()) ops::add(h, scratch_delta, h, 1.0f, stream);  // the last MLP output
  if (cache) cache->advance(s);

  const int64_t keep = options.logits_to_keep > 0 ? std::min(options.logits_to_keep, s) : s;
  Tensor last = keep == s ? h : h.slice(1, s - keep, s).contiguous(stream);
  Tensor normed = Tensor::empty(last.sizes(), dtype, device, stream);
  model->norm->forward(last, normed, stream);
  CausalLMOutput out;
  out.logits = Tensor::empty({b, keep, config.vocab_size}, dtype, device, stream);
  lm_head->forward(normed, out.logits, stream);

  if (in.labels.defined()) {
    HK_CHECK(keep == s, "forward: labels need logits for every position (logits_to_keep = 0)");
    Tensor loss = Tensor::empty({1}, nn::statistics_dtype(dtype), device, stream);
    loss_function->forward(out.logits, in.labels, loss, {options.num_items_in_batch}, stream);
    out.loss = Loss(loss);
  }
  return out;
}

}  // namespace hk
