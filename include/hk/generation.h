// hk/generation.h — static KV cache, sampling and the options/results of `generate`.
//
// Generation is prefill (the whole padded prompt batch in one forward) then one token per step
// against a preallocated cache [layers][B, max_len, Hkv, D]. Batched prompts are left-padded: each
// row's padding is masked through `key_start` and its positions start at 0 on its first real token,
// as Transformers does with an attention mask. Greedy picks the argmax on the device; sampling
// (temperature → top-k → top-p, Transformers' order) runs on the host with a seeded generator so
// results are deterministic given the seed.
//
// On CUDA the decode steps run on the device with the next ids, positions, cache lengths and
// finished rows in device memory (fused kernels where the layers are built-in), and by default the
// step is captured once as a CUDA graph per (batch, cache bucket) and replayed: the only host work
// per token is the copy of the new ids (greedy; sampling also copies the logits). Kernels bound
// to layers must declare capture safety for the graph (kernelize with Mode::Inference |
// Mode::Capture falls back from those that do not); otherwise, or with cuda_graphs = false, the
// same device step is launched eagerly, and a model the device step cannot run (an attention
// kernel without a device-length KV-cache form) decodes with one model forward per token.
// GenerateTimings says which path ran and why. This header does not do beam search or
// speculative decoding.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "hk/device.h"
#include "hk/dtype.h"
#include "hk/tensor.h"

namespace hk {

// Preallocated keys/values for every layer.
class KVCache {
 public:
  KVCache(int64_t num_layers, int64_t batch, int64_t max_length, int64_t num_kv_heads,
          int64_t head_dim, DType dtype, Device device);
  int64_t num_layers() const { return static_cast<int64_t>(keys_.size()); }
  int64_t batch() const { return batch_; }
  int64_t max_length() const { return max_length_; }
  // Positions already written (identical for every row; padding is masked, not skipped).
  int64_t length() const { return length_; }
  // Full cache tensors [B, max_length, Hkv, D].
  const Tensor& keys(int64_t layer) const { return keys_.at(static_cast<size_t>(layer)); }
  const Tensor& values(int64_t layer) const { return values_.at(static_cast<size_t>(layer)); }
  // Called by the model after every layer wrote `n` new positions. Throws when it would overflow.
  void advance(int64_t n);
  void reset() { length_ = 0; }

 private:
  std::vector<Tensor> keys_, values_;
  int64_t batch_, max_length_;
  int64_t length_ = 0;
};

struct SamplingOptions {
  double temperature = 1.0;  // > 0
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // 1 = off
};

// The probabilities sampling draws from after temperature, top-k and top-p (zero for removed
// tokens), from one row of logits. Exposed for tests.
std::vector<double> sampling_distribution(const float* logits, int64_t vocab,
                                          const SamplingOptions& options);
// Draws one token id from `logits` (one row of length vocab).
int64_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& options,
                     std::mt19937_64& rng);

struct GenerateOptions {
  int64_t max_new_tokens = 20;
  bool do_sample = false;  // false = greedy
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  // Stop ids; nullopt = eos from generation_config.json, else config.json. Empty = never stop.
  std::optional<std::vector<int64_t>> eos_token_ids;
  // Written after a row finished; nullopt = pad from the configs, else the first eos, else 0.
  std::optional<int64_t> pad_token_id;
  // CUDA: capture the device decode step as a CUDA graph (false: launch it eagerly).
  bool cuda_graphs = true;
  // Called with every new token of an unfinished row as soon as it is known (rows in order within
  // a step); returning false finishes that row after this token (e.g. a stop string matched).
  std::function<bool(size_t row, int64_t token)> on_token;
};

struct GenerateTimings {
  double prefill_ms = 0;
  double decode_ms = 0;
  int64_t decode_steps = 0;  // forwards after prefill
  double decode_tok_s = 0;   // decode_steps * batch / decode seconds (0 when no decode step)
  // "cuda-graph" (replayed graph), "device" (device step launched eagerly) or "forward" (one model
  // forward per token: CPU, or what the device step cannot run); "" when nothing was decoded.
  std::string decode_path;
  std::string decode_note;  // why the path is not the graph, or what the device step fused
};

struct GenerateOutput {
  // Per prompt row: the new tokens only, up to and including its stop id (nothing after it).
  std::vector<std::vector<int64_t>> sequences;
  GenerateTimings timings;
};

}  // namespace hk
