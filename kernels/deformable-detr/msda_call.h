// msda_call.h — kernels-community/deformable-detr: hk_call → msda::Problem for
// multi_scale_deformable_attention@1 (hk/layer_interfaces.h), shared by the cpu and cuda
// variants. Every tensor must be contiguous and of one floating dtype (else UNSUPPORTED: the
// caller makes them contiguous); shapes are checked against each other and the levels.
#pragma once

#include <string>

#include "hk/kernel_sdk.h"
#include "hk/layer_interfaces.h"
#include "msda_problem.h"

namespace msda {

inline bool contiguous(const hk_tensor& t) {
  int64_t expect = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expect) return false;
    expect *= t.shape[d];
  }
  return true;
}

inline std::string shape_of(const hk_tensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

inline const void* checked(const hk_tensor& t, const char* what, int32_t device, int ndim,
                           int32_t dtype) {
  using hk::sdk::fail;
  if (t.device_type != device)
    fail(HK_STATUS_INVALID_ARGUMENT, std::string(what) + " is on another device type");
  if (t.ndim != ndim)
    fail(HK_STATUS_INVALID_ARGUMENT,
         std::string(what) + " must have " + std::to_string(ndim) + " dims, got " + shape_of(t));
  if (t.dtype != dtype) fail(HK_STATUS_UNSUPPORTED, std::string(what) + ": mixed dtypes");
  if (!contiguous(t)) fail(HK_STATUS_UNSUPPORTED, std::string(what) + " must be contiguous");
  return static_cast<const char*>(t.data) + t.byte_offset;
}

// Inputs value, loc, att at `first`; the output (forward) or dout (backward) checked by the caller.
inline Problem problem_of(const hk_call& call, int first, int32_t device) {
  using hk::sdk::fail;
  const auto attrs = hk::sdk::read_attrs<hk::MsDeformAttnAttrs>(call);
  const hk_tensor& value = hk::sdk::input(call, first, "value");
  const hk_tensor& loc = hk::sdk::input(call, first + 1, "sampling_locations");
  const hk_tensor& att = hk::sdk::input(call, first + 2, "attention_weights");
  if (value.dtype != HK_DTYPE_F32 && value.dtype != HK_DTYPE_BF16 && value.dtype != HK_DTYPE_F16)
    fail(HK_STATUS_UNSUPPORTED, "value must be f32, bf16 or f16");
  Problem p{};
  p.dtype = value.dtype;
  p.value = checked(value, "value", device, 4, p.dtype);
  p.loc = checked(loc, "sampling_locations", device, 6, p.dtype);
  p.att = checked(att, "attention_weights", device, 5, p.dtype);
  p.batch = value.shape[0], p.rows = value.shape[1], p.heads = value.shape[2];
  p.channels = value.shape[3], p.queries = loc.shape[1], p.levels = loc.shape[3];
  p.points = loc.shape[4];
  if (attrs.num_levels == 0 || attrs.num_levels > hk::kMaxDeformableLevels ||
      static_cast<int64_t>(attrs.num_levels) != p.levels)
    fail(HK_STATUS_INVALID_ARGUMENT, "attrs.num_levels (" + std::to_string(attrs.num_levels) +
                                         ") must be sampling_locations' L (" +
                                         std::to_string(p.levels) + "), at most 16");
  int64_t start = 0;
  for (int64_t l = 0; l < p.levels; ++l) {
    p.height[l] = attrs.spatial_shapes[l][0];
    p.width[l] = attrs.spatial_shapes[l][1];
    if (p.height[l] <= 0 || p.width[l] <= 0)
      fail(HK_STATUS_INVALID_ARGUMENT, "level " + std::to_string(l) + " has an empty map");
    p.start[l] = start;
    start += p.height[l] * p.width[l];
  }
  if (start != p.rows)
    fail(HK_STATUS_INVALID_ARGUMENT, "value has " + std::to_string(p.rows) +
                                         " rows, the levels' h·w sum to " + std::to_string(start));
  if (loc.shape[0] != p.batch || loc.shape[2] != p.heads || loc.shape[5] != 2)
    fail(HK_STATUS_INVALID_ARGUMENT, "sampling_locations " + shape_of(loc) +
                                         " must be [B, Q, H, L, P, 2] for value " +
                                         shape_of(value));
  for (int d = 0; d < 5; ++d)
    if (att.shape[d] != loc.shape[d])
      fail(HK_STATUS_INVALID_ARGUMENT,
           "attention_weights " + shape_of(att) + " must be sampling_locations' leading dims");
  return p;
}

// [B, Q, H·D] of `p`'s dtype (out or dout).
inline void* checked_bqc(const hk_tensor& t, const char* what, const Problem& p, int32_t device) {
  const void* ptr = checked(t, what, device, 3, p.dtype);
  if (t.shape[0] != p.batch || t.shape[1] != p.queries || t.shape[2] != p.heads * p.channels)
    hk::sdk::fail(HK_STATUS_INVALID_ARGUMENT,
                  std::string(what) + " " + shape_of(t) + " must be [B, Q, H·D]");
  return const_cast<void*>(ptr);
}

// The optional backward outputs, each shaped like its input.
inline void backward_outputs(const hk_call& call, Problem& p, int32_t device) {
  const hk_tensor& value = hk::sdk::input(call, 1, "value");
  const hk_tensor& loc = hk::sdk::input(call, 2, "sampling_locations");
  const hk_tensor& att = hk::sdk::input(call, 3, "attention_weights");
  const hk_tensor* like[3] = {&value, &loc, &att};
  const char* names[3] = {"dvalue", "dsampling_locations", "dattention_weights"};
  void** slots[3] = {&p.dvalue, &p.dloc, &p.datt};
  for (int i = 0; i < 3; ++i) {
    const hk_tensor* t = hk::sdk::optional_output(call, i);
    if (!t) continue;
    if (!hk::sdk::same_shape(*t, *like[i]))
      hk::sdk::fail(HK_STATUS_INVALID_ARGUMENT,
                    std::string(names[i]) + " " + shape_of(*t) + " must be shaped like its input");
    *slots[i] = const_cast<void*>(checked(*t, names[i], device, t->ndim, p.dtype));
  }
}

}  // namespace msda
