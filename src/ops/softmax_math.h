// Internal: the row softmax shared by the CPU softmax and attention ops (f32 or f64 math).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace hk::ops::cpu {

// In-place softmax of n values; all -inf gives zeros.
template <class T>
inline void softmax_row(T* x, int64_t n) {
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, x[j]);
  if (m == -std::numeric_limits<T>::infinity()) {
    for (int64_t j = 0; j < n; ++j) x[j] = 0;
    return;
  }
  T sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += (x[j] = std::exp(x[j] - m));
  for (int64_t j = 0; j < n; ++j) x[j] /= sum;
}

}  // namespace hk::ops::cpu
