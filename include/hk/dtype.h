// hk/dtype.h — element types and the 16-bit float conversions.
//
// Conversions to bf16/f16 round to nearest, ties to even, and keep NaN a NaN; they are the single
// definition used by CPU ops, tests and file I/O. This header does not do arithmetic on 16-bit
// types: ops convert to float, compute, and convert back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace hk {

enum class DType : uint8_t { F32, F16, BF16, I32, I64, U8, Bool, F64 };

// Size in bytes of one element.
size_t dtype_size(DType dtype);
// Short name used on the command line and in errors: "f32", "f16", "bf16", "i32", "i64", "u8",
// "bool", "f64".
const char* dtype_name(DType dtype);
// Parses the short names above and the common long ones ("float32", "bfloat16", "half", ...).
// Throws InvalidArgument listing the accepted names.
DType parse_dtype(std::string_view name);
bool is_floating(DType dtype);

// Raw 16-bit storage types. Trivially copyable; no arithmetic on purpose.
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

inline float bf16_to_float(bf16_t v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}

float f16_to_float(f16_t v);
f16_t float_to_f16(float f);

// Rounds a float through the given floating dtype and back (identity for f32/f64).
float round_to(DType dtype, float value);

// The element of `dtype` stored at `p` (host memory, any alignment), widened: the one definition
// used by Tensor::to_doubles/to_int64s and file conversion. Bool reads as 0 or 1.
double element_to_double(DType dtype, const void* p);
// Integer dtypes only (i32, i64, u8, bool); a floating dtype throws InvalidArgument.
int64_t element_to_int64(DType dtype, const void* p);

}  // namespace hk
