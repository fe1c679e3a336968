// liger/host_numerics.h — host-side element loads/stores for the cpu variants.
//
// The kernel libraries must not link libhk, so the bf16/f16 conversions live here (round to
// nearest even, NaN kept a NaN — the same rule as hk/dtype.h). Only what the cpu loops need:
// load one element as float, store one float rounded to the element type, round a float through a
// dtype. No vectorisation: the cpu variants are simple and correct, not fast.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "liger/args.h"

namespace liger::host {

inline float bf16_bits_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_bits_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 112) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_f16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // overflow (≥ 65520) → inf
  if (a < 0x38800000u) {                        // subnormal or zero in f16
    if (a < 0x33000000u) return sign;           // < 2^-25 rounds to 0
    uint32_t man = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - static_cast<int>(a >> 23);  // 14 + (113 - exp)
    uint32_t half = man >> shift, rest = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rest > mid || (rest == mid && (half & 1u))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t v = a - (112u << 23);
  v += 0xfffu + ((v >> 13) & 1u);
  return sign | static_cast<uint16_t>(v >> 13);
}

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
