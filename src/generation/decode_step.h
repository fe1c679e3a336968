// Internal: one decode step of a DecoderLM on CUDA with every per-step value in device memory, so
// the same launches can be captured once into a CUDA graph and replayed (generate.cc).
//
// The step reads the next input ids, rotary positions, cache lengths, left padding and finished
// rows from DecodeBuffers, runs the layers for one token per row, writes this step's keys and
// values into the KV cache at each row's device length, and ends with the greedy pick (argmax, pad
// for finished rows, eos marks a row finished, positions and lengths advance) or, for sampling,
// with f32 logits for the host and the advance. Nothing on the host reads device memory.
//
// Where the layers run their built-in implementations the step uses the fused decode kernels
// (ops/decode/decode_kernels.h): q/k/v in one product with the input RMSNorm (and the pending
// residual add) as its prologue, q/k norm + rotary + cache write in one kernel, gate/up with the
// post-attention norm and the SwiGLU in one product, down, and lm_head with the final norm. A layer
// bound to a kernel goes through its implementation instead, and the step still runs around it. The
// plan is made once per (model bindings, batch, cache): `plan` says why when the model cannot be
// decoded this way (then generate falls back to one model forward per token), `capture_refusal`
// why its launches must not be captured (a bound kernel that does not declare capture safety).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hk/generation.h"
#include "hk/tensor.h"

namespace hk {

class DecoderLM;

// The device state of a batch being decoded (all on the model's device).
struct DecodeBuffers {
  Tensor tokens;     // i64 [B]: the next input ids
  Tensor positions;  // i32 [B]: rotary position of the next token
  Tensor lengths;    // i32 [B]: cache length before the next step (the cache row it writes)
  Tensor key_start;  // i32 [B]: left padding (keys before it are masked)
  Tensor done;       // i32 [B]: 1 for finished rows (fed pad_id, outputs ignored)
  Tensor eos;        // i64 [max(1, num_eos)]
  int num_eos = 0;
  int64_t pad_id = 0;
};

class DecodeStep {
 public:
  // Plans the step; returns null and sets `why` when the model's decode cannot run on device.
  static std::unique_ptr<DecodeStep> plan(const DecoderLM& lm, KVCache& cache, DecodeBuffers& state,
                                          bool greedy, std::string& why);
  ~DecodeStep();

  // Enqueues one step on `stream`.
  void enqueue(Stream stream) const;
  // "" when the step may be captured, else why not.
  const std::string& capture_refusal() const { return capture_refusal_; }
  // f32 [B, V] logits of the last step (sampling steps only).
  const Tensor& logits_f32() const { return logits_f32_; }
  // Which parts run fused kernels and which go through layer implementations (for reports); with
  // HK_DECODE_PERSISTENT_PROFILE=1, the persistent step's cycle profile of the steps so far
  // (synchronises `stream`, the one the steps ran on).
  std::string summary(Stream stream) const;
  // True while the model's layer bindings are those the step was planned with.
  bool matches(const DecoderLM& lm) const;

 private:
  DecodeStep() = default;
  struct Plan;
  std::unique_ptr<Plan> plan_;
  std::string capture_refusal_, summary_;
  Tensor logits_f32_;
};

}  // namespace hk
