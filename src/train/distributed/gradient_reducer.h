// Internal: data-parallel gradients, as torch's DistributedDataParallel reduces them — the
// trainable parameters' gradients live in flat buckets (reverse parameter order, 1 MiB for the
// first bucket and `bucket_bytes` (DDP's 25 MB) for the others, one dtype per bucket), and a
// bucket's collective starts as soon as the backward has finished all of its gradients
// (Loss::backward's on_ready), in bucket order on every rank, on a communication stream that the
// compute stream waits for before the optimizer. Stage 0 all-reduces (sum) a bucket; ZeRO stage 1
// reduce-scatters it, so rank r holds the sum of chunk r only (zero_optimizer.h updates it).
//
// Gradients are bucket views ("gradient_as_bucket_view"): the backward writes into the buckets,
// nothing is copied in or out. With ZeRO the parameters live in flat buffers of the same layout
// too, so that the updated chunks can be all-gathered in place. Gradient accumulation: the trainer
// passes on_ready only to the last micro-batch's backward (DDP's no_sync for the others).
// The loss is not averaged here: the trainer divides by the global token count, so the sum over
// ranks is the gradient of the global batch.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "hk/distributed.h"
#include "hk/models.h"
#include "hk/optim.h"
#include "hk/stream.h"

namespace hk::dist {

struct BucketEntry {
  size_t tensor = 0;   // index into the reducer's tensor list
  int64_t offset = 0;  // first element in the bucket
  int64_t numel = 0;
};

struct Bucket {
  DType grad_dtype = DType::F32, value_dtype = DType::F32;
  std::vector<BucketEntry> entries;
  int64_t numel = 0;  // padded to a multiple of world size × alignment
  Tensor grads;       // [numel], zeros where no tensor lies
  Tensor values;      // ZeRO: [numel] of value_dtype, the parameters' storage
  // Runtime state of one backward.
  int pending = 0;
  bool launched = false;
  std::shared_ptr<Event> ready;  // CUDA: the compute stream reached this bucket
};

struct ReducerOptions {
  int zero_stage = 0;
  size_t bucket_bytes = size_t{25} << 20;       // DDP's bucket_cap_mb = 25
  size_t first_bucket_bytes = size_t{1} << 20;  // DDP's first bucket: 1 MiB
};

class GradientReducer {
 public:
  // Plans the buckets for `tensors` with the dtypes they will have when attach() runs (for --bf16
  // masters: f32 gradients over bf16 values). Allocates nothing yet.
  GradientReducer(std::shared_ptr<ProcessGroup> group, std::vector<optim::OptimTensor> tensors,
                  std::vector<DType> grad_dtypes, std::vector<DType> value_dtypes,
                  ReducerOptions options);
  ~GradientReducer();

  // Allocates the buckets on the group's device, points every parameter's gradient at its bucket
  // view (marked for overwrite), and with ZeRO moves the parameter values into the flat buffers
  // (ties re-resolved on `root`). `compute` is the trainer's stream.
  void attach(nn::Module& root, Stream compute);
  // ZeRO: copies parameter values that were replaced (a checkpoint load) back into the buffers.
  void rehome_values(nn::Module& root, Stream compute);

  // Loss::backward's on_ready for the last micro-batch of a step.
  Loss::GradientsReadyFn on_gradients_ready();
  // After that backward: starts any bucket still pending and makes `compute` wait for every
  // collective (no host wait on CUDA).
  void finish(Stream compute);

  const std::vector<Bucket>& buckets() const { return buckets_; }
  std::vector<Bucket>& buckets() { return buckets_; }
  const std::vector<optim::OptimTensor>& tensors() const { return tensors_; }
  ProcessGroup& group() { return *group_; }
  int zero_stage() const { return options_.zero_stage; }

 private:
  void launch_ready_buckets(Stream compute);
  void launch(Bucket& b, Stream compute);
  Stream comm_stream(Stream compute) const;

  std::shared_ptr<ProcessGroup> group_;
  std::vector<optim::OptimTensor> tensors_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::map<const Tensor*, std::pair<size_t, size_t>> where_;  // value slot → (bucket, entry)
  size_t next_bucket_ = 0;
  Stream compute_;
  std::unique_ptr<OwnedStream> comm_;
  std::shared_ptr<Event> comm_done_;
};

}  // namespace hk::dist
