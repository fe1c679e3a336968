// dtype names, sizes and the f16 conversions (bf16 is inline in the header).
#include "hk/dtype.h"

#include <cmath>

#include "hk/error.h"

namespace hk {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return 4;
    case DType::F16:
      return 2;
    case DType::BF16:
      return 2;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
    case DType::U8:
      return 1;
    case DType::Bool:
      return 1;
    case DType::F64:
      return 8;
  }
  throw InvalidArgument("unknown dtype value " + std::to_string(static_cast<int>(dtype)));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "f32";
    case DType::F16:
      return "f16";
    case DType::BF16:
      return "bf16";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
    case DType::U8:
      return "u8";
    case DType::Bool:
      return "bool";
    case DType::F64:
      return "f64";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "float32" || name == "float" || name == "F32") return DType::F32;
  if (name == "f16" || name == "float16" || name == "half" || name == "F16") return DType::F16;
  if (name == "bf16" || name == "bfloat16" || name == "BF16") return DType::BF16;
  if (name == "i32" || name == "int32" || name == "I32") return DType::I32;
  if (name == "i64" || name == "int64" || name == "I64") return DType::I64;
  if (name == "u8" || name == "uint8" || name == "U8") return DType::U8;
  if (name == "bool" || name == "BOOL") return DType::Bool;
  if (name == "f64" || name == "float64" || name == "double" || name == "F64") return DType::F64;
  throw InvalidArgument("unknown dtype '" + std::string(name) +
                        "'; use one of f32, f16, bf16, i32, i64, u8, bool, f64");
}

bool is_floating(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16 || dtype == DType::F64;
}

float f16_to_float(f16_t v) {
  const uint32_t sign = (v.bits & 0x8000u) << 16;
  uint32_t exponent = (v.bits >> 10) & 0x1fu;
  uint32_t mantissa = v.bits & 0x3ffu;
  uint32_t out;
  if (exponent == 0x1f) {
    out = sign | 0x7f800000u | (mantissa << 13);  // inf / nan
  } else if (exponent == 0) {
    if (mantissa == 0) {
      out = sign;
    } else {  // subnormal: normalise
      int shift = 0;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        ++shift;
      }
      mantissa &= 0x3ffu;
      out = sign | (static_cast<uint32_t>(113 - shift) << 23) | (mantissa << 13);
    }
  } else {
    out = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

f16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16_t{static_cast<uint16_t>(sign | 0x7e00u)};   // nan
  if (abs >= 0x477ff000u) return f16_t{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow → inf
  if (abs < 0x38800000u) {  // result is subnormal or zero: round |f| * 2^24 to an integer
    float magnitude;
    std::memcpy(&magnitude, &abs, 4);
    const float scaled = magnitude * 16777216.0f;  // exact power-of-two scaling
    const auto rounded = static_cast<uint16_t>(std::nearbyint(scaled));  // ties-to-even mode
    return f16_t{static_cast<uint16_t>(sign | rounded)};
  }
  // normal: rebias exponent, round mantissa from 23 to 10 bits, ties to even
  uint32_t mant = abs + 0xfffu + ((abs >> 13) & 1u);
  mant -= 0x38000000u;  // exponent bias 127 → 15
  return f16_t{static_cast<uint16_t>(sign | (mant >> 13))};
}

double element_to_double(DType dtype, const void* p) {
  switch (dtype) {
    case DType::F64: {
      double v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case DType::F32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::F16: {
      f16_t v;
      std::memcpy(&v, p, 2);
      return f16_to_float(v);
    }
    case DType::BF16: {
      bf16_t v;
      std::memcpy(&v, p, 2);
      return bf16_to_float(v);
    }
    default:
      return static_cast<double>(element_to_int64(dtype, p));
  }
}

int64_t element_to_int64(DType dtype, const void* p) {
  switch (dtype) {
    case DType::I64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case DType::I32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::U8:
      return *static_cast<const uint8_t*>(p);
    case DType::Bool:
      return *static_cast<const uint8_t*>(p) != 0;
    default:
      throw InvalidArgument(std::string("element_to_int64: ") + dtype_name(dtype) +
                            " is not an integer dtype");
  }
}

float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::BF16:
      return bf16_to_float(float_to_bf16(value));
    case DType::F16:
      return f16_to_float(float_to_f16(value));
    default:
      return value;
  }
}

}  // namespace hk
