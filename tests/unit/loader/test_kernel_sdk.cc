// The kernel SDK's boundary helpers: exceptions become statuses with a (truncated) sentence,
// attrs of another length read as prefix + defaults, row layouts, and view conversions.
#include <gtest/gtest.h>

#include <stdexcept>

#include "hk/kernel_sdk.h"
#include "hk/layer_interfaces.h"

namespace hk {
namespace {

void throws_failure(const hk_call&) {
  sdk::fail(HK_STATUS_UNSUPPORTED, "no bf16 here");
}
void throws_std(const hk_call&) {
  throw std::runtime_error("boom");
}
void throws_oom(const hk_call&) {
  throw std::bad_alloc();
}
void succeeds(const hk_call&) {}

TEST(KernelSdk, ExceptionsBecomeStatusesWithMessages) {
  char message[8] = {};
  hk_call call{};
  call.error_message = message;
  call.error_message_size = sizeof(message);
  EXPECT_EQ(sdk::entry_point<succeeds>(&call), HK_STATUS_OK);
  EXPECT_EQ(sdk::entry_point<throws_failure>(&call), HK_STATUS_UNSUPPORTED);
  EXPECT_STREQ(message, "no bf16");  // truncated to the buffer, NUL-terminated
  EXPECT_EQ(sdk::entry_point<throws_std>(&call), HK_STATUS_INTERNAL);
  EXPECT_STREQ(message, "boom");
  EXPECT_EQ(sdk::entry_point<throws_oom>(&call), HK_STATUS_OUT_OF_MEMORY);
  EXPECT_EQ(sdk::entry_point<succeeds>(nullptr), HK_STATUS_INVALID_ARGUMENT);
  call.error_message = nullptr;  // no buffer: still a status, no crash
  EXPECT_EQ(sdk::entry_point<throws_std>(&call), HK_STATUS_INTERNAL);
}

TEST(KernelSdk, AttrsReadAsPrefixPlusDefaults) {
  hk_call call{};
  const float eps_only = 0.25f;  // an older caller that knew only `eps`
  call.attrs = &eps_only;
  call.attrs_size = sizeof(float);
  RmsNormAttrs a = sdk::read_attrs<RmsNormAttrs>(call);
  EXPECT_EQ(a.eps, 0.25f);
  EXPECT_EQ(a.offset, 0.0f);
  EXPECT_EQ(a.casting_mode, kRmsNormCastingLlama);
  struct Longer {
    RmsNormAttrs base;
    uint32_t future_field;
  } longer{{0.5f, 1.0f, kRmsNormCastingGemma, kAccumulateWeightGrads}, 7};
  call.attrs = &longer;
  call.attrs_size = sizeof(longer);
  a = sdk::read_attrs<RmsNormAttrs>(call);
  EXPECT_EQ(a.eps, 0.5f);
  EXPECT_EQ(a.casting_mode, kRmsNormCastingGemma);
  EXPECT_EQ(a.flags, kAccumulateWeightGrads);
  call.attrs = nullptr;
  EXPECT_EQ(sdk::read_attrs<RmsNormAttrs>(call).eps, RmsNormAttrs{}.eps);
}

TEST(KernelSdk, RowLayouts) {
  int64_t shape[3] = {2, 3, 4}, strides[3] = {12, 4, 1};
  hk_tensor t{};
  t.ndim = 3;
  t.shape = shape;
  t.strides = strides;
  int64_t row_stride = 0;
  EXPECT_TRUE(sdk::rows_dense(t, &row_stride));
  EXPECT_EQ(row_stride, 4);
  EXPECT_EQ(sdk::rows(t), 6);
  int64_t every_other_row[3] = {24, 8, 1};  // rows of a [2, 6, 4] sliced with step 2 on dim 1
  t.strides = every_other_row;
  EXPECT_TRUE(sdk::rows_dense(t, &row_stride));
  EXPECT_EQ(row_stride, 8);
  int64_t broken[3] = {100, 8, 1};  // leading dims do not collapse to one row stride
  t.strides = broken;
  EXPECT_FALSE(sdk::rows_dense(t, &row_stride));
  int64_t columns[3] = {12, 1, 3};  // transposed last two dims
  t.strides = columns;
  EXPECT_FALSE(sdk::rows_dense(t, &row_stride));
}

TEST(KernelSdk, TensorViewRoundTrip) {
  float data[12] = {};
  TensorView v(data, Device::cpu(), DType::BF16, {3, 4});
  v = v.slice(1, 1, 3);
  const hk_tensor t = sdk::to_hk_tensor(v);
  EXPECT_EQ(t.device_type, HK_DEVICE_CPU);
  EXPECT_EQ(t.dtype, HK_DTYPE_BF16);
  EXPECT_EQ(t.byte_offset, v.byte_offset);
  const TensorView back = sdk::to_tensor_view(t);
  EXPECT_EQ(back.str(), v.str());
  EXPECT_EQ(back.ptr(), v.ptr());
  hk_tensor bad = t;
  bad.dtype = 99;
  EXPECT_THROW(sdk::to_tensor_view(bad), sdk::Failure);
}

}  // namespace
}  // namespace hk
