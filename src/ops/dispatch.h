// Internal: argument checking and device dispatch shared by the op dispatchers (src/ops/<op>.cc).
//
// A Checker names the op and its operands once, so every failed check throws InvalidArgument with
// a sentence that names the op and shows every operand (TensorView::str()). HK_OPS_DISPATCH then
// calls hk::ops::cpu::<op> or hk::ops::cuda::<op> for the operands' common device. Implementations
// behind it may assume everything checked here; they do no checking of their own beyond data-
// dependent errors (e.g. an id out of range).
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "hk/error.h"
#include "hk/ops.h"
#include "ops/cpu_ops.h"
#ifdef HK_HAVE_CUDA
#include "ops/cuda_ops.h"
#endif

namespace hk::ops::detail {

struct Operand {
  const char* name;
  const TensorView* view;  // null for an optional operand that was not given
};

class Checker {
 public:
  Checker(const char* op, std::initializer_list<Operand> operands);

  // Throws InvalidArgument "<op>: <what> (operands...)" unless `cond`.
  void require(bool cond, const std::string& what) const;
  // All given operands on one device; returns it.
  Device device() const { return device_; }

  void floating(const TensorView& v, const char* name) const;
  void float_dtype_in(const TensorView& v, const char* name, std::initializer_list<DType> ok) const;
  void integer_ids(const TensorView& v, const char* name) const;  // i32 or i64
  void rank(const TensorView& v, const char* name, int ndim) const;
  void min_rank(const TensorView& v, const char* name, int ndim) const;
  void same_shape(const TensorView& a, const char* an, const TensorView& b, const char* bn) const;
  void same_dtype(const TensorView& a, const char* an, const TensorView& b, const char* bn) const;

  // Throws Unsupported: no implementation of this op for the operands' device (or f64 off CPU).
  [[noreturn]] void no_implementation() const;
  // f64 is a CPU reference dtype; device implementations never see it.
  void cpu_only_f64() const;

 private:
  std::string describe() const;
  const char* op_;
  std::vector<Operand> operands_;
  Device device_;
};

// Number of rows of a tensor that an op treats as [rows, last dim].
inline int64_t rows_of(const TensorView& v) {
  int64_t r = 1;
  for (int d = 0; d + 1 < v.ndim; ++d) r *= v.shape[d];
  return r;
}

}  // namespace hk::ops::detail

#ifdef HK_HAVE_CUDA
#define HK_OPS_DISPATCH_CUDA_(checker, name, ...) \
  if ((checker).device().is_cuda()) {             \
    (checker).cpu_only_f64();                     \
    ::hk::ops::cuda::name(__VA_ARGS__);           \
    return;                                       \
  }
#else
#define HK_OPS_DISPATCH_CUDA_(checker, name, ...)
#endif

// Calls hk::ops::cpu::name(args...) or hk::ops::cuda::name(args...) and returns from the caller.
#define HK_OPS_DISPATCH(checker, name, ...)           \
  do {                                                \
    if ((checker).device().is_cpu()) {                \
      ::hk::ops::cpu::name(__VA_ARGS__);              \
      return;                                         \
    }                                                 \
    HK_OPS_DISPATCH_CUDA_(checker, name, __VA_ARGS__) \
    (checker).no_implementation();                    \
  } while (0)
