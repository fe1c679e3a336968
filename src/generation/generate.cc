// generate(): left-pad the prompts, prefill them in one forward into a static KV cache, then decode
// one token per step until every row produced a stop id (or on_token finished it) or
// max_new_tokens tokens.
//
// Two decode loops with the same semantics. On CUDA, the device step (decode_session.h): next ids,
// positions, lengths and finished rows stay on the device, the step is a replayed CUDA graph (or
// the same launches, eagerly), greedy runs one step ahead of the host. Elsewhere, and for models
// the device step cannot run, one model forward per token. Greedy takes the argmax on the model's
// device (only B ids cross to the host); sampling copies the last position's logits (f32) to the
// host and draws with one seeded generator, row by row. A finished row keeps being fed the pad id
// (its outputs are ignored), as Transformers does; the token it finished with is fed once first.
#include <algorithm>
#include <chrono>

#include "../models/decoder_lm.h"
#include "decode_session.h"
#include "hk/error.h"
#include "hk/ops.h"

namespace hk {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Cache capacities are rounded up to this many positions: one graph serves every generation whose
// prompt + new tokens fall in the same bucket.
constexpr int64_t kCacheBucket = 256;

// Next token per row from logits [B, 1, V].
std::vector<int64_t> pick(const Tensor& logits, const GenerateOptions& options,
                          std::mt19937_64& rng, Stream stream) {
  const int64_t b = logits.size(0), v = logits.size(2);
  Tensor rows = logits.reshape({b, v});
  if (!options.do_sample) {
    Tensor ids = Tensor::empty({b}, DType::I64, logits.device(), stream);
    ops::argmax(rows, ids, stream);
    return (ids.device().is_cpu() ? ids : ids.to(Device::cpu(), stream)).to_int64s();
  }
  Tensor f32 = rows;
  if (rows.dtype() != DType::F32) {
    f32 = Tensor::empty({b, v}, DType::F32, rows.device(), stream);
    ops::cast(rows, f32, stream);
  }
  if (!f32.device().is_cpu()) f32 = f32.to(Device::cpu(), stream);
  SamplingOptions sampling{options.temperature, options.top_k, options.top_p};
  std::vector<int64_t> out(static_cast<size_t>(b));
  for (int64_t r = 0; r < b; ++r)
    out[static_cast<size_t>(r)] = sample_token(f32.data_as<float>() + r * v, v, sampling, rng);
  return out;
}

}  // namespace

GenerateOutput CausalLM::generate(const std::vector<int64_t>& prompt,
                                  const GenerateOptions& options) const {
  return generate(std::vector<std::vector<int64_t>>{prompt}, options);
}

GenerateOutput CausalLM::generate(const Tensor& input_ids, const GenerateOptions& options) const {
  if (input_ids.ndim() != 2 || input_ids.numel() == 0)
    throw InvalidArgument("generate: input_ids must be a non-empty [batch, seq] tensor, got " +
                          input_ids.view().str());
  if (input_ids.dtype() != DType::I64 && input_ids.dtype() != DType::I32)
    throw InvalidArgument("generate: input_ids must be i32 or i64");
  Tensor host = input_ids.device().is_cpu() ? input_ids : input_ids.to(Device::cpu());
  std::vector<int64_t> flat = host.to_int64s();
  const size_t b = static_cast<size_t>(input_ids.size(0)),
               s = static_cast<size_t>(input_ids.size(1));
  std::vector<std::vector<int64_t>> prompts(b);
  for (size_t r = 0; r < b; ++r)
    prompts[r].assign(flat.begin() + r * s, flat.begin() + (r + 1) * s);
  return generate(prompts, options);
}

GenerateOutput CausalLM::generate(const std::vector<std::vector<int64_t>>& prompts,
                                  const GenerateOptions& options) const {
  const DecoderLM& lm = impl();
  const ModelConfig& config = lm.config;
  if (prompts.empty()) throw InvalidArgument("generate: no prompt given");
  if (options.max_new_tokens < 0) throw InvalidArgument("generate: max_new_tokens must be >= 0");
  if (options.do_sample) {  // validate once, before any work
    std::vector<float> probe{0.0f};
    sampling_distribution(probe.data(), 1, {options.temperature, options.top_k, options.top_p});
  }
  const int64_t b = static_cast<int64_t>(prompts.size());
  int64_t len = 0;
  for (size_t r = 0; r < prompts.size(); ++r) {
    if (prompts[r].empty())
      throw InvalidArgument("generate: prompt " + std::to_string(r) + " is empty");
    for (int64_t id : prompts[r])
      if (id < 0 || id >= config.vocab_size)
        throw InvalidArgument("generate: token id " + std::to_string(id) + " in prompt " +
                              std::to_string(r) + " is outside the vocabulary [0, " +
                              std::to_string(config.vocab_size) + ")");
    len = std::max<int64_t>(len, static_cast<int64_t>(prompts[r].size()));
  }
  const int64_t total_length =
      checked_add(len, options.max_new_tokens, "the prompt length plus max_new_tokens");
  if (total_length > config.max_position_embeddings)
    throw InvalidArgument(
        "prompt of " + std::to_string(len) + " tokens plus max_new_tokens " +
        std::to_string(options.max_new_tokens) + " is longer than the model's context of " +
        std::to_string(config.max_position_embeddings) +
        " positions (max_position_embeddings); shorten the prompt or generate fewer tokens");

  std::vector<int64_t> eos = options.eos_token_ids.value_or(
      !lm.generation_config.eos_token_ids.empty() ? lm.generation_config.eos_token_ids
                                                  : config.eos_token_ids);
  int64_t pad_id = options.pad_token_id.value_or(lm.generation_config.pad_token_id.value_or(
      config.pad_token_id.value_or(eos.empty() ? 0 : eos[0])));
  if (pad_id < 0 || pad_id >= config.vocab_size) pad_id = 0;

  GenerateOutput out;
  out.sequences.resize(prompts.size());
  if (options.max_new_tokens == 0) return out;

  std::vector<int64_t> ids(static_cast<size_t>(b * len), pad_id), pad(static_cast<size_t>(b));
  for (int64_t r = 0; r < b; ++r) {
    const auto& p = prompts[static_cast<size_t>(r)];
    pad[static_cast<size_t>(r)] = len - static_cast<int64_t>(p.size());
    std::copy(p.begin(), p.end(), ids.begin() + r * len + pad[static_cast<size_t>(r)]);
  }
  const bool padded = std::any_of(pad.begin(), pad.end(), [](int64_t p) { return p > 0; });

  const bool greedy = !options.do_sample;
  std::vector<bool> done(static_cast<size_t>(b), false);
  // Records a new token of an unfinished row; true when the row is finished after it.
  auto deliver = [&](size_t r, int64_t token) {
    out.sequences[r].push_back(token);
    bool finished = std::find(eos.begin(), eos.end(), token) != eos.end();
    if (options.on_token && !options.on_token(r, token)) finished = true;
    return finished;
  };
  std::mt19937_64 rng(options.seed);
  const SamplingOptions sampling{options.temperature, options.top_k, options.top_p};

  // The device decode on CUDA (kept on the model for the next call of the same shape).
  std::shared_ptr<DecodeSession> session;
  std::string why_not_device;
  if (lm.device.is_cuda() && options.max_new_tokens > 1) {
    const int64_t capacity = checked_add(total_length, kCacheBucket - 1, "the KV cache length") /
                             kCacheBucket * kCacheBucket;
    if (lm.decode_session &&
        lm.decode_session->serves(lm, b, capacity, greedy, options.cuda_graphs)) {
      session = lm.decode_session;
    } else {
      lm.decode_session.reset();  // free its cache before making another
      session = DecodeSession::create(lm, b, capacity, greedy, options.cuda_graphs, why_not_device);
      lm.decode_session = session;
    }
  }

  std::unique_ptr<KVCache> own_cache;
  KVCache* cache = nullptr;
  Stream stream;
  if (session) {
    cache = &session->cache();
    cache->reset();
    stream = session->stream();
  } else {
    own_cache =
        std::make_unique<KVCache>(config.num_hidden_layers, b, total_length,
                                  config.num_key_value_heads, config.head_dim, lm.dtype, lm.device);
    cache = own_cache.get();
  }
  ForwardOptions fwd;
  fwd.cache = cache;
  fwd.logits_to_keep = 1;
  fwd.stream = stream;
  if (padded) fwd.key_start = Tensor::from_ints(pad, {b}, DType::I64);

  auto t0 = Clock::now();
  CausalLMOutput step = lm.forward(Tensor::from_ints(ids, {b, len}, DType::I64), fwd);
  std::vector<int64_t> next = pick(step.logits, options, rng, stream);
  step = CausalLMOutput();
  out.timings.prefill_ms = ms_since(t0);

  auto t1 = Clock::now();
  if (session && greedy) {
    // Device loop, greedy: the first tokens come from prefill; each step's ids are copied back
    // while the next step already runs.
    bool all_done = true;
    std::vector<int64_t> done_flags(static_cast<size_t>(b), 0), positions(static_cast<size_t>(b));
    for (size_t r = 0; r < static_cast<size_t>(b); ++r) {
      done[r] = deliver(r, next[r]);
      done_flags[r] = done[r];
      all_done = all_done && done[r];
      positions[r] = len - pad[r];
    }
    const int64_t needed = options.max_new_tokens - 1;
    if (!all_done) {
      session->start(next, positions, len, pad, done_flags, eos, pad_id);
      t1 = Clock::now();
      int64_t launched = 0, processed = 0;
      session->launch_step(0);
      launched = 1;
      while (processed < launched) {
        if (launched < needed) {
          session->launch_step(static_cast<int>(launched % 2));
          ++launched;
        }
        const int64_t* tokens = session->tokens(static_cast<int>(processed % 2));
        ++processed;
        ++out.timings.decode_steps;
        all_done = true;
        for (size_t r = 0; r < static_cast<size_t>(b); ++r) {
          if (!done[r] && deliver(r, tokens[r])) {
            done[r] = true;
            if (std::find(eos.begin(), eos.end(), tokens[r]) == eos.end()) session->mark_done(r);
          }
          all_done = all_done && done[r];
        }
        if (all_done) break;
      }
      synchronize(lm.device, session->stream());  // a step launched ahead may still run
    }
  } else {
    // One forward per token (or, for sampling on CUDA, the device step with host sampling).
    if (session) {
      std::vector<int64_t> positions(static_cast<size_t>(b)), zeros(static_cast<size_t>(b), 0);
      for (size_t r = 0; r < static_cast<size_t>(b); ++r) positions[r] = len - pad[r];
      session->start(next, positions, len, pad, zeros, eos, pad_id);
    }
    t1 = Clock::now();
    for (int64_t produced = 1;; ++produced) {
      bool all_done = true;
      for (size_t r = 0; r < static_cast<size_t>(b); ++r) {
        if (done[r]) {
          next[r] = pad_id;
          continue;
        }
        done[r] = deliver(r, next[r]);
        all_done = all_done && done[r];
      }
      if (all_done || produced >= options.max_new_tokens) break;
      if (session) {
        const float* logits = session->sample_step(next);
        for (size_t r = 0; r < static_cast<size_t>(b); ++r)
          next[r] = sample_token(logits + r * static_cast<size_t>(config.vocab_size),
                                 config.vocab_size, sampling, rng);
      } else {
        step = lm.forward(Tensor::from_ints(next, {b, 1}, DType::I64), fwd);
        next = pick(step.logits, options, rng, stream);
      }
      ++out.timings.decode_steps;
    }
  }
  out.timings.decode_ms = ms_since(t1);
  if (out.timings.decode_steps > 0 && out.timings.decode_ms > 0)
    out.timings.decode_tok_s =
        static_cast<double>(out.timings.decode_steps * b) * 1000.0 / out.timings.decode_ms;
  if (out.timings.decode_steps > 0) {
    if (session) {
      out.timings.decode_path = session->path();
      const std::string& note = session->graph_note();
      out.timings.decode_note =
          note.empty() ? session->summary() : note + " (" + session->summary() + ")";
    } else {
      out.timings.decode_path = "forward";
      out.timings.decode_note = why_not_device;
    }
  }
  return out;
}

}  // namespace hk
