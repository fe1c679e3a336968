// dtype names and the 16-bit conversions: exhaustive round trips and ties-to-even.
#include <gtest/gtest.h>

#include <cmath>

#include "hk/dtype.h"
#include "hk/error.h"

namespace hk {

TEST(DType, NamesRoundTrip) {
  for (DType d : {DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U8,
                  DType::Bool, DType::F64})
    EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::BF16);
  EXPECT_THROW(parse_dtype("f8"), InvalidArgument);
}

TEST(DType, Bf16AllBitPatternsRoundTrip) {
  for (uint32_t b = 0; b < 65536; ++b) {
    bf16_t v{static_cast<uint16_t>(b)};
    float f = bf16_to_float(v);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f))));
      continue;
    }
    EXPECT_EQ(float_to_bf16(f).bits, v.bits) << b;
  }
}

TEST(DType, F16AllBitPatternsRoundTrip) {
  for (uint32_t b = 0; b < 65536; ++b) {
    f16_t v{static_cast<uint16_t>(b)};
    float f = f16_to_float(v);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f))));
      continue;
    }
    EXPECT_EQ(float_to_f16(f).bits, v.bits) << b;
  }
}

TEST(DType, RoundToNearestEven) {
  // 1 + 2^-8 is exactly between bf16 1.0 and 1.0078125: ties to even → 1.0
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  // 1 + 3·2^-8 is between 1.0078125 (odd) and 1.015625 (even) → 1.015625
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3.0f / 256)), 1.015625f);
  // f16: 1 + 2^-11 ties to 1.0, 1 + 3·2^-11 → 1 + 2^-9
  EXPECT_EQ(f16_to_float(float_to_f16(1.0f + 1.0f / 2048)), 1.0f);
  EXPECT_EQ(f16_to_float(float_to_f16(1.0f + 3.0f / 2048)), 1.0f + 1.0f / 512);
  EXPECT_TRUE(std::isinf(f16_to_float(float_to_f16(70000.0f))));
  EXPECT_EQ(f16_to_float(float_to_f16(65504.0f)), 65504.0f);
  // smallest subnormal and rounding into subnormals
  EXPECT_EQ(f16_to_float(float_to_f16(5.9604645e-8f)), 5.9604645e-8f);
  EXPECT_EQ(f16_to_float(float_to_f16(2.9802322e-8f)), 0.0f);  // half of smallest: ties to even 0
}

}  // namespace hk
