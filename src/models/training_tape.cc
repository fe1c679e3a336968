// The training forward of the decoder LM, the tape it records, its backward walk, and Loss.
//
// Forward (model.train(), labels given): embeddings → decoder layers (each a tape step with the
// layer's input and context) → final norm → lm_head + ForCausalLMLoss, or a fused linear
// cross-entropy that takes the normed hidden states and lm_head.weight (then no logits exist).
// Backward seeds d(loss) = 1 and runs each step's backward in reverse; the residual adds are in
// DecoderLayer::backward. Each step's tensors go back to the allocator right after its backward,
// so memory falls while backward runs. Gradients accumulate into Parameter::grad (ties followed).
#include "training_tape.h"

#include <set>

#include "hk/attention_functions.h"
#include "hk/error.h"
#include "hk/ops.h"

namespace hk {
namespace {

// Refuses, before anything runs, a model with a layer whose implementation cannot train.
void check_trainable(DecoderLM& lm) {
  for (auto& [path, module] : lm.named_modules()) {
    auto impl = module->impl();
    if (impl && !impl->supports_training())
      throw Unsupported("cannot run a training forward: layer " + path + " (" +
                        module->layer_interface() + ") is bound to '" + impl->name() +
                        "', which has no backward; kernelize the model with Mode::Training "
                        "(model.train() does for a kernelized model) or use the built-in layer");
    if (auto* attn = dynamic_cast<nn::Attention*>(module);
        attn && attn->uses_builtin() && !nn::attention_training(attn->attn_implementation())) {
      std::string names;
      for (const std::string& n : nn::attention_training_names())
        names += (names.empty() ? "" : ", ") + n;
      throw Unsupported("cannot run a training forward: layer " + path +
                        " uses attention implementation '" + attn->attn_implementation() +
                        "', which has no training form (no backward); attention implementations "
                        "that can train: " +
                        names);
    }
  }
}

}  // namespace

// ---- the decoder layer
// ---------------------------------------------------------------------------

Tensor DecoderLayer::forward_train(const Tensor& h, const nn::AttentionState& state,
                                   nn::LayerContext& ctx, Stream stream,
                                   Tensor* router_logits) const {
  Tensor normed = Tensor::empty(h.sizes(), h.dtype(), h.device(), stream);
  input_layernorm->forward_train(h, normed, ctx.child("input_layernorm"), stream);
  Tensor delta = Tensor::empty(h.sizes(), h.dtype(), h.device(), stream);
  self_attn->forward_train(normed, delta, state, ctx.child("self_attn"), stream);
  Tensor h_mid = Tensor::empty(h.sizes(), h.dtype(), h.device(), stream);
  ops::add(h, delta, h_mid, 1.0f, stream);
  post_attention_layernorm->forward_train(h_mid, normed, ctx.child("post_attention_layernorm"),
                                          stream);
  if (moe_mlp) {
    Tensor logits = Tensor::empty({h.numel() / h.size(-1), moe_mlp->num_experts()}, h.dtype(),
                                  h.device(), stream);
    moe_mlp->forward_train(normed, delta, logits, ctx.child("mlp"), stream);
    if (router_logits) *router_logits = logits;
  } else {
    mlp->forward_train(normed, delta, ctx.child("mlp"), stream);
  }
  ops::add(h_mid, delta, delta, 1.0f, stream);  // delta becomes h_out
  ctx.save("h_mid", h_mid);
  return delta;
}

void DecoderLayer::backward(const Tensor& h, const nn::AttentionState& state, nn::LayerContext& ctx,
                            const Tensor& dh, Stream stream, const Tensor* drouter_logits) const {
  Tensor normed = Tensor::empty(h.sizes(), h.dtype(), h.device(), stream);
  Tensor dnormed = Tensor::empty(h.sizes(), h.dtype(), h.device(), stream);
  Tensor dres = Tensor::empty(h.sizes(), h.dtype(), h.device(), stream);
  // h_out = h_mid + mlp(norm2(h_mid)); each sub-layer's saved tensors go as soon as it is done.
  {
    const Tensor h_mid = ctx.saved("h_mid");
    post_attention_layernorm->forward(h_mid, normed, stream);
    if (moe_mlp)
      moe_mlp->backward(normed, ctx.child("mlp"), dh, drouter_logits, dnormed, stream);
    else
      mlp->backward(normed, ctx.child("mlp"), dh, dnormed, stream);
    ctx.child("mlp").clear();
    post_attention_layernorm->backward(h_mid, ctx.child("post_attention_layernorm"), dnormed, dres,
                                       stream);
  }
  ctx.release("h_mid");
  ops::add(dh, dres, dh, 1.0f, stream);  // d(h_mid)
  // h_mid = h + attn(norm1(h))
  input_layernorm->forward(h, normed, stream);
  self_attn->backward(normed, state, ctx.child("self_attn"), dh, dnormed, stream);
  ctx.child("self_attn").clear();
  input_layernorm->backward(h, ctx.child("input_layernorm"), dnormed, dres, stream);
  ops::add(dh, dres, dh, 1.0f, stream);  // d(h)
}

// ---- the model's training forward
// ----------------------------------------------------------------

CausalLMOutput DecoderLM::forward_train(const Tensor& input_ids,
                                        const ForwardOptions& options) const {
  HK_CHECK(options.labels.defined(),
           "training forward: labels are required (ForwardOptions::labels); without them the "
           "forward records no tape");
  HK_CHECK(options.cache == nullptr, "training forward: a KV cache cannot be used in training");
  HK_CHECK(options.logits_to_keep == 0 || options.logits_to_keep >= input_ids.size(-1),
           "training forward: labels need logits for every position (logits_to_keep = 0)");
  check_trainable(const_cast<DecoderLM&>(*this));
  Stream stream = options.stream;
  auto tape = std::make_shared<TrainingTape>();
  try {
    tape->model_ = shared_from_this();
  } catch (const std::bad_weak_ptr&) {
    throw InvalidArgument(
        "training forward: the model must be owned by a CausalLM (AutoModelForCausalLM) so the "
        "loss can keep it alive until backward");
  }
  tape->stream_ = stream;
  tape->checkpointing_ = gradient_checkpointing;
  tape->loss_options_.num_items_in_batch = options.num_items_in_batch;
  tape->inputs_ = prepare_inputs(*this, input_ids, options);
  const PreparedInputs& in = tape->inputs_;
  nn::AttentionState state = in.attention_state();

  Tensor h = Tensor::empty({in.batch, in.seq, config.hidden_size}, dtype, device, stream);
  model->embed_tokens->forward_train(in.ids, h, tape->embed_, stream);
  tape->layers_.resize(model->layers.size());
  const bool aux_loss = options.output_router_logits.value_or(config.moe.output_router_logits);
  std::vector<Tensor> router_logits;  // MoE layers, for the load-balancing loss
  std::vector<size_t> moe_layers;
  for (size_t i = 0; i < model->layers.size(); ++i) {
    state.layer_index = static_cast<int64_t>(i);
    TrainingTape::LayerStep& step = tape->layers_[i];
    step.input = h;
    const bool sparse = aux_loss && model->layers[i]->moe_mlp;
    Tensor logits;
    if (gradient_checkpointing) {
      nn::LayerContext discarded;  // re-made by backward
      h = model->layers[i]->forward_train(h, state, discarded, stream, sparse ? &logits : nullptr);
    } else {
      h = model->layers[i]->forward_train(h, state, step.ctx, stream, sparse ? &logits : nullptr);
    }
    if (sparse) {
      router_logits.push_back(logits);
      moe_layers.push_back(i);
    }
  }
  tape->final_hidden_ = h;
  Tensor normed = Tensor::empty(h.sizes(), dtype, device, stream);
  model->norm->forward_train(h, normed, tape->final_norm_, stream);

  CausalLMOutput out;
  Tensor loss = Tensor::empty({1}, nn::statistics_dtype(dtype), device, stream);
  const nn::CausalLMLossImpl& loss_impl = loss_function->typed_impl();
  if (loss_impl.fuses_lm_head()) {
    tape->fused_loss_ = true;
    loss_impl.forward_train_fused(*loss_function, *lm_head, normed, in.labels, loss,
                                  tape->loss_options_, tape->loss_, stream);
  } else {
    out.logits = Tensor::empty({in.batch, in.seq, config.vocab_size}, dtype, device, stream);
    lm_head->forward_train(normed, out.logits, tape->lm_head_, stream);
    loss_impl.forward_train(*loss_function, out.logits, in.labels, loss, tape->loss_options_,
                            tape->loss_, stream);
    tape->logits_ = out.logits;
  }
  if (!router_logits.empty()) {
    // loss += coef · load-balancing loss (Transformers' Qwen3MoeForCausalLM); its gradient on
    // each layer's router logits waits in that layer's step for backward.
    const double coef = config.moe.router_aux_loss_coef;
    std::vector<int64_t> pad;
    if (in.key_start.defined())
      pad = (in.key_start.device().is_cpu() ? in.key_start : in.key_start.to(Device::cpu(), stream))
                .to_int64s();
    nn::LoadBalancingLoss lb = nn::load_balancing_loss(
        router_logits, config.moe.num_experts_per_tok, pad, in.seq, coef, stream);
    for (size_t j = 0; j < moe_layers.size(); ++j)
      tape->layers_[moe_layers[j]].drouter_logits = lb.grads[j];
    out.aux_loss = Tensor::empty({1}, loss.dtype(), device, stream);
    ops::fill(out.aux_loss, lb.value, stream);
    ops::add(loss, out.aux_loss, loss, static_cast<float>(coef), stream);
  }
  out.loss = Loss(loss, std::move(tape));
  return out;
}

// ---- backward --------------------------------------------------------------------------------

namespace {

// Reports the trainable parameters of `module` whose gradient this backward wrote (a tied
// parameter is its target's, reported with the target's owner; a gradient still marked for
// overwrite was not reached and waits for the end).
void report_ready(nn::Module& module, std::set<const nn::Parameter*>& reported,
                  const Loss::GradientsReadyFn& on_ready) {
  std::vector<nn::Parameter*> ready;
  for (auto& [path, p] : module.named_parameters("", /*include_buffers=*/false)) {
    if (!p->tied_to.empty() || !p->requires_grad || !p->grad.defined() || p->grad_overwrite)
      continue;
    if (reported.insert(p).second) ready.push_back(p);
  }
  if (!ready.empty()) on_ready(ready);
}

}  // namespace

void TrainingTape::backward(Stream stream, const Loss::GradientsReadyFn& on_ready) {
  if (consumed_)
    throw InvalidArgument(
        "backward was already called on this loss; the tape of its forward was released then. "
        "Run a new training forward (model.train(), forward with labels) before calling backward "
        "again");
  consumed_ = true;
  // Whatever happens below, the tape's memory is released when backward returns.
  struct Release {
    TrainingTape& tape;
    ~Release() {
      tape.layers_.clear();
      tape.embed_.clear();
      tape.final_norm_.clear();
      tape.lm_head_.clear();
      tape.loss_.clear();
      tape.final_hidden_ = Tensor();
      tape.logits_ = Tensor();
      tape.inputs_ = PreparedInputs();
      tape.model_.reset();
    }
  } release{*this};

  const DecoderLM& lm = *model_;
  const Stream s = stream.handle ? stream : stream_;
  nn::AttentionState state = inputs_.attention_state();
  const Tensor h = final_hidden_;
  Tensor dh = Tensor::empty(h.sizes(), h.dtype(), h.device(), s);
  {
    Tensor normed = Tensor::empty(h.sizes(), h.dtype(), h.device(), s);
    lm.model->norm->forward(h, normed, s);  // recomputed: not kept by the forward
    Tensor dnormed = Tensor::empty(h.sizes(), h.dtype(), h.device(), s);
    const nn::CausalLMLossImpl& loss_impl = lm.loss_function->typed_impl();
    if (fused_loss_) {
      loss_impl.backward_fused(*lm.loss_function, *lm.lm_head, normed, inputs_.labels,
                               loss_options_, loss_, 1.0f, dnormed, s);
    } else {
      // When the caller dropped out.logits, d(logits) overwrites them: one [tokens, vocab] buffer
      // instead of two (the loss backward reads each element before writing it).
      Tensor dlogits = logits_.storage() && logits_.storage().use_count() == 1
                           ? logits_
                           : Tensor::empty(logits_.sizes(), logits_.dtype(), logits_.device(), s);
      loss_impl.backward(*lm.loss_function, logits_, inputs_.labels, loss_options_, loss_, 1.0f,
                         dlogits, s);
      loss_.clear();
      logits_ = Tensor();
      lm.lm_head->backward(normed, lm_head_, dlogits, &dnormed, false, s);
    }
    loss_.clear();
    lm.model->norm->backward(h, final_norm_, dnormed, dh, s);
    final_norm_.clear();
    final_hidden_ = Tensor();
  }
  std::set<const nn::Parameter*> reported;
  if (on_ready) {
    report_ready(*lm.model->norm, reported, on_ready);
    report_ready(*lm.lm_head, reported, on_ready);
  }
  for (size_t i = layers_.size(); i-- > 0;) {
    state.layer_index = static_cast<int64_t>(i);
    LayerStep& step = layers_[i];
    const DecoderLayer& layer = *lm.model->layers[i];
    if (checkpointing_) layer.forward_train(step.input, state, step.ctx, s);  // output dropped
    layer.backward(step.input, state, step.ctx, dh, s,
                   step.drouter_logits.defined() ? &step.drouter_logits : nullptr);
    step.ctx.clear();
    step.input = Tensor();
    step.drouter_logits = Tensor();
    if (on_ready) report_ready(*lm.model->layers[i], reported, on_ready);
  }
  lm.model->embed_tokens->backward(inputs_.ids, embed_, dh, s);
  // Gradients marked for overwrite (CausalLM::zero_grad_lazily) that this backward did not reach
  // (frozen parameters, unused ones) are zero now, as after zero_grad(false).
  for (auto& [path, p] : const_cast<DecoderLM&>(lm).named_parameters("", /*include_buffers=*/false))
    if (p->grad_overwrite) {
      ops::fill(p->grad, 0.0, s);
      p->grad_overwrite = false;
    }
  if (on_ready) report_ready(const_cast<DecoderLM&>(lm), reported, on_ready);
}

size_t TrainingTape::layer_bytes(size_t i) const {
  std::map<const void*, size_t> seen;
  layers_.at(i).ctx.collect_storages(seen);
  const Tensor& input = layers_.at(i).input;
  if (input.defined()) seen.emplace(input.storage().get(), input.storage()->bytes());
  size_t total = 0;
  for (const auto& [p, n] : seen) total += n;
  return total;
}

size_t TrainingTape::total_bytes() const {
  std::map<const void*, size_t> seen;
  auto add = [&](const Tensor& t) {
    if (t.defined() && t.storage()) seen.emplace(t.storage().get(), t.storage()->bytes());
  };
  for (const LayerStep& step : layers_) {
    step.ctx.collect_storages(seen);
    add(step.input);
  }
  for (const nn::LayerContext* c : {&embed_, &final_norm_, &lm_head_, &loss_})
    c->collect_storages(seen);
  add(final_hidden_);
  add(logits_);
  size_t total = 0;
  for (const auto& [p, n] : seen) total += n;
  return total;
}

size_t decoder_layer_tape_bytes(const ModelConfig& c, bool qk_norm, int64_t tokens, DType dtype,
                                size_t attention_state_bytes) {
  const size_t e = dtype_size(dtype), stat = dtype_size(nn::statistics_dtype(dtype));
  const size_t n = static_cast<size_t>(tokens);
  const size_t hq = static_cast<size_t>(c.num_attention_heads * c.head_dim);
  const size_t hkv = static_cast<size_t>(c.num_key_value_heads * c.head_dim);
  size_t bytes = 2 * n * static_cast<size_t>(c.hidden_size) * e;  // h, h_mid
  bytes += 2 * n * stat;                                          // their rstd
  bytes += n * (2 * hq + 2 * hkv) * e;                            // q, attn; k, v
  if (qk_norm)
    bytes += n * static_cast<size_t>(c.num_attention_heads + c.num_key_value_heads) * stat;
  bytes += 2 * n * static_cast<size_t>(c.intermediate_size) * e;  // gate, up
  return bytes + attention_state_bytes;
}

// ---- Loss ------------------------------------------------------------------------------------

Loss::Loss(Tensor value, std::shared_ptr<TrainingTape> tape)
    : Tensor(std::move(value)), tape_(std::move(tape)) {}

void Loss::backward(Stream stream) const {
  if (!defined())
    throw InvalidArgument(
        "backward: there is no loss; pass labels to the forward (ForwardOptions::labels) in "
        "training mode to get one");
  if (!tape_)
    throw InvalidArgument(
        "backward: this loss comes from a forward in eval mode, which records no tape; call "
        "model.train() before the forward whose loss you backpropagate");
  tape_->backward(stream);
}

void Loss::backward(Stream stream, const GradientsReadyFn& on_ready) const {
  if (!defined() || !tape_) backward(stream);  // the errors of the plain form
  tape_->backward(stream, on_ready);
}

bool Loss::has_tape() const {
  return tape_ && !tape_->consumed();
}

}  // namespace hk
