// custom_rmsnorm.h — owner/my-kernel, the writing guide's stateful kernel in hk's form: the entry
// `CustomRMSNorm` (rms_norm@1, forward only) and its layout `CustomRMSNormLayout`, which holds
// the parameter `scale` made from the replaced RMSNorm's checkpoint key `weight`
// (conversion_mapping: a rename). variance_epsilon is the layer's eps (RmsNormAttrs::eps).
//
// forward (the guide's CustomRMSNorm.forward): with h = x in f32,
//   y = scale · round_to(x.dtype, h · rsqrt(mean(h²) + variance_epsilon)), rounded to y's dtype
// Inputs x [..., H] and scale [H] (same floating dtype, rows dense), output y like x. The cpu
// (custom_rmsnorm_cpu.cc) and cuda (custom_rmsnorm_cuda_library.cc + custom_rmsnorm_cuda.cu)
// variants share the checks here.
#pragma once

#include <string>

#include "custom_rmsnorm_rows.h"
#include "hk/kernel_sdk.h"
#include "hk/layer_interfaces.h"

namespace custom_rmsnorm {

inline Rows check(const hk_call& call, int32_t device) {
  using hk::sdk::fail;
  const auto attrs = hk::sdk::read_attrs<hk::RmsNormAttrs>(call);
  if (attrs.casting_mode != hk::kRmsNormCastingLlama || attrs.offset != 0.0f)
    fail(HK_STATUS_UNSUPPORTED, "CustomRMSNorm computes the llama casting without an offset");
  const hk_tensor& x = hk::sdk::input(call, 0, "x");
  const hk_tensor& scale = hk::sdk::input(call, 1, "scale");
  const hk_tensor& y = hk::sdk::output(call, 0, "y");
  for (const hk_tensor* t : {&x, &scale, &y}) {
    if (t->device_type != device)
      fail(HK_STATUS_INVALID_ARGUMENT, "CustomRMSNorm: a tensor is on another device");
    if (t->dtype != x.dtype) fail(HK_STATUS_UNSUPPORTED, "CustomRMSNorm: mixed dtypes");
  }
  if (x.dtype != HK_DTYPE_F32 && x.dtype != HK_DTYPE_BF16 && x.dtype != HK_DTYPE_F16)
    fail(HK_STATUS_UNSUPPORTED, "CustomRMSNorm computes in f32, bf16 or f16");
  if (!hk::sdk::same_shape(x, y)) fail(HK_STATUS_INVALID_ARGUMENT, "y's shape differs from x's");
  Rows r{};
  r.hidden = hk::sdk::last_dim(x);
  r.rows = hk::sdk::rows(x);
  int64_t scale_stride = 0;
  if (!hk::sdk::rows_dense(x, &r.x_stride) || !hk::sdk::rows_dense(y, &r.y_stride) ||
      !hk::sdk::rows_dense(scale, &scale_stride))
    fail(HK_STATUS_UNSUPPORTED, "CustomRMSNorm takes rows with a contiguous last dimension");
  if (scale.ndim != 1 || scale.shape[0] != r.hidden)
    fail(HK_STATUS_INVALID_ARGUMENT, "scale must be [H], H = " + std::to_string(r.hidden));
  r.x = hk::sdk::data_ptr<const char>(x);
  r.scale = hk::sdk::data_ptr<const char>(scale);
  r.y = hk::sdk::data_ptr<char>(y);
  r.dtype = x.dtype;
  r.eps = attrs.eps;
  return r;
}

// The layout: `scale` is the checkpoint's `weight` under a new name.
inline const char* const kParameters[] = {"scale"};
inline const char* const kScaleSources[] = {"weight"};
inline const hk_conversion kConversions[] = {{"scale", kScaleSources, 1, HK_CONVERT_RENAME, 0}};
inline const hk_layout kLayout = {"CustomRMSNormLayout", kParameters, 1, kConversions, 1};

}  // namespace custom_rmsnorm
