// liger/act_math.h — the activation functions and their derivatives, in f32, shared verbatim by
// the cpu loops and the cuda kernels so both variants compute the same function.
//
// Accuracy: expf/erff/tanhf (the cuda side may use the fast intrinsics only where the error is
// far below bf16 rounding, which these plain calls already are). Not a general math library.
#pragma once

#include <cmath>

#include "liger/args.h"

#if defined(__CUDACC__)
#define LIGER_HD __host__ __device__ __forceinline__
#else
#define LIGER_HD inline
#endif

namespace liger {

LIGER_HD float sigmoidf(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// act(x)
LIGER_HD float act_fwd(Act act, float x) {
  switch (act) {
    case Act::SiLU:
      return x * sigmoidf(x);
    case Act::GeluErf:  // erfc keeps the left tail accurate where 1 + erf cancels
      return 0.5f * x * erfcf(-x * 0.70710678118654752f);
    case Act::GeluTanh: {  // 0.5(1 + tanh z) = σ(2z), without the cancellation for z ≪ 0
      const float z = 0.79788456080286536f * (x + 0.044715f * x * x * x);
      return x * sigmoidf(2.0f * z);
    }
    default:
      return x * sigmoidf(1.702f * x);
  }
}

// act'(x)
LIGER_HD float act_grad(Act act, float x) {
  switch (act) {
    case Act::SiLU: {
      const float s = sigmoidf(x);
      return s * (1.0f + x * (1.0f - s));
    }
    case Act::GeluErf: {
      const float cdf = 0.5f * erfcf(-x * 0.70710678118654752f);
      const float pdf = 0.39894228040143268f * expf(-0.5f * x * x);
      return cdf + x * pdf;
    }
    case Act::GeluTanh: {  // d/dx x·σ(2z) = σ + x·2σ(1−σ)·z'
      const float k = 0.79788456080286536f;
      const float s = sigmoidf(2.0f * k * (x + 0.044715f * x * x * x));
      return s + 2.0f * x * s * (1.0f - s) * k * (1.0f + 3.0f * 0.044715f * x * x);
    }
    default: {
      const float s = sigmoidf(1.702f * x);
      return s * (1.0f + 1.702f * x * (1.0f - s));
    }
  }
}

}  // namespace liger
