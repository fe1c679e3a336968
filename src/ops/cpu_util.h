// Internal: strided element access for the CPU ops.
//
// The CPU ops are the simple reference: they load any view (any strides, any floating dtype) into
// a contiguous buffer of the compute type (float, or double for f64 tensors), compute there, and
// store back through the output's strides with one rounding. Loading everything before storing
// also makes outputs that alias inputs safe. Nothing here is tuned; matmul is the only op that
// cares about speed and it goes to BLAS.
#pragma once

#include <cstdint>
#include <vector>

#include "hk/dtype.h"
#include "hk/tensor.h"

namespace hk::ops::cpu {

// Calls f(byte_offset_from_ptr) for each element of `v` in row-major order of its shape.
template <class F>
void for_each_offset(const TensorView& v, F f) {
  const int64_t n = v.numel();
  if (n == 0) return;
  const int64_t es = static_cast<int64_t>(dtype_size(v.dtype));
  if (v.ndim == 0) {
    f(int64_t{0});
    return;
  }
  const int nd = v.ndim;
  const int64_t inner = v.shape[nd - 1], inner_stride = v.strides[nd - 1] * es;
  int64_t index[kMaxDims] = {};
  for (int64_t done = 0; done < n; done += inner) {
    int64_t base = 0;
    for (int d = 0; d < nd - 1; ++d) base += index[d] * v.strides[d] * es;
    for (int64_t i = 0; i < inner; ++i) f(base + i * inner_stride);
    for (int d = nd - 2; d >= 0; --d) {
      if (++index[d] < v.shape[d]) break;
      index[d] = 0;
    }
  }
}

template <class T>
inline T load_one(const char* p, DType dtype) {
  switch (dtype) {
    case DType::F32:
      return static_cast<T>(*reinterpret_cast<const float*>(p));
    case DType::F64:
      return static_cast<T>(*reinterpret_cast<const double*>(p));
    case DType::BF16:
      return static_cast<T>(bf16_to_float(*reinterpret_cast<const bf16_t*>(p)));
    case DType::F16:
      return static_cast<T>(f16_to_float(*reinterpret_cast<const f16_t*>(p)));
    case DType::I32:
      return static_cast<T>(*reinterpret_cast<const int32_t*>(p));
    case DType::I64:
      return static_cast<T>(*reinterpret_cast<const int64_t*>(p));
    case DType::U8:
    case DType::Bool:
      return static_cast<T>(*reinterpret_cast<const uint8_t*>(p));
  }
  return T{};
}

template <class T>
inline void store_one(char* p, DType dtype, T v) {
  switch (dtype) {
    case DType::F32:
      *reinterpret_cast<float*>(p) = static_cast<float>(v);
      break;
    case DType::F64:
      *reinterpret_cast<double*>(p) = static_cast<double>(v);
      break;
    case DType::BF16:
      *reinterpret_cast<bf16_t*>(p) = float_to_bf16(static_cast<float>(v));
      break;
    case DType::F16:
      *reinterpret_cast<f16_t*>(p) = float_to_f16(static_cast<float>(v));
      break;
    case DType::I32:
      *reinterpret_cast<int32_t*>(p) = static_cast<int32_t>(v);
      break;
    case DType::I64:
      *reinterpret_cast<int64_t*>(p) = static_cast<int64_t>(v);
      break;
    case DType::U8:
      *reinterpret_cast<uint8_t*>(p) = static_cast<uint8_t>(v);
      break;
    case DType::Bool:
      *reinterpret_cast<uint8_t*>(p) = v != T{} ? 1 : 0;
      break;
  }
}

// All elements of `v` converted to T, row-major.
template <class T>
std::vector<T> load(const TensorView& v) {
  std::vector<T> out(static_cast<size_t>(v.numel()));
  const char* base = static_cast<const char*>(v.ptr());
  size_t i = 0;
  for_each_offset(v, [&](int64_t off) { out[i++] = load_one<T>(base + off, v.dtype); });
  return out;
}

// Stores row-major `data` into `v` (rounding once to v's dtype).
template <class T>
void store(const TensorView& v, const T* data) {
  char* base = static_cast<char*>(v.ptr());
  size_t i = 0;
  for_each_offset(v, [&](int64_t off) { store_one<T>(base + off, v.dtype, data[i++]); });
}
template <class T>
void store(const TensorView& v, const std::vector<T>& data) {
  store(v, data.data());
}

// Rounds a compute value through `dtype` (identity for f32 into float and for f64).
template <class T>
inline T round_as(DType dtype, T v) {
  if (dtype == DType::F64) return v;
  return static_cast<T>(round_to(dtype, static_cast<float>(v)));
}

// Ids / labels / positions as int64.
inline std::vector<int64_t> load_ints(const TensorView& v) {
  return load<int64_t>(v);
}

}  // namespace hk::ops::cpu
