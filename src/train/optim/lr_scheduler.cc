// Learning-rate schedules (hk/lr_scheduler.h): Transformers' lambdas in double precision.
#include "hk/lr_scheduler.h"

#include <algorithm>
#include <cmath>

#include "hk/error.h"

namespace hk {

SchedulerType parse_scheduler_type(std::string_view name) {
  if (name == "constant") return SchedulerType::Constant;
  if (name == "constant_with_warmup") return SchedulerType::ConstantWithWarmup;
  if (name == "linear") return SchedulerType::Linear;
  if (name == "cosine") return SchedulerType::Cosine;
  throw InvalidArgument("unknown lr_scheduler_type '" + std::string(name) +
                        "'; hk implements constant, constant_with_warmup, linear and cosine "
                        "(Transformers' cosine_with_restarts, polynomial, inverse_sqrt, "
                        "reduce_lr_on_plateau, cosine_with_min_lr and warmup_stable_decay are "
                        "not implemented)");
}

const char* scheduler_type_name(SchedulerType type) {
  switch (type) {
    case SchedulerType::Constant:
      return "constant";
    case SchedulerType::ConstantWithWarmup:
      return "constant_with_warmup";
    case SchedulerType::Linear:
      return "linear";
    case SchedulerType::Cosine:
      return "cosine";
  }
  return "constant";
}

int64_t resolve_warmup_steps(double warmup_steps, double warmup_ratio, int64_t total_steps) {
  HK_CHECK(warmup_steps >= 0 && std::isfinite(warmup_steps),
           "warmup_steps must be >= 0, got " + std::to_string(warmup_steps));
  HK_CHECK(warmup_ratio >= 0 && warmup_ratio <= 1,
           "warmup_ratio must be in [0, 1], got " + std::to_string(warmup_ratio));
  if (warmup_steps >= 1) return static_cast<int64_t>(warmup_steps);
  const double ratio = warmup_steps > 0 ? warmup_steps : warmup_ratio;
  return static_cast<int64_t>(std::ceil(static_cast<double>(total_steps) * ratio));
}

LRScheduler::LRScheduler(SchedulerType type, double base_lr, int64_t warmup_steps,
                         int64_t total_steps)
    : type_(type), base_lr_(base_lr), warmup_(warmup_steps), total_(total_steps) {
  HK_CHECK(warmup_steps >= 0, "warmup steps must be >= 0");
  HK_CHECK(total_steps >= 0, "total training steps must be >= 0");
}

double LRScheduler::lambda(int64_t step) const {
  const double s = static_cast<double>(step);
  const double w = static_cast<double>(warmup_);
  const double t = static_cast<double>(total_);
  if (type_ == SchedulerType::Constant) return 1.0;
  if (step < warmup_) return s / std::max(1.0, w);
  switch (type_) {
    case SchedulerType::ConstantWithWarmup:
      return 1.0;
    case SchedulerType::Linear:
      return std::max(0.0, (t - s) / std::max(1.0, t - w));
    case SchedulerType::Cosine: {
      const double progress = (s - w) / std::max(1.0, t - w);
      const double num_cycles = 0.5;
      return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * num_cycles * 2.0 * progress)));
    }
    case SchedulerType::Constant:
      break;
  }
  return 1.0;
}

}  // namespace hk
