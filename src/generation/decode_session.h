// Internal: the device decode of generate() on CUDA — a KV cache, the DecodeBuffers, the
// DecodeStep, its own stream, and the CUDA graph of the step.
//
// A session serves one (batch, cache bucket, greedy or sampling) and is kept on the model for the
// next generate with the same shape, so a graph is captured once and replayed from then on. The
// graph is made at the first step of a session: that step runs eagerly inside a private
// allocation pool (sizing it, creating library plans and workspaces), then the same launches are
// captured with device mallocs forbidden; any failure there (a layer implementation that
// synchronises, allocates differently, or is not capture-safe) leaves the session on eager steps
// with the reason recorded. Greedy steps pipeline one step ahead: step t+1 is enqueued before the
// host reads step t's tokens (two pinned slots), which needs no host input because the next ids,
// positions, lengths and finished rows live on the device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "decode_step.h"
#include "hk/allocator.h"
#include "hk/generation.h"
#include "hk/stream.h"

namespace hk {

class DecoderLM;

class DecodeSession {
 public:
  // Null with `why` when the model cannot decode on device. `graphs`: capture the step.
  static std::unique_ptr<DecodeSession> create(const DecoderLM& lm, int64_t batch, int64_t capacity,
                                               bool greedy, bool graphs, std::string& why);
  ~DecodeSession();
  DecodeSession(const DecodeSession&) = delete;
  DecodeSession& operator=(const DecodeSession&) = delete;

  bool serves(const DecoderLM& lm, int64_t batch, int64_t capacity, bool greedy, bool graphs) const;
  KVCache& cache() { return *cache_; }
  Stream stream() const { return stream_.get(); }

  // New generation state (synchronous host → device copies). first_tokens: the ids the first
  // step reads; positions: their rotary positions; length: the cache length after prefill.
  void start(const std::vector<int64_t>& first_tokens, const std::vector<int64_t>& positions,
             int64_t length, const std::vector<int64_t>& key_start,
             const std::vector<int64_t>& done, const std::vector<int64_t>& eos, int64_t pad_id);
  // Greedy: enqueues a step and the copy of its tokens into host slot `slot` (0 or 1).
  void launch_step(int slot);
  // Greedy: waits for the step of `slot`; its next ids, one per row.
  const int64_t* tokens(int slot);
  // Sampling: enqueues a step reading `tokens`, waits, returns its f32 logits [B, V] on the host.
  const float* sample_step(const std::vector<int64_t>& tokens);
  // Marks a row finished on the device (stream-ordered, after the steps already enqueued).
  void mark_done(int64_t row);

  // "cuda-graph" once the step runs as a graph, else "device".
  std::string path() const { return exec_ ? "cuda-graph" : "device"; }
  // Why the step does not run as a graph ("" when it does or graphs were not asked for).
  const std::string& graph_note() const { return graph_note_; }
  std::string summary() const { return step_->summary(stream_.get()); }

 private:
  DecodeSession() = default;
  void run_step();  // graph replay or eager launches (the first step may capture)
  void drop_graph();

  OwnedStream stream_{Device::cpu()};
  const DecoderLM* lm_ = nullptr;
  int64_t batch_ = 0, capacity_ = 0, vocab_ = 0;
  bool greedy_ = true, graphs_ = true, tried_capture_ = false;
  std::unique_ptr<KVCache> cache_;
  DecodeBuffers state_;
  std::unique_ptr<DecodeStep> step_;
  std::unique_ptr<GraphPool> pool_;
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  void* events_[2] = {nullptr, nullptr};
  int64_t* host_tokens_ = nullptr;  // pinned [2][B]
  int64_t* host_input_ = nullptr;   // pinned [B]
  int32_t* host_one_ = nullptr;     // pinned 1
  float* host_logits_ = nullptr;    // pinned [B, V] (sampling)
  std::string graph_note_;
};

}  // namespace hk
