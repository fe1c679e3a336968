// The per-layer time breakdown of one training step: every layer module's implementation is
// wrapped by a timing proxy that records a pair of CUDA events around each forward / training
// forward / backward call and forwards the call unchanged; the benchmark adds its own scopes
// (forward, backward, clip, optimizer). Calls nest (the built-in MLP calls its Linear children),
// so each record's exclusive time is its duration minus its direct children's: the exclusive
// times of one step add up to the step. Only for benchmarks: it changes no numbers, but the
// events cost a little host time per call, so the timed steps run without it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hk/module.h"
#include "hk/stream.h"

namespace hk::bench {

class LayerTimer {
 public:
  explicit LayerTimer(Stream stream);
  ~LayerTimer();

  // Wraps the implementation of every layer module under `root` (restored by uninstall()).
  void install(nn::Module& root);
  void uninstall();

  // A timed region: events recorded on the timer's stream at construction and destruction.
  class Scope {
   public:
    Scope(LayerTimer& timer, std::string label);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    LayerTimer& timer_;
    size_t index_;
  };

  struct Row {
    std::string label;
    int64_t calls = 0;
    double inclusive_ms = 0;
    double exclusive_ms = 0;
  };
  // After the device is synchronised: rows by label, largest exclusive time first.
  std::vector<Row> rows() const;
  void clear();

  struct Record;  // defined in layer_timer.cc

 private:
  friend class Scope;
  Stream stream_;
  std::vector<std::unique_ptr<Record>> records_;
  std::vector<size_t> open_;  // host stack of open records
  struct Installed;
  std::vector<std::unique_ptr<Installed>> installed_;
};

}  // namespace hk::bench
