// Internal: the activation functions and their derivatives as scalar formulas (float or double).
// SiLU = x·σ(x); GELU = the erf form; GELUTanh = PyTorch's approximate="tanh"; QuickGELU =
// x·σ(1.702·x) (Transformers' QuickGELUActivation). Shared by the CPU
// ops; device code has its own copies.
#pragma once

#include <cmath>

#include "hk/ops.h"

namespace hk::ops::cpu {

template <class T>
T activate(Activation act, T x) {
  switch (act) {
    case Activation::SiLU:
      return x / (T{1} + std::exp(-x));
    case Activation::GELU:
      return T(0.5) * x * (T{1} + std::erf(x * T(M_SQRT1_2)));
    case Activation::GELUTanh: {
      const T k = T(M_2_SQRTPI * M_SQRT1_2);  // sqrt(2/pi)
      return T(0.5) * x * (T{1} + std::tanh(k * (x + T(0.044715) * x * x * x)));
    }
    case Activation::QuickGELU:
      return x / (T{1} + std::exp(T(-1.702) * x));
  }
  return x;
}

template <class T>
T activate_derivative(Activation act, T x) {
  switch (act) {
    case Activation::SiLU: {
      const T s = T{1} / (T{1} + std::exp(-x));
      return s * (T{1} + x * (T{1} - s));
    }
    case Activation::GELU: {
      const T pdf = std::exp(T(-0.5) * x * x) * T(M_2_SQRTPI * M_SQRT1_2 * 0.5);  // φ(x)
      return T(0.5) * (T{1} + std::erf(x * T(M_SQRT1_2))) + x * pdf;
    }
    case Activation::GELUTanh: {
      const T k = T(M_2_SQRTPI * M_SQRT1_2);
      const T t = std::tanh(k * (x + T(0.044715) * x * x * x));
      return T(0.5) * (T{1} + t) +
             T(0.5) * x * (T{1} - t * t) * k * (T{1} + T(3 * 0.044715) * x * x);
    }
    case Activation::QuickGELU: {
      const T s = T{1} / (T{1} + std::exp(T(-1.702) * x));
      return s * (T{1} + T(1.702) * x * (T{1} - s));
    }
  }
  return T{1};
}

}  // namespace hk::ops::cpu
