// The Trainer's data-parallel side (hk/trainer.h, "Data parallel"): the gradient buckets and
// ZeRO-1 set up for the model, each rank's shard of an epoch, and the optimizer calls that go to
// the sharded optimizer under ZeRO. One process (no group) takes the plain paths here.
#include <filesystem>

#include "hk/distributed.h"
#include "hk/error.h"
#include "train/distributed/gradient_reducer.h"
#include "train/distributed/zero_optimizer.h"
#include "train/trainer_impl.h"

namespace hk::train_detail {

TrainerImpl::~TrainerImpl() = default;

void TrainerImpl::plan_data_parallel(DType grad_dtype_after, DType value_dtype_after,
                                     const optim::AdamWOptions& adamw) {
  if (options.zero_stage != 0 && options.zero_stage != 1)
    throw InvalidArgument("--zero-stage must be 0 or 1 (ZeRO-1 shards the optimizer states), got " +
                          std::to_string(options.zero_stage));
  if (!group) {
    if (options.zero_stage == 1)
      throw InvalidArgument(
          "--zero-stage 1 shards the optimizer across data-parallel ranks; start several ranks "
          "(hk train --nproc-per-node N, torchrun, mpirun or srun)");
    return;
  }
  if (group->device() != model.device())
    throw InvalidArgument("data parallel: the process group is on " + group->device().str() +
                          " and the model on " + model.device().str() +
                          "; load the model on the rank's device");
  if (!(options.ddp_bucket_cap_mb > 0)) throw InvalidArgument("--ddp-bucket-cap-mb must be > 0");
  std::vector<DType> grads(tensors.size(), grad_dtype_after),
      values(tensors.size(), value_dtype_after);
  dist::ReducerOptions ro;
  ro.zero_stage = options.zero_stage;
  ro.bucket_bytes = static_cast<size_t>(options.ddp_bucket_cap_mb * 1024.0 * 1024.0);
  ro.first_bucket_bytes = std::min(ro.first_bucket_bytes, ro.bucket_bytes);
  reducer = std::make_unique<dist::GradientReducer>(group, tensors, grads, values, ro);
  if (options.zero_stage == 1)
    zero = std::make_unique<dist::ZeroOptimizer>(*reducer, adamw, options.stream);
}

void TrainerImpl::attach_data_parallel() {
  if (!reducer) return;
  reducer->attach(model.module(), options.stream);
  if (zero) zero->attach(options.stream);
}

std::vector<int64_t> TrainerImpl::rank_order(int64_t epoch) const {
  std::vector<int64_t> order = epoch_order(data.num_blocks(), args.seed, epoch, args.shuffle);
  return group ? dist::shard_order(order, rank, world) : order;
}

optim::GradNorm TrainerImpl::clip_gradients() {
  return zero ? zero->clip_grad_norm(args.max_grad_norm, options.stream)
              : optimizer->clip_grad_norm(args.max_grad_norm, options.stream);
}

void TrainerImpl::optimizer_step(double lr, const Tensor* clip_coef) {
  if (zero)
    zero->step(lr, clip_coef, options.stream);
  else
    optimizer->step(lr, clip_coef, options.stream);
}

int64_t TrainerImpl::optimizer_steps() const {
  return zero ? zero->steps() : optimizer->steps();
}

std::vector<std::pair<std::string, Tensor>> TrainerImpl::optimizer_state() {
  return zero ? zero->full_state(options.stream) : optimizer->state();
}

void TrainerImpl::load_optimizer_state(const std::vector<std::pair<std::string, Tensor>>& state,
                                       int64_t steps) {
  if (zero)
    zero->load_full_state(state, steps, options.stream);
  else
    optimizer->load_state(state, steps, options.stream);
}

void TrainerImpl::after_weights_loaded() {
  if (reducer) reducer->rehome_values(model.module(), options.stream);
}

void TrainerImpl::refresh_model_from_master() {
  if (zero)
    zero->refresh_model_from_master(options.stream);
  else
    optimizer->refresh_model_from_master(options.stream);
}

void TrainerImpl::barrier() {
  if (group) group->barrier();
}

}  // namespace hk::train_detail
