// Internal: ZeRO stage 1 — AdamW whose states are sharded across the ranks. Each bucket of the
// GradientReducer is cut into world-size equal chunks; rank r owns chunk r of every bucket: the
// reduce-scatter leaves the summed gradient of that chunk there, this class updates it with the
// fused AdamW (hk::optim::AdamW over the pieces of parameters that fall into the chunk, so every
// element is updated by the same formula as stage 0), and all-gathers the updated chunks back
// into every rank's parameters. Moments (and --bf16 masters) exist only for the own chunk: 1/W of
// stage 0's optimizer memory.
//
// The gradient norm for clipping is global: each rank's Σg² over its chunks, summed over the
// ranks. Checkpoints hold the full state: full_state() gathers it (a collective), and
// load_full_state() takes this rank's pieces from full tensors, so a checkpoint resumes on any
// world size. Deliberately not here: ZeRO-2/3 (sharded gradients or parameters), CPU offload.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hk/optim.h"
#include "train/distributed/gradient_reducer.h"

namespace hk::dist {

class ZeroOptimizer {
 public:
  // Before GradientReducer::attach, while the parameter values still have their original dtype
  // (with master_weights, the f32 values the masters are copied from).
  ZeroOptimizer(GradientReducer& reducer, optim::AdamWOptions options, Stream stream);
  ~ZeroOptimizer();
  // After attach: the pieces now point into the reducer's flat buffers.
  void attach(Stream stream);

  // The global norm of the (reduce-scattered) gradients and the clipping coefficient.
  optim::GradNorm clip_grad_norm(double max_norm, Stream stream);
  // Updates this rank's chunks, then all-gathers every bucket's parameters.
  void step(double lr, const Tensor* grad_scale, Stream stream);
  int64_t steps() const;
  // "exp_avg.<name>", "exp_avg_sq.<name>" (and "master.<name>") of every parameter, full
  // tensors, on every rank (a collective: all ranks call it).
  std::vector<std::pair<std::string, Tensor>> full_state(Stream stream);
  // This rank's pieces of `full` (names as full_state's), and the step count.
  void load_full_state(const std::vector<std::pair<std::string, Tensor>>& full, int64_t steps,
                       Stream stream);
  // Masters → this rank's parameter chunks, then all-gathers them (after load_full_state).
  void refresh_model_from_master(Stream stream);

 private:
  struct Piece {
    size_t bucket = 0, entry = 0;
    int64_t begin = 0, numel = 0;  // within the bucket
  };
  void gather_parameters(Stream stream);
  void point_pieces(bool into_buckets);

  GradientReducer& reducer_;
  optim::AdamWOptions options_;
  std::vector<Piece> pieces_;
  // The OptimTensor slots AdamW reads at every step (stable addresses).
  std::vector<std::unique_ptr<Tensor>> values_, grads_;
  std::unique_ptr<optim::AdamW> adamw_;
  int64_t steps_without_pieces_ = 0;  // a rank whose chunks hold no parameter element
  optim::GradNorm norm_;
  Tensor sum_of_squares_;
};

}  // namespace hk::dist
