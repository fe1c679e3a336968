// Test kernels with layouts (kernelize fusion and stateful-kernel tests), f32 cpu, dense rows:
//   RMSNormMLP          rms_norm_mlp@1 with RMSNormMLPLayout: norm weight, gate_up = concat(gate,
//                       up) along dim 0, down — replaces post_attention_layernorm + mlp
//   ScaledRMSNorm       rms_norm@1 with ScaledRMSNormLayout: its own parameter "scale", renamed
//                       from the checkpoint's "weight"
//   RMSNormMLPNoLayout  rms_norm_mlp@1 without a layout (fusion must refuse it)
#include <cmath>
#include <vector>

#include "hk/kernel_sdk.h"
#include "hk/layer_interfaces.h"

namespace {

const float* cf(const hk_tensor& t) {
  return reinterpret_cast<const float*>(static_cast<const char*>(t.data) + t.byte_offset);
}
float* mf(const hk_tensor& t) {
  return reinterpret_cast<float*>(static_cast<char*>(t.data) + t.byte_offset);
}
void need_f32_dense(const hk_tensor& t, const char* what) {
  int64_t row_stride = 0;
  if (t.dtype != HK_DTYPE_F32 || !hk::sdk::rows_dense(t, &row_stride) ||
      row_stride != hk::sdk::last_dim(t))
    hk::sdk::fail(HK_STATUS_UNSUPPORTED,
                  std::string("test kernel: ") + what + " must be contiguous f32");
}

void rms_norm_rows(const float* x, const float* w, float eps, int64_t rows, int64_t h, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    float sum = 0;
    for (int64_t j = 0; j < h; ++j) sum += x[r * h + j] * x[r * h + j];
    const float rstd = 1.0f / std::sqrt(sum / static_cast<float>(h) + eps);
    for (int64_t j = 0; j < h; ++j) y[r * h + j] = x[r * h + j] * rstd * w[j];
  }
}

void fused_forward(const hk_call& call) {
  const hk_tensor& x = hk::sdk::input(call, 0, "x");
  const hk_tensor& norm_w = hk::sdk::input(call, 1, "post_attention_layernorm.weight");
  const hk_tensor& gate_up = hk::sdk::input(call, 2, "mlp.gate_up_proj.weight");
  const hk_tensor& down = hk::sdk::input(call, 3, "mlp.down_proj.weight");
  const hk_tensor& y = hk::sdk::output(call, 0, "y");
  for (auto* t : {&x, &norm_w, &gate_up, &down, &y}) need_f32_dense(*t, "every tensor");
  const auto* attrs = static_cast<const hk::RmsNormMlpAttrs*>(call.attrs);
  const int64_t h = hk::sdk::last_dim(x), rows = hk::sdk::rows(x), inter = gate_up.shape[0] / 2;
  std::vector<float> n(static_cast<size_t>(rows * h)), a(static_cast<size_t>(inter));
  rms_norm_rows(cf(x), cf(norm_w), attrs->eps, rows, h, n.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < inter; ++i) {
      float g = 0, u = 0;
      for (int64_t j = 0; j < h; ++j) {
        g += n[r * h + j] * cf(gate_up)[i * h + j];
        u += n[r * h + j] * cf(gate_up)[(inter + i) * h + j];
      }
      a[i] = g / (1.0f + std::exp(-g)) * u;
    }
    for (int64_t j = 0; j < h; ++j) {
      float acc = 0;
      for (int64_t i = 0; i < inter; ++i) acc += a[i] * cf(down)[j * inter + i];
      mf(y)[r * h + j] = acc;
    }
  }
}

void scaled_rms_norm_forward(const hk_call& call) {
  const hk_tensor& x = hk::sdk::input(call, 0, "x");
  const hk_tensor& scale = hk::sdk::input(call, 1, "scale");
  const hk_tensor& y = hk::sdk::output(call, 0, "y");
  for (auto* t : {&x, &scale, &y}) need_f32_dense(*t, "every tensor");
  const auto* attrs = static_cast<const hk::RmsNormAttrs*>(call.attrs);
  rms_norm_rows(cf(x), cf(scale), attrs->eps, hk::sdk::rows(x), hk::sdk::last_dim(x), mf(y));
}

const char* const kFusedParameters[] = {"post_attention_layernorm.weight",
                                        "mlp.gate_up_proj.weight", "mlp.down_proj.weight"};
const char* const kGateUpSources[] = {"mlp.gate_proj.weight", "mlp.up_proj.weight"};
const hk_conversion kFusedConversions[] = {
    {"mlp.gate_up_proj.weight", kGateUpSources, 2, HK_CONVERT_CONCAT, 0}};
const hk_layout kFusedLayout = {"RMSNormMLPLayout", kFusedParameters, 3, kFusedConversions, 1};

const char* const kScaleParameters[] = {"scale"};
const char* const kScaleSources[] = {"weight"};
const hk_conversion kScaleConversions[] = {{"scale", kScaleSources, 1, HK_CONVERT_RENAME, 0}};
const hk_layout kScaleLayout = {"ScaledRMSNormLayout", kScaleParameters, 1, kScaleConversions, 1};

}  // namespace

static const hk_kernel_entry kEntries[] = {
    hk::sdk::make_entry({.name = "RMSNormMLP",
                         .interface = "rms_norm_mlp",
                         .interface_version = 1,
                         .modes = HK_MODE_INFERENCE,
                         .device = "cpu",
                         .dtypes = HK_DTYPE_BIT(HK_DTYPE_F32),
                         .forward = hk::sdk::entry_point<fused_forward>,
                         .layout = &kFusedLayout}),
    hk::sdk::make_entry({.name = "ScaledRMSNorm",
                         .interface = "rms_norm",
                         .interface_version = 1,
                         .modes = HK_MODE_INFERENCE,
                         .device = "cpu",
                         .dtypes = HK_DTYPE_BIT(HK_DTYPE_F32),
                         .forward = hk::sdk::entry_point<scaled_rms_norm_forward>,
                         .layout = &kScaleLayout}),
    hk::sdk::make_entry({.name = "RMSNormMLPNoLayout",
                         .interface = "rms_norm_mlp",
                         .interface_version = 1,
                         .modes = HK_MODE_INFERENCE,
                         .device = "cpu",
                         .dtypes = HK_DTYPE_BIT(HK_DTYPE_F32),
                         .forward = hk::sdk::entry_point<fused_forward>}),
};

HK_KERNEL_LIBRARY(kEntries)
