// Internal: the AdamW element update, one formula for the CPU loop and the CUDA kernel (so both
// round identically), and the per-step scalars the host computes from the step count.
//
// The order of operations is torch's (torch/optim/adam.py, decoupled weight decay): decay the
// parameter, lerp the first moment toward g, update the second moment, then
// p -= step_size · m / (√v / √bc2 + ε). Everything is f32 here; storage conversion is the caller's.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define HK_ADAMW_HD __host__ __device__ __forceinline__
#else
#define HK_ADAMW_HD inline
#endif

namespace hk::optim::detail {

// Per-step scalars (f32, as torch's scalar arguments reach an f32 kernel).
struct AdamWScalars {
  float decay_factor;     // 1 − lr·weight_decay (applied to the decay group only)
  float one_minus_beta1;  // 1 − β1
  float beta2;
  float one_minus_beta2;  // 1 − β2
  float step_size;        // lr / (1 − β1ᵗ)
  float bc2_sqrt;         // √(1 − β2ᵗ)
  float eps;
};

// t = the step number after increment (1 for the first step). Computed in double like torch's
// Python scalars, then rounded to f32.
inline AdamWScalars adamw_scalars(double lr, double beta1, double beta2, double eps,
                                  double weight_decay, long long t) {
  AdamWScalars s;
  s.decay_factor = static_cast<float>(1.0 - lr * weight_decay);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(t));
  s.step_size = static_cast<float>(lr / bc1);
  s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.eps = static_cast<float>(eps);
  return s;
}

// torch.lerp's formula (two branches keep it exact at both ends).
HK_ADAMW_HD float lerp(float self, float end, float weight) {
  const float diff = end - self;
  return weight < 0.5f ? self + weight * diff : end - diff * (1.0f - weight);
}

// One element: p, m, v updated in place from gradient g (already scaled).
HK_ADAMW_HD void adamw_update(float& p, float& m, float& v, float g, bool decay,
                              const AdamWScalars& s) {
  if (decay) p = p * s.decay_factor;
  m = lerp(m, g, s.one_minus_beta1);
  v = v * s.beta2 + s.one_minus_beta2 * g * g;
  const float denom = sqrtf(v) / s.bc2_sqrt + s.eps;
  p = p - s.step_size * (m / denom);
}

}  // namespace hk::optim::detail
