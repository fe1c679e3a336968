// hk/lr_scheduler.h — learning-rate schedules as Transformers' get_scheduler builds them.
//
// lr(step) = base_lr · λ(step), where step counts completed optimizer steps (0 for the first
// update, as torch's LambdaLR starts at last_epoch 0), with Transformers' lambdas:
//   constant              λ = 1                                     (warmup ignored, as HF does)
//   constant_with_warmup  λ = step / max(1, W) while step < W, then 1
//   linear                warmup, then max(0, (T − step) / max(1, T − W))
//   cosine                warmup, then max(0, ½·(1 + cos(π · 2·0.5 · (step − W) / max(1, T − W))))
// W = warmup steps, T = total training steps. Computed in double, like the Python lambdas.
// Deliberately not here: the restarts / polynomial / inverse-sqrt / plateau schedules.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace hk {

enum class SchedulerType { Constant, ConstantWithWarmup, Linear, Cosine };

// "constant", "constant_with_warmup", "linear", "cosine"; anything else throws InvalidArgument
// listing these (and saying which Transformers schedules hk does not implement).
SchedulerType parse_scheduler_type(std::string_view name);
const char* scheduler_type_name(SchedulerType type);

// Trainer's warmup: `warmup_steps` ≥ 1 is a step count, a value in (0, 1) a ratio of the total
// (ceil(total · ratio), Transformers 5); otherwise `warmup_ratio` (Transformers 4's field,
// ceil(total · ratio)).
int64_t resolve_warmup_steps(double warmup_steps, double warmup_ratio, int64_t total_steps);

class LRScheduler {
 public:
  LRScheduler() = default;
  LRScheduler(SchedulerType type, double base_lr, int64_t warmup_steps, int64_t total_steps);
  // λ(step) and base_lr · λ(step).
  double lambda(int64_t step) const;
  double lr(int64_t step) const { return base_lr_ * lambda(step); }

  SchedulerType type() const { return type_; }
  double base_lr() const { return base_lr_; }
  int64_t warmup_steps() const { return warmup_; }
  int64_t total_steps() const { return total_; }

 private:
  SchedulerType type_ = SchedulerType::Constant;
  double base_lr_ = 0.0;
  int64_t warmup_ = 0;
  int64_t total_ = 0;
};

}  // namespace hk
