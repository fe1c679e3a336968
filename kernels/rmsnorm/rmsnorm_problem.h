// rmsnorm_problem.h — argument checks for rms_norm@1 shared by the cpu and cuda variants.
//
// Turns an hk_call into a flat description (rows × hidden, row strides, dtypes) after checking
// everything the interface requires (see include/hk/layer_interfaces.h, rms_norm@1). Kernels
// then only handle "rows with a fixed stride, unit stride along hidden"; other layouts are
// refused as UNSUPPORTED so the caller can make them contiguous. No arithmetic here.
#pragma once

#include <string>

#include "hk/kernel_sdk.h"
#include "hk/layer_interfaces.h"

namespace rmsnorm {

using hk::sdk::fail;

struct RowTensor {
  const hk_tensor* t = nullptr;  // null when absent
  void* ptr = nullptr;           // element [0, ..., 0]
  int64_t row_stride = 0;        // elements
  int32_t dtype = 0;
};

struct Problem {
  int64_t rows = 0;
  int64_t hidden = 0;
  hk::RmsNormAttrs attrs;
  RowTensor x, weight, rstd;  // forward & backward
  RowTensor y;                // forward
  RowTensor dy, dx, dweight;  // backward
};

inline bool is_float(int32_t dtype) {
  return dtype == HK_DTYPE_F32 || dtype == HK_DTYPE_BF16 || dtype == HK_DTYPE_F16;
}

inline RowTensor row_tensor(const hk_tensor& t, const char* what, int64_t rows, int64_t hidden,
                            int32_t device_type) {
  if (t.device_type != device_type) {
    fail(HK_STATUS_INVALID_ARGUMENT,
         std::string(what) + " is on another device type than this kernel");
  }
  if (hk::sdk::last_dim(t) != hidden || hk::sdk::rows(t) != rows) {
    fail(HK_STATUS_INVALID_ARGUMENT, std::string(what) + " must have " + std::to_string(rows) +
                                         " rows of " + std::to_string(hidden) + " elements");
  }
  RowTensor r;
  r.t = &t;
  r.dtype = t.dtype;
  r.ptr = hk::sdk::data_ptr<char>(t);
  if (!hk::sdk::rows_dense(t, &r.row_stride)) {
    fail(HK_STATUS_UNSUPPORTED, std::string(what) +
                                    " is not laid out as rows with unit stride along the last dim; "
                                    "make it contiguous");
  }
  return r;
}

inline void check_common(Problem& p, const hk_tensor& x, const hk_tensor& weight,
                         int32_t device_type) {
  if (x.ndim < 1) fail(HK_STATUS_INVALID_ARGUMENT, "rms_norm: x needs at least one dimension");
  if (!is_float(x.dtype)) fail(HK_STATUS_UNSUPPORTED, "rms_norm: x must be f32, bf16 or f16");
  if (!is_float(weight.dtype))
    fail(HK_STATUS_UNSUPPORTED, "rms_norm: weight must be f32, bf16 or f16");
  p.hidden = hk::sdk::last_dim(x);
  p.rows = hk::sdk::rows(x);
  if (weight.ndim != 1 || weight.shape[0] != p.hidden) {
    fail(HK_STATUS_INVALID_ARGUMENT,
         "rms_norm: weight must be [" + std::to_string(p.hidden) + "] to match x's last dim");
  }
  p.x = row_tensor(x, "x", p.rows, p.hidden, device_type);
  p.weight = row_tensor(weight, "weight", 1, p.hidden, device_type);
  // none (2) is gemma's f32 formula by the interface's definition, so both take the same path.
  if (p.attrs.casting_mode != hk::kRmsNormCastingLlama &&
      p.attrs.casting_mode != hk::kRmsNormCastingGemma &&
      p.attrs.casting_mode != hk::kRmsNormCastingNone) {
    fail(HK_STATUS_INVALID_ARGUMENT, "rms_norm: casting_mode " +
                                         std::to_string(p.attrs.casting_mode) +
                                         " is not defined (0 llama, 1 gemma, 2 none)");
  }
  if (!(p.attrs.eps >= 0.0f)) fail(HK_STATUS_INVALID_ARGUMENT, "rms_norm: eps must be >= 0");
}

inline void check_rstd(Problem& p, const hk_tensor* rstd, int32_t device_type) {
  if (rstd == nullptr) return;
  if (rstd->dtype != HK_DTYPE_F32) fail(HK_STATUS_INVALID_ARGUMENT, "rms_norm: rstd must be f32");
  if (hk::sdk::numel(*rstd) != p.rows) {
    fail(HK_STATUS_INVALID_ARGUMENT,
         "rms_norm: rstd must have one value per row (" + std::to_string(p.rows) + ")");
  }
  if (rstd->device_type != device_type)
    fail(HK_STATUS_INVALID_ARGUMENT, "rstd is on another device type than this kernel");
  // rstd holds one value per row: a [rows] vector with any stride, or a contiguous tensor shaped
  // like x's leading dims.
  int64_t stride = 1;
  if (rstd->ndim == 1) {
    stride = rstd->strides[0];
  } else {
    int64_t expect = 1;
    for (int32_t i = rstd->ndim - 1; i >= 0; --i) {
      if (rstd->shape[i] != 1 && rstd->strides[i] != expect)
        fail(HK_STATUS_UNSUPPORTED, "rms_norm: rstd must be contiguous");
      expect *= rstd->shape[i];
    }
  }
  p.rstd.t = rstd;
  p.rstd.dtype = HK_DTYPE_F32;
  p.rstd.ptr = hk::sdk::data_ptr<char>(*rstd);
  p.rstd.row_stride = stride;
}

// inputs: x, weight   outputs: y, rstd?
inline Problem forward_problem(const hk_call& call, int32_t device_type) {
  Problem p;
  p.attrs = hk::sdk::read_attrs<hk::RmsNormAttrs>(call);
  const hk_tensor& x = hk::sdk::input(call, 0, "x");
  const hk_tensor& weight = hk::sdk::input(call, 1, "weight");
  check_common(p, x, weight, device_type);
  const hk_tensor& y = hk::sdk::output(call, 0, "y");
  if (!hk::sdk::same_shape(x, y))
    fail(HK_STATUS_INVALID_ARGUMENT, "rms_norm: y must have x's shape");
  if (!is_float(y.dtype)) fail(HK_STATUS_UNSUPPORTED, "rms_norm: y must be f32, bf16 or f16");
  p.y = row_tensor(y, "y", p.rows, p.hidden, device_type);
  check_rstd(p, hk::sdk::optional_output(call, 1), device_type);
  return p;
}

// inputs: dy, x, weight, rstd?   outputs: dx, dweight?
inline Problem backward_problem(const hk_call& call, int32_t device_type) {
  Problem p;
  p.attrs = hk::sdk::read_attrs<hk::RmsNormAttrs>(call);
  const hk_tensor& dy = hk::sdk::input(call, 0, "dy");
  const hk_tensor& x = hk::sdk::input(call, 1, "x");
  const hk_tensor& weight = hk::sdk::input(call, 2, "weight");
  check_common(p, x, weight, device_type);
  if (!hk::sdk::same_shape(x, dy))
    fail(HK_STATUS_INVALID_ARGUMENT, "rms_norm: dy must have x's shape");
  if (!is_float(dy.dtype)) fail(HK_STATUS_UNSUPPORTED, "rms_norm: dy must be f32, bf16 or f16");
  p.dy = row_tensor(dy, "dy", p.rows, p.hidden, device_type);
  check_rstd(p, hk::sdk::optional_input(call, 3), device_type);
  const hk_tensor& dx = hk::sdk::output(call, 0, "dx");
  if (!hk::sdk::same_shape(x, dx))
    fail(HK_STATUS_INVALID_ARGUMENT, "rms_norm: dx must have x's shape");
  if (!is_float(dx.dtype)) fail(HK_STATUS_UNSUPPORTED, "rms_norm: dx must be f32, bf16 or f16");
  p.dx = row_tensor(dx, "dx", p.rows, p.hidden, device_type);
  if (const hk_tensor* dweight = hk::sdk::optional_output(call, 1)) {
    if (dweight->ndim != 1 || dweight->shape[0] != p.hidden)
      fail(HK_STATUS_INVALID_ARGUMENT, "rms_norm: dweight must have weight's shape");
    if (!is_float(dweight->dtype))
      fail(HK_STATUS_UNSUPPORTED, "rms_norm: dweight must be f32, bf16 or f16");
    p.dweight = row_tensor(*dweight, "dweight", 1, p.hidden, device_type);
  }
  return p;
}

}  // namespace rmsnorm
