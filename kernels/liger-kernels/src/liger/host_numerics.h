// liger/host_numerics.h — host-side element loads/stores for the cpu variants.
//
// The kernel libraries must not link libhk: the bf16/f16 conversions are the header-only ones of
// hk/dtype.h and hk/kernel_sdk.h (round to nearest even, NaN kept a NaN). Only what the cpu loops
// need:
// load one element as float, store one float rounded to the element type, round a float through a
// dtype. No vectorisation: the cpu variants are simple and correct, not fast.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "hk/kernel_sdk.h"
#include "liger/args.h"

namespace liger::host {

inline float bf16_bits_to_float(uint16_t b) {
  return hk::bf16_to_float(hk::bf16_t{b});
}
inline uint16_t float_to_bf16_bits(float f) {
  return hk::float_to_bf16(f).bits;
}
using hk::sdk::f16_bits_to_float;
using hk::sdk::float_to_f16_bits;

inline float load(const void* p, Dt dt, int64_t i) {
  switch (dt) {
    case Dt::F32:
      return static_cast<const float*>(p)[i];
    case Dt::BF16:
      return bf16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
    default:
      return f16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
  }
}

inline void store(void* p, Dt dt, int64_t i, float v) {
  switch (dt) {
    case Dt::F32:
      static_cast<float*>(p)[i] = v;
      break;
    case Dt::BF16:
      static_cast<uint16_t*>(p)[i] = float_to_bf16_bits(v);
      break;
    default:
      static_cast<uint16_t*>(p)[i] = float_to_f16_bits(v);
  }
}

inline float round_to(Dt dt, float v) {
  switch (dt) {
    case Dt::F32:
      return v;
    case Dt::BF16:
      return bf16_bits_to_float(float_to_bf16_bits(v));
    default:
      return f16_bits_to_float(float_to_f16_bits(v));
  }
}

inline int64_t load_index(const void* p, IndexDt dt, int64_t i) {
  return dt == IndexDt::I32 ? static_cast<const int32_t*>(p)[i] : static_cast<const int64_t*>(p)[i];
}

// Element (r, c) of a Rows operand.
inline float at(const Rows& m, int64_t r, int64_t c) {
  return load(m.data, m.dt, r * m.row_stride + c);
}
inline void put(const Rows& m, int64_t r, int64_t c, float v) {
  store(m.data, m.dt, r * m.row_stride + c, v);
}

}  // namespace liger::host
