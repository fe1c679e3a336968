// The device decode step (decode_step.h): the plan (which sub-steps run fused kernels, which go
// through layer implementations) made once from the model's bindings, and the launch sequence.
//
// Residual stream: h[2] ping-pong buffers [B, 1, H] plus `delta` (the last attention or MLP output
// not yet added). A fused product whose prologue adds delta reads h[cur] and writes the sum to
// h[1 - cur] (every block reads h[cur], so it cannot be updated in place); the unfused path adds in
// place as the model forward does (ops::add_rms_norm). Either way `cur` names the live residual.
#include "decode_step.h"

#include <algorithm>
#include <cstdlib>

#include "../kernelize/adapters.h"
#include "../models/decoder_lm.h"
#include "hk/error.h"
#include "hk/ops.h"
#ifdef HK_HAVE_CUDA
#include "ops/decode/decode_kernels.h"
#endif
#ifdef HK_HAVE_FLASH_ATTN
#include "flash_attn/flash.h"
#include "flash_attn/from_views.h"
#endif

namespace hk {

#ifndef HK_HAVE_CUDA

struct DecodeStep::Plan {};
DecodeStep::~DecodeStep() = default;
std::unique_ptr<DecodeStep> DecodeStep::plan(const DecoderLM&, KVCache&, DecodeBuffers&, bool,
                                             std::string& why) {
  why = "hk was built without CUDA";
  return nullptr;
}
void DecodeStep::enqueue(Stream) const {}
bool DecodeStep::matches(const DecoderLM&) const {
  return false;
}
std::string DecodeStep::summary(Stream) const {
  return summary_;
}

#else

namespace {

// Built-in attention functions the device step can stand in for: "eager" with the eager op's
// rounding of the probabilities, "sdpa" in the flash form (no rounding).
bool builtin_attention_function(const std::string& name) {
  return name == "eager" || name == "sdpa";
}

// The decode attention kernel: kernels/flash-attn's split-KV decode (device cache lengths,
// bf16/f16, head dim 64/128/256) unless it cannot serve the call, else hk's own (ops/decode: any
// dtype and head dim up to 256). HK_DECODE_ATTENTION=hk asks for hk's, =flash for flash wherever
// it serves (no batch/length choice); anything else (or unset) lets the plan choose.
std::string decode_attention_request() {
  const char* v = std::getenv("HK_DECODE_ATTENTION");
  return v ? std::string(v) : std::string();
}

// HK_DECODE_PERSISTENT: the batch-1 step as one persistent launch where the model fits it — the
// default since the thirty-fourth session (H100, Qwen3-0.6B shape, 16+128: 1,722 tok/s against
// the kernel sequence's 1,376). Unset or "" (Default): the deterministic form, and a refusal is
// noted at batch 1 only; "1" or "deterministic": fixed-point split-K sums (graph replays give the
// ids of eager steps), a refusal noted at any batch; "f32": f32 sums (last bits vary run to run);
// "0": the kernel sequence.
enum class PersistentRequest { Off, Default, Deterministic, F32 };
PersistentRequest persistent_request() {
  const char* v = std::getenv("HK_DECODE_PERSISTENT");
  const std::string s = v ? v : "";
  if (s.empty()) return PersistentRequest::Default;
  if (s == "0") return PersistentRequest::Off;
  if (s == "1" || s == "deterministic") return PersistentRequest::Deterministic;
  if (s == "f32") return PersistentRequest::F32;
  throw InvalidArgument("HK_DECODE_PERSISTENT is '" + s +
                        "'; use 1 (or deterministic), f32, or 0 for the kernel sequence");
}

// HK_DECODE_PERSISTENT_PROFILE=1: the persistent step's profile build, its cycles a phase in the
// session's summary (DecodeStep::summary); "0" or unset: the plain build.
bool persistent_profile() {
  const char* v = std::getenv("HK_DECODE_PERSISTENT_PROFILE");
  const std::string s = v ? v : "";
  if (s.empty() || s == "0") return false;
  if (s == "1") return true;
  throw InvalidArgument("HK_DECODE_PERSISTENT_PROFILE is '" + s + "'; use 1 or 0");
}

// Why the persistent step cannot run this model's step ("" when the model's side fits; the kernel
// then checks shapes and the device): it replaces every layer, so every one must be built-in and
// of the plain form it computes.
std::string persistent_model_refusal(DecoderLM& lm, int64_t batch) {
  if (batch != 1) return "it decodes batch 1 only (batch " + std::to_string(batch) + ")";
  if (lm.dtype != DType::BF16) return std::string("it takes bf16, not ") + dtype_name(lm.dtype);
  const auto& model = *lm.model;
  if (!model.embed_tokens->uses_builtin() || !model.norm->uses_builtin() ||
      !lm.lm_head->uses_builtin() || lm.lm_head->has_bias())
    return "the embedding, final norm or lm_head is not the built-in one";
  const double eps = model.norm->eps();
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const DecoderLayer& layer = *model.layers[i];
    const nn::Attention& at = *layer.self_attn;
    const std::string where = "layer " + std::to_string(i) + ": ";
    if (!layer.mlp) return where + "a sparse MoE block";
    const nn::MLP& mlp = *layer.mlp;
    const bool builtin =
        layer.input_layernorm->uses_builtin() && layer.post_attention_layernorm->uses_builtin() &&
        at.uses_builtin() && at.q_proj->uses_builtin() && at.k_proj->uses_builtin() &&
        at.v_proj->uses_builtin() && at.o_proj->uses_builtin() && at.rotary_fn->uses_builtin() &&
        (!at.q_norm || (at.q_norm->uses_builtin() && at.k_norm->uses_builtin())) &&
        mlp.uses_builtin() && mlp.gate_proj->uses_builtin() && mlp.up_proj->uses_builtin() &&
        mlp.down_proj->uses_builtin() && mlp.act_fn->uses_builtin();
    if (!builtin) return where + "a sub-layer is bound to a kernel";
    if (at.shape().bias || mlp.gate_proj->has_bias() || mlp.up_proj->has_bias() ||
        mlp.down_proj->has_bias())
      return where + "projections with biases";
    if (mlp.act_fn->kind() != ops::Activation::SiLU) return where + "an activation other than SiLU";
    if (at.attn_implementation() != "sdpa")
      return where + "attention '" + at.attn_implementation() +
             "' (it computes the sdpa form; eager rounds the probabilities)";
    if (layer.input_layernorm->eps() != eps || layer.post_attention_layernorm->eps() != eps)
      return where + "norms with different eps";
    if (!nn::weights_adjacent(*at.q_proj, *at.k_proj) ||
        !nn::weights_adjacent(*at.k_proj, *at.v_proj))
      return where + "q/k/v weights not stored adjacently";
    for (const nn::Linear* w : {at.o_proj.get(), mlp.gate_proj.get(), mlp.up_proj.get(),
                                mlp.down_proj.get(), lm.lm_head.get()})
      if (!w->weight().view().is_contiguous()) return where + "a weight is not contiguous";
  }
  return "";
}

struct LayerPlan {
  const DecoderLayer* layer = nullptr;
  bool qkv_gemv = false;     // q/k/v in one gemv
  bool norm1_fused = false;  // input_layernorm as that gemv's prologue
  bool rope_fused = false;   // q/k norm + rotary + cache write in one kernel
  bool o_gemv = false;
  bool mlp_fused = false;  // gate/up (+SwiGLU) and down as gemvs
  bool eager_attention =
      false;                 // attn_implementation "eager": probabilities rounded (ops::attention)
  bool norm2_fused = false;  // post_attention_layernorm as the gate/up prologue
};

}  // namespace

struct DecodeStep::Plan {
  const DecoderLM* lm = nullptr;
  KVCache* cache = nullptr;
  DecodeBuffers* state = nullptr;
  bool greedy = true;
  int64_t b = 0, hidden = 0, hq = 0, hkv = 0, d = 0, inter = 0, vocab = 0, qkv_width = 0;
  DType dtype = DType::F32;
  Tensor h[2], delta, normed, qkv, attn, act, logits, cos, sin, inv_freq;
  Tensor gate_up;  // [b, 1, 2·inter]: gate then up, for one product over adjacent weights
  Tensor attn_workspace, attn_counters, greedy_values, greedy_indices, greedy_counters;
  int attn_splits = 1, greedy_blocks = 1;
  bool flash_attention = false;  // kernels/flash-attn's decode kernel serves the attention
  float rope_theta = 0.0f;
  std::vector<LayerPlan> layers;
  bool head_gemv = false;
  // The whole step in one launch (decode::persistent_step): its parameters, the transposed copies
  // of o_proj's and down_proj's weights it streams, and its workspace.
  bool persistent = false;
  int persistent_request = 0;  // the HK_DECODE_PERSISTENT request planned with (PersistentRequest)
  decode::PersistentStepParams persistent_params;
  std::vector<Tensor> transposed;
  Tensor persistent_workspace;
  // Bindings the plan was made with: every layer module's implementation and the attention
  // function names.
  std::vector<std::pair<const nn::Module*, const nn::LayerImpl*> > impls;
  std::vector<std::string> attention_names;

  decode::GemvParams gemv_params(const Tensor& x, int64_t k) const {
    decode::GemvParams p;
    p.dtype = dtype;
    p.m = b;
    p.k = k;
    p.x = x.view().ptr();
    p.x_stride = x.view().strides[0];
    return p;
  }
  static decode::GemvSegment segment(const nn::Linear& linear, void* out, int64_t out_stride) {
    decode::GemvSegment s;
    s.weight = linear.weight().view().ptr();
    s.bias = linear.bias() ? linear.bias()->view().ptr() : nullptr;
    s.out = out;
    s.out_stride = out_stride;
    s.n = linear.out_features();
    return s;
  }
  // The products of one layer (and lm_head) as the step launches them; plan() checks the same
  // parameters against what the gemv serves.
  decode::GemvParams qkv_product(const nn::Attention& at) const {
    decode::GemvParams g = gemv_params(normed, hidden);
    g.segments[0] = segment(*at.q_proj, qkv_at(0), qkv_width);
    g.segments[1] = segment(*at.k_proj, qkv_at(hq * d), qkv_width);
    g.segments[2] = segment(*at.v_proj, qkv_at((hq + hkv) * d), qkv_width);
    g.num_segments = 3;
    return g;
  }
  decode::GemvParams o_product(const nn::Attention& at) const {
    decode::GemvParams g = gemv_params(attn, hq * d);
    g.segments[0] = segment(*at.o_proj, delta.view().ptr(), hidden);
    g.num_segments = 1;
    return g;
  }
  decode::GemvParams gate_up_product(const nn::MLP& mlp) const {
    decode::GemvParams g = gemv_params(normed, hidden);
    g.segments[0] = segment(*mlp.gate_proj, act.view().ptr(), inter);
    g.segments[1] = segment(*mlp.up_proj, act.view().ptr(), inter);
    g.num_segments = 2;
    g.epilogue = decode::GemvEpilogue::SiluMul;
    return g;
  }
  decode::GemvParams down_product(const nn::MLP& mlp) const {
    decode::GemvParams g = gemv_params(act, inter);
    g.segments[0] = segment(*mlp.down_proj, delta.view().ptr(), hidden);
    g.num_segments = 1;
    return g;
  }
  decode::GemvParams head_product() const {
    decode::GemvParams g = gemv_params(normed, hidden);
    g.segments[0] = segment(*lm->lm_head, logits.view().ptr(), vocab);
    g.num_segments = 1;
    return g;
  }
  void add_prologue(decode::GemvParams& p, const nn::RMSNorm& norm, int cur, bool pending) const {
    p.has_prologue = true;
    p.prologue.residual = h[cur].view().ptr();
    p.prologue.residual_stride = hidden;
    p.prologue.delta = pending ? delta.view().ptr() : nullptr;
    p.prologue.delta_stride = hidden;
    p.prologue.residual_out = pending ? h[1 - cur].view().ptr() : nullptr;
    p.prologue.residual_out_stride = hidden;
    p.prologue.norm_weight = norm.weight().view().ptr();
    p.prologue.eps = static_cast<float>(norm.eps());
  }
#ifdef HK_HAVE_FLASH_ATTN
  // The flash decode call of layer `i`: q from qkv, the whole cache with device lengths + 1.
  hk_flash::Params flash_params(int64_t i, const DecodeBuffers& st) const {
    const Tensor q = qkv.slice(2, 0, hq * d).reshape({b, 1, hq, d});
    const Tensor out = attn.reshape({b, 1, hq, d});
    hk_flash::CallOptions o;
    o.scale = lm->model->layers[static_cast<size_t>(i)]->self_attn->scaling();
    o.causal = true;
    o.key_start = &st.key_start.view();
    hk_flash::Params fp =
        hk_flash::forward_params(q, cache->keys(i), cache->values(i), out, nullptr, o);
    fp.seqlens_k = st.lengths.data_as<int32_t>();
    fp.seqlens_k_add = 1;
    // the lengths advance in the previous step's greedy kernel and the old rows were written by
    // earlier steps; the kernel ahead of the attention (q/k norm + rotary) writes q and the new row
    fp.cache_settled = true;
    return fp;
  }
#endif
  char* qkv_at(int64_t col) const {
    return static_cast<char*>(qkv.view().ptr()) + col * static_cast<int64_t>(dtype_size(dtype));
  }
  Tensor qkv_cols(int64_t from, int64_t to) const {
    return qkv.slice(2, from, to);
  }

  // Plans the one-launch step (decode::persistent_step) and prepares its workspace: "" when it
  // will run, else why not.
  std::string plan_persistent(DecoderLM& lm, bool deterministic, float* logits_f32_out) {
    if (std::string why = persistent_model_refusal(lm, b); !why.empty()) return why;
    decode::PersistentStepParams& pp = persistent_params;
    pp.hidden = hidden, pp.heads_q = hq, pp.heads_kv = hkv, pp.head_dim = d;
    pp.inter = inter, pp.vocab = vocab, pp.capacity = cache->max_length();
    pp.embed = lm.model->embed_tokens->weight().view().ptr();
    pp.lm_head = lm.lm_head->weight().view().ptr();
    pp.final_norm = lm.model->norm->weight().view().ptr();
    pp.eps = static_cast<float>(lm.model->norm->eps());
    pp.scale = lm.model->layers[0]->self_attn->scaling();
    pp.inv_freq = inv_freq.data_as<float>();
    pp.rope_theta = rope_theta;
    pp.deterministic = deterministic;
    pp.profile = persistent_profile();
    for (size_t i = 0; i < lm.model->layers.size(); ++i) {
      const DecoderLayer& layer = *lm.model->layers[i];
      const nn::Attention& at = *layer.self_attn;
      decode::PersistentLayer w;
      w.qkv = at.q_proj->weight().view().ptr();
      w.gate = layer.mlp->gate_proj->weight().view().ptr();
      w.up = layer.mlp->up_proj->weight().view().ptr();
      w.input_norm = layer.input_layernorm->weight().view().ptr();
      w.post_norm = layer.post_attention_layernorm->weight().view().ptr();
      if (at.q_norm) {
        w.q_norm = at.q_norm->weight().view().ptr();
        w.k_norm = at.k_norm->weight().view().ptr();
        pp.qk_eps = static_cast<float>(at.q_norm->eps());
      }
      w.k_cache = cache->keys(static_cast<int64_t>(i)).view().ptr();
      w.v_cache = cache->values(static_cast<int64_t>(i)).view().ptr();
      // (16-byte aligned stand-ins for the transposed weights while the shapes are checked)
      w.o_t = w.down_t = w.qkv;
      pp.layers.push_back(w);
    }
    pp.tokens = state->tokens.data_as<int64_t>();
    pp.positions = state->positions.data_as<int32_t>();
    pp.lengths = state->lengths.data_as<int32_t>();
    pp.key_start = state->key_start.data_as<int32_t>();
    pp.done = state->done.data_as<int32_t>();
    pp.eos = state->eos.data_as<int64_t>();
    pp.num_eos = state->num_eos;
    pp.pad_id = state->pad_id;
    pp.logits_f32 = logits_f32_out;
    if (std::string why = decode::persistent_step_unsupported(pp); !why.empty()) return why;
    // o_proj and down are split over the blocks by their inputs: their rows are the weights'
    // columns, so the step streams transposed copies (the plan's; the layers keep theirs)
    for (size_t i = 0; i < lm.model->layers.size(); ++i) {
      const DecoderLayer& layer = *lm.model->layers[i];
      transposed.push_back(layer.self_attn->o_proj->weight().transpose(0, 1).contiguous());
      pp.layers[i].o_t = transposed.back().view().ptr();
      transposed.push_back(layer.mlp->down_proj->weight().transpose(0, 1).contiguous());
      pp.layers[i].down_t = transposed.back().view().ptr();
    }
    persistent_workspace = Tensor::empty(
        {static_cast<int64_t>(decode::persistent_step_workspace_bytes(pp))}, DType::U8, lm.device);
    pp.workspace = persistent_workspace.view().ptr();
    decode::persistent_step_prepare(pp, Stream{});
    persistent = true;
    return "";
  }

  // normed = norm(h[cur] (+= delta when pending)), the unfused residual step.
  void residual_norm(const nn::RMSNorm& norm, int cur, bool& pending, Stream stream) const {
    if (!pending)
      norm.forward(h[cur], normed, stream);
    else if (norm.uses_builtin())
      ops::add_rms_norm(h[cur], delta, norm.weight(), static_cast<float>(norm.eps()), normed,
                        stream);
    else {
      ops::add(h[cur], delta, h[cur], 1.0f, stream);
      norm.forward(h[cur], normed, stream);
    }
    pending = false;
  }
};

DecodeStep::~DecodeStep() = default;

namespace {

bool gemv_ok(const decode::GemvParams& p) {
  return p.m <= decode::gemv_preferred_max_rows() && decode::gemv_unsupported(p).empty();
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : "; ") + s;
  return out;
}

}  // namespace

std::unique_ptr<DecodeStep> DecodeStep::plan(const DecoderLM& lm_const, KVCache& cache,
                                             DecodeBuffers& state, bool greedy, std::string& why) {
  DecoderLM& lm =
      const_cast<DecoderLM&>(lm_const);  // named_modules() is not const; nothing changes
  const ModelConfig& c = lm.config;
  if (!lm.device.is_cuda()) {
    why = "the model is on " + lm.device.str();
    return nullptr;
  }
  auto step = std::unique_ptr<DecodeStep>(new DecodeStep());
  step->plan_ = std::make_unique<Plan>();
  Plan& p = *step->plan_;
  p.lm = &lm;
  p.cache = &cache;
  p.state = &state;
  p.greedy = greedy;
  p.b = cache.batch();
  p.hidden = c.hidden_size;
  p.hq = c.num_attention_heads;
  p.hkv = c.num_key_value_heads;
  p.d = c.head_dim;
  p.inter = c.intermediate_size;
  p.vocab = c.vocab_size;
  p.qkv_width = (p.hq + 2 * p.hkv) * p.d;
  p.dtype = lm.dtype;
  const Device dev = lm.device;

  // Everything the step cannot do on device makes the plan fail (generate then runs the model
  // forward per token); kernels bound to layers only make it uncapturable when they do not say
  // they are capture-safe.
  std::vector<std::string> refusals;
  for (auto& [path, module] : lm.named_modules()) {
    if (module->layer_interface().empty()) continue;
    auto impl = module->impl();
    p.impls.emplace_back(module, impl.get());
    if (module->layer_interface() == "ForCausalLMLoss") continue;  // not used by decode
    if (impl && impl->name() == "builtin") {
      // The built-in MoE block routes on the host (a device-to-host copy and a sync per call).
      if (module->layer_interface() == "MoeMLP")
        refusals.push_back(path +
                           " runs the built-in MoE block, which routes on the host; bind "
                           "kernels-community/megablocks (capture-safe) to capture it");
      continue;
    }
    if (impl && kernel_binding::declares_capture(*impl)) continue;
    refusals.push_back(path + " runs " + (impl ? impl->name() : std::string("nothing")) +
                       ", which does not declare CUDA-graph capture safety (kernelize with "
                       "Mode::Inference | Mode::Capture falls back from it)");
  }
  for (const auto& layer : lm.model->layers) {
    const nn::Attention& attn = *layer->self_attn;
    p.attention_names.push_back(attn.attn_implementation());
    if (!attn.uses_builtin()) {
      why = "attention is bound to " + attn.impl()->name() +
            ", which has no KV-cache decode form with device lengths";
      return nullptr;
    }
    if (!builtin_attention_function(attn.attn_implementation())) {
      why = "attention implementation '" + attn.attn_implementation() +
            "' has no KV-cache decode form with device lengths (the built-in eager and sdpa do)";
      return nullptr;
    }
    if (attn.shape().qk_norm != static_cast<bool>(attn.q_norm)) {
      why = "attention q/k norm layout not understood";
      return nullptr;
    }
  }
  const auto& rope = lm.model->rotary_emb->rope();
  if (rope.rope_type == "default") {
    p.rope_theta = static_cast<float>(rope.rope_theta);
  }
  {
    const auto& inv = lm.model->rotary_emb->inv_freq();
    std::vector<float> host(inv.begin(), inv.end());
    p.inv_freq = Tensor::from_floats(host, {static_cast<int64_t>(host.size())}).to(dev);
  }

  const int64_t b = p.b;
  const DType dt = p.dtype;
  p.h[0] = Tensor::empty({b, 1, p.hidden}, dt, dev);
  p.h[1] = Tensor::empty({b, 1, p.hidden}, dt, dev);
  p.delta = Tensor::empty({b, 1, p.hidden}, dt, dev);
  p.normed = Tensor::empty({b, 1, p.hidden}, dt, dev);
  p.qkv = Tensor::empty({b, 1, p.qkv_width}, dt, dev);
  p.attn = Tensor::empty({b, 1, p.hq * p.d}, dt, dev);
  p.act = Tensor::empty({b, 1, p.inter}, dt, dev);
  p.gate_up = Tensor::empty({b, 1, 2 * p.inter}, dt, dev);
  p.logits = Tensor::empty({b, 1, p.vocab}, dt, dev);
  p.cos = Tensor::empty({b, 1, p.d}, DType::F32, dev);
  p.sin = Tensor::empty({b, 1, p.d}, DType::F32, dev);
  if (!greedy) step->logits_f32_ = Tensor::empty({b, p.vocab}, DType::F32, dev);

  decode::DecodeAttentionParams ap;
  ap.dtype = dt;
  ap.batch = b;
  ap.heads_q = p.hq;
  ap.heads_kv = p.hkv;
  ap.head_dim = p.d;
  ap.q = p.qkv.view().ptr();
  ap.q_batch_stride = p.qkv_width;
  ap.k_cache = cache.keys(0).view().ptr();
  ap.v_cache = cache.values(0).view().ptr();
  ap.cache_batch_stride = cache.keys(0).view().strides[0];
  ap.cache_row_stride = cache.keys(0).view().strides[1];
  ap.out = p.attn.view().ptr();
  ap.out_batch_stride = p.hq * p.d;
  if (std::string w = decode::attention_unsupported(ap); !w.empty()) {
    why = "decode attention: " + w;
    return nullptr;
  }
  bool short_cache_unsplit = false;  // hk's kernel chosen over flash for a short cache
#ifdef HK_HAVE_FLASH_ATTN
  // flash semantics: for sdpa only ("eager" rounds the probabilities, which flash does not)
  const bool all_sdpa = std::all_of(p.attention_names.begin(), p.attention_names.end(),
                                    [](const std::string& n) { return n == "sdpa"; });
  const std::string attention_request = decode_attention_request();
  if (all_sdpa && attention_request != "hk" && (dt == DType::BF16 || dt == DType::F16)) {
    try {
      p.flash_attention = hk_flash::unsupported_reason(p.flash_params(0, state)).empty();
    } catch (const std::exception&) {
      p.flash_attention = false;
    }
    // Short caches: hk's decode kernel unsplit (one block per row and kv head, its online softmax
    // a step per 32 scores) beats the flash split-KV decode at every batch measured on the H200
    // over 81 keys of a 256-row cache (hk_bench_decode_chain, µs a layer: batch 1 4.3 against
    // 5.7, batch 8 5.1 against 6.4, batch 32 7.9 against 10.3; batch 64 10.4 against 17.7 measured
    // before), and key splits only cost there (batch 1: 6.9 µs at 2 splits, 9.2 at 8; batch 32: 9.9
    // at 2). Up to 512 rows with 32+ rows, where a block's keys stay few against the blocks in
    // flight; at 2048+128 flash stays far ahead (72.6% against 27.9% of the limit at batch 64).
    if (p.flash_attention && attention_request != "flash" &&
        cache.max_length() <= (b >= 32 ? 512 : 256)) {
      p.flash_attention = false;
      short_cache_unsplit = true;
    }
  }
#endif
  p.attn_splits = short_cache_unsplit ? 1 : decode::attention_splits(b, p.hkv, cache.max_length());
  if (p.attn_splits > 1) {
    p.attn_workspace = Tensor::empty(
        {static_cast<int64_t>(decode::attention_workspace_floats(b, p.hq, p.d, p.attn_splits))},
        DType::F32, dev);
    p.attn_counters = Tensor::zeros({b * p.hkv}, DType::I32, dev);
  }
  if (greedy) {
    p.greedy_blocks = decode::greedy_blocks_per_row(b, p.vocab);
    if (p.greedy_blocks > 1) {
      p.greedy_values = Tensor::empty({b * p.greedy_blocks}, DType::F32, dev);
      p.greedy_indices = Tensor::empty({b * p.greedy_blocks}, DType::I32, dev);
      p.greedy_counters = Tensor::zeros({b}, DType::I32, dev);
    }
  }

  // The whole step in one launch, where asked for and the model, cache and device fit it.
  const PersistentRequest request = persistent_request();
  p.persistent_request = static_cast<int>(request);
  // unasked (Default), a batch the step never serves is not worth a note
  const bool quiet = request == PersistentRequest::Default && b != 1;
  const std::string persistent_note =
      request == PersistentRequest::Off || quiet
          ? ""
          : p.plan_persistent(lm, request != PersistentRequest::F32,
                              greedy ? nullptr : step->logits_f32_.data_as<float>());

  // Per-layer choices. Fused products need the built-in implementations of every layer they
  // replace and shapes the gemv serves (16-bit or f32 weights, M ≤ 16, aligned rows).
  int fused_norms = 0, fused_qkv = 0, fused_rope = 0, fused_o = 0, fused_mlp = 0;
  for (const auto& layer : lm.model->layers) {
    LayerPlan lp;
    lp.layer = layer.get();
    const nn::Attention& at = *layer->self_attn;
    {
      decode::GemvParams g = p.qkv_product(at);
      lp.qkv_gemv = at.q_proj->uses_builtin() && at.k_proj->uses_builtin() &&
                    at.v_proj->uses_builtin() && gemv_ok(g);
      if (lp.qkv_gemv && layer->input_layernorm->uses_builtin()) {
        p.add_prologue(g, *layer->input_layernorm, 0, true);
        lp.norm1_fused = gemv_ok(g);
      }
    }
    lp.eager_attention = at.attn_implementation() == "eager";
    lp.rope_fused = at.rotary_fn->uses_builtin() &&
                    (!at.q_norm || (at.q_norm->uses_builtin() && at.k_norm->uses_builtin()));
    {
      decode::GemvParams g = p.o_product(at);
      lp.o_gemv = at.o_proj->uses_builtin() && gemv_ok(g);
    }
    if (!layer->mlp) {
      lp.mlp_fused = false;  // a sparse MoE block (layer->moe_mlp): its own forward
    } else {
      const nn::MLP& mlp = *layer->mlp;
      decode::GemvParams g = p.gate_up_product(mlp);
      decode::GemvParams down = p.down_product(mlp);
      lp.mlp_fused = mlp.uses_builtin() && mlp.gate_proj->uses_builtin() &&
                     mlp.up_proj->uses_builtin() && mlp.down_proj->uses_builtin() &&
                     mlp.act_fn->uses_builtin() && mlp.act_fn->kind() == ops::Activation::SiLU &&
                     gemv_ok(g) && gemv_ok(down);
      if (lp.mlp_fused && layer->post_attention_layernorm->uses_builtin()) {
        p.add_prologue(g, *layer->post_attention_layernorm, 0, true);
        lp.norm2_fused = gemv_ok(g);
      }
    }
    fused_norms += lp.norm1_fused + lp.norm2_fused;
    fused_qkv += lp.qkv_gemv;
    fused_rope += lp.rope_fused;
    fused_o += lp.o_gemv;
    fused_mlp += lp.mlp_fused;
    p.layers.push_back(lp);
  }
  {
    decode::GemvParams g = p.head_product();
    p.head_gemv = lm.lm_head->uses_builtin() && gemv_ok(g);
    // The final norm stays a kernel of its own: lm_head's thousands of blocks would each
    // recompute it as a prologue (the layers' products have a few hundred, where it pays).
  }
  const int64_t n = static_cast<int64_t>(p.layers.size());
  auto of = [&](int k) { return std::to_string(k) + "/" + std::to_string(n); };
  step->summary_ = "device decode step, batch " + std::to_string(b) + ", cache " +
                   std::to_string(cache.max_length()) + ": fused q/k/v gemv " + of(fused_qkv) +
                   ", rmsnorm prologues " + std::to_string(fused_norms) + "/" +
                   std::to_string(2 * n) + ", q/k norm+rope+cache " + of(fused_rope) +
                   ", o_proj gemv " + of(fused_o) + ", gate/up+SwiGLU+down gemv " + of(fused_mlp) +
                   ", lm_head gemv " + (p.head_gemv ? "yes" : "no") +
                   (p.flash_attention ? ", attention flash-attn decode"
                    : p.layers[0].eager_attention
                        ? ", attention hk decode (eager)"
                        : ", attention hk decode, splits " + std::to_string(p.attn_splits)) +
                   (decode::pdl_enabled() ? ", PDL" : ", no PDL");
  if (p.persistent)
    step->summary_ = "device decode step, batch 1, cache " + std::to_string(cache.max_length()) +
                     ": one persistent launch (" +
                     (p.persistent_params.deterministic ? "deterministic" : "f32") +
                     " split-K sums; HK_DECODE_PERSISTENT)";
  else if (!persistent_note.empty())
    step->summary_ += "; persistent step not used: " + persistent_note;
  step->capture_refusal_ = join(refusals);
  return step;
}

bool DecodeStep::matches(const DecoderLM& lm_const) const {
  DecoderLM& lm = const_cast<DecoderLM&>(lm_const);
  const Plan& p = *plan_;
  if (p.lm != &lm) return false;
  size_t i = 0;
  for (auto& [path, module] : lm.named_modules()) {
    if (module->layer_interface().empty()) continue;
    if (i >= p.impls.size() || p.impls[i].first != module ||
        p.impls[i].second != module->impl().get())
      return false;
    ++i;
  }
  if (i != p.impls.size()) return false;
  // a session planned before HK_DECODE_PERSISTENT changed is planned again
  if (static_cast<int>(persistent_request()) != p.persistent_request) return false;
  if (p.persistent && p.persistent_params.profile != persistent_profile()) return false;
  for (size_t l = 0; l < lm.model->layers.size(); ++l)
    if (lm.model->layers[l]->self_attn->attn_implementation() != p.attention_names[l]) return false;
  return true;
}

std::string DecodeStep::summary(Stream stream) const {
  if (!plan_->persistent || !plan_->persistent_params.profile) return summary_;
  const std::string profile = decode::persistent_step_profile(plan_->persistent_params, stream);
  return profile.empty() ? summary_ : summary_ + "; " + profile;
}

void DecodeStep::enqueue(Stream stream) const {
  const Plan& p = *plan_;
  const DecoderLM& lm = *p.lm;
  const DecodeBuffers& st = *p.state;
  KVCache& cache = *p.cache;
  const int64_t b = p.b, d = p.d, hq = p.hq, hkv = p.hkv;
  int cur = 0;
  bool pending = false;

  if (p.persistent) {
    decode::persistent_step(p.persistent_params, stream);
    return;
  }
  lm.model->embed_tokens->forward(st.tokens.reshape({b, 1}), p.h[cur], stream);
  for (size_t i = 0; i < p.layers.size(); ++i) {
    const LayerPlan& lp = p.layers[i];
    const DecoderLayer& layer = *lp.layer;
    const nn::Attention& at = *layer.self_attn;

    // input norm + q/k/v
    if (lp.qkv_gemv) {
      decode::GemvParams g = p.qkv_product(at);
      if (lp.norm1_fused) {
        p.add_prologue(g, *layer.input_layernorm, cur, pending);
        if (pending) cur = 1 - cur;
        pending = false;
      } else {
        p.residual_norm(*layer.input_layernorm, cur, pending, stream);
      }
      decode::gemv(g, stream);
    } else {
      p.residual_norm(*layer.input_layernorm, cur, pending, stream);
      if (at.q_proj->uses_builtin() && at.k_proj->uses_builtin() && at.v_proj->uses_builtin()) {
        // Into the columns of qkv: one product when the loader stored the three weights
        // adjacently (nn::forward_linears), else one each.
        nn::forward_linears(p.normed,
                            {{at.q_proj.get(), p.qkv_cols(0, hq * d), "q_proj"},
                             {at.k_proj.get(), p.qkv_cols(hq * d, (hq + hkv) * d), "k_proj"},
                             {at.v_proj.get(), p.qkv_cols((hq + hkv) * d, p.qkv_width), "v_proj"}},
                            stream);
      } else {
        // Built-in linears write the strided columns of qkv directly; a kernel gets a dense output.
        auto project = [&](const nn::Linear& proj, int64_t from, int64_t to) {
          const Tensor cols = p.qkv_cols(from, to);
          if (proj.uses_builtin()) {
            proj.forward(p.normed, cols, stream);
            return;
          }
          Tensor dense = Tensor::empty(cols.sizes(), p.dtype, cols.device(), stream);
          proj.forward(p.normed, dense, stream);
          cols.copy_from(dense, stream);
        };
        project(*at.q_proj, 0, hq * d);
        project(*at.k_proj, hq * d, (hq + hkv) * d);
        project(*at.v_proj, (hq + hkv) * d, p.qkv_width);
      }
    }

    // q/k norm + rotary + cache write
    decode::QkRopeCacheParams r;
    r.dtype = p.dtype;
    r.batch = b;
    r.heads_q = hq;
    r.heads_kv = hkv;
    r.head_dim = d;
    r.qkv = p.qkv.view().ptr();
    r.qkv_stride = p.qkv_width;
    r.positions = st.positions.data_as<int32_t>();
    r.inv_freq = p.inv_freq.data_as<float>();
    r.rope_theta = p.rope_theta;
    r.cache_index = st.lengths.data_as<int32_t>();
    const Tensor& kc = cache.keys(static_cast<int64_t>(i));
    const Tensor& vc = cache.values(static_cast<int64_t>(i));
    r.k_cache = kc.view().ptr();
    r.v_cache = vc.view().ptr();
    r.cache_batch_stride = kc.view().strides[0];
    r.cache_row_stride = kc.view().strides[1];
    r.capacity = cache.max_length();
    if (lp.rope_fused) {
      if (at.q_norm) {
        r.q_norm_weight = at.q_norm->weight().view().ptr();
        r.k_norm_weight = at.k_norm->weight().view().ptr();
        r.eps = static_cast<float>(at.q_norm->eps());
      }
    } else {
      // Layer implementations get dense q and k (kernels may refuse strided rows), as in the
      // model forward; the results go back into qkv for the attention and the cache write.
      const Tensor q_cols = p.qkv_cols(0, hq * d), k_cols = p.qkv_cols(hq * d, (hq + hkv) * d);
      Tensor q = Tensor::empty({b, 1, hq, d}, p.dtype, q_cols.device(), stream);
      Tensor k = Tensor::empty({b, 1, hkv, d}, p.dtype, k_cols.device(), stream);
      q.reshape({b, 1, hq * d}).copy_from(q_cols, stream);
      k.reshape({b, 1, hkv * d}).copy_from(k_cols, stream);
      if (at.q_norm) {
        at.q_norm->forward(q, q, stream);
        at.k_norm->forward(k, k, stream);
      }
      decode::rope_tables(st.positions.data_as<int32_t>(), b, d, p.inv_freq.data_as<float>(),
                          p.rope_theta, 1.0f, p.cos.data_as<float>(), p.sin.data_as<float>(),
                          stream);
      at.rotary_fn->forward(q, k, p.cos, p.sin, stream);
      q_cols.copy_from(q.reshape({b, 1, hq * d}), stream);
      k_cols.copy_from(k.reshape({b, 1, hkv * d}), stream);
      r.process_q = false;
      r.rotate = false;
    }
    decode::qk_rope_cache(r, stream);

    // attention over the cache
    decode::DecodeAttentionParams ap;
    ap.dtype = p.dtype;
    ap.batch = b;
    ap.heads_q = hq;
    ap.heads_kv = hkv;
    ap.head_dim = d;
    ap.q = p.qkv.view().ptr();
    ap.q_batch_stride = p.qkv_width;
    ap.k_cache = kc.view().ptr();
    ap.v_cache = vc.view().ptr();
    ap.cache_batch_stride = kc.view().strides[0];
    ap.cache_row_stride = kc.view().strides[1];
    ap.lengths = st.lengths.data_as<int32_t>();
    ap.length_add = 1;
    ap.key_start = st.key_start.data_as<int32_t>();
    ap.out = p.attn.view().ptr();
    ap.out_batch_stride = hq * d;
    ap.scale = at.scaling();
    ap.eager = lp.eager_attention;
    ap.splits = p.attn_splits;
    if (p.attn_splits > 1) {
      ap.workspace = p.attn_workspace.data_as<float>();
      ap.counters = p.attn_counters.data_as<int32_t>();
    }
#ifdef HK_HAVE_FLASH_ATTN
    if (p.flash_attention)
      hk_flash::forward(p.flash_params(static_cast<int64_t>(i), st),
                        static_cast<hk_flash::Stream>(stream.handle));
    else
      decode::attention(ap, stream);
#else
    decode::attention(ap, stream);
#endif

    // o_proj → delta
    if (lp.o_gemv) {
      decode::GemvParams g = p.o_product(at);
      decode::gemv(g, stream);
    } else {
      at.o_proj->forward(p.attn, p.delta, stream);
    }
    pending = true;

    // post-attention norm + MLP (or the MoE block) → delta
    if (lp.mlp_fused) {
      const nn::MLP& mlp = *layer.mlp;
      decode::GemvParams g = p.gate_up_product(mlp);
      if (lp.norm2_fused) {
        p.add_prologue(g, *layer.post_attention_layernorm, cur, pending);
        cur = 1 - cur;
        pending = false;
      } else {
        p.residual_norm(*layer.post_attention_layernorm, cur, pending, stream);
      }
      decode::gemv(g, stream);
      decode::GemvParams down = p.down_product(mlp);
      decode::gemv(down, stream);
    } else {
      p.residual_norm(*layer.post_attention_layernorm, cur, pending, stream);
      if (layer.moe_mlp) {
        layer.moe_mlp->forward(p.normed, p.delta, stream);
      } else if (const nn::MLP& mlp = *layer.mlp;
                 mlp.uses_builtin() && mlp.gate_proj->uses_builtin() &&
                 mlp.up_proj->uses_builtin() && mlp.act_fn->uses_builtin() &&
                 mlp.intermediate_size() == p.inter) {
        // The built-in MLP's ops with gate and up as the two halves of one buffer (strided
        // views, so built-in children only), so weights the loader stored adjacently make one
        // product.
        mlp.builtin_forward(p.normed, p.gate_up.slice(2, 0, p.inter),
                            p.gate_up.slice(2, p.inter, 2 * p.inter), p.act, p.delta, stream);
      } else {
        layer.mlp->forward(p.normed, p.delta, stream);
      }
    }
    pending = true;
  }

  // final norm + lm_head
  const Tensor logits2 = p.logits.reshape({b, p.vocab});
  if (p.head_gemv) {
    decode::GemvParams g = p.head_product();
    p.residual_norm(*lm.model->norm, cur, pending, stream);
    decode::gemv(g, stream);
  } else {
    p.residual_norm(*lm.model->norm, cur, pending, stream);
    lm.lm_head->forward(p.normed, p.logits, stream);
  }

  if (p.greedy) {
    decode::GreedyParams gp;
    gp.dtype = p.dtype;
    gp.batch = b;
    gp.vocab = p.vocab;
    gp.logits = logits2.view().ptr();
    gp.logits_stride = p.vocab;
    gp.tokens = st.tokens.data_as<int64_t>();
    gp.done = st.done.data_as<int32_t>();
    gp.eos = st.eos.data_as<int64_t>();
    gp.num_eos = st.num_eos;
    gp.pad_id = st.pad_id;
    gp.positions = st.positions.data_as<int32_t>();
    gp.lengths = st.lengths.data_as<int32_t>();
    gp.blocks_per_row = p.greedy_blocks;
    if (p.greedy_blocks > 1) {
      gp.partial_values = p.greedy_values.data_as<float>();
      gp.partial_indices = p.greedy_indices.data_as<int32_t>();
      gp.counters = p.greedy_counters.data_as<int32_t>();
    }
    decode::greedy(gp, stream);
  } else {
    ops::cast(logits2, logits_f32_, stream);
    decode::advance(st.positions.data_as<int32_t>(), st.lengths.data_as<int32_t>(), b, stream);
  }
}

#endif  // HK_HAVE_CUDA

}  // namespace hk
