// Argument checks shared by the op dispatchers (see ops/dispatch.h). No op logic lives here.
#include "ops/dispatch.h"

namespace hk::ops::detail {

Checker::Checker(const char* op, std::initializer_list<Operand> operands) : op_(op) {
  for (const Operand& o : operands)
    if (o.view) operands_.push_back(o);
  if (!operands_.empty()) device_ = operands_.front().view->device;
  for (const Operand& o : operands_)
    require(o.view->device == device_, "all operands must be on one device");
}

std::string Checker::describe() const {
  std::string s;
  for (const Operand& o : operands_) {
    if (!s.empty()) s += ", ";
    s += std::string(o.name) + " " + o.view->str();
  }
  return s;
}

void Checker::require(bool cond, const std::string& what) const {
  if (!cond) throw InvalidArgument(std::string(op_) + ": " + what + " (got " + describe() + ")");
}

void Checker::floating(const TensorView& v, const char* name) const {
  require(is_floating(v.dtype), std::string(name) + " must be a floating dtype (f32, bf16, f16" +
                                    (device_.is_cpu() ? ", f64)" : ")"));
}

void Checker::float_dtype_in(const TensorView& v, const char* name,
                             std::initializer_list<DType> ok) const {
  bool found = false;
  std::string names;
  for (DType d : ok) {
    found = found || v.dtype == d;
    names += std::string(names.empty() ? "" : " or ") + dtype_name(d);
  }
  require(found, std::string(name) + " must be " + names);
}

void Checker::integer_ids(const TensorView& v, const char* name) const {
  require(v.dtype == DType::I32 || v.dtype == DType::I64,
          std::string(name) + " must be i32 or i64");
}

void Checker::rank(const TensorView& v, const char* name, int ndim) const {
  require(v.ndim == ndim, std::string(name) + " must have " + std::to_string(ndim) + " dims");
}

void Checker::min_rank(const TensorView& v, const char* name, int ndim) const {
  require(v.ndim >= ndim,
          std::string(name) + " must have at least " + std::to_string(ndim) + " dims");
}

void Checker::same_shape(const TensorView& a, const char* an, const TensorView& b,
                         const char* bn) const {
  require(hk::same_shape(a, b), std::string(an) + " and " + bn + " must have the same shape");
}

void Checker::same_dtype(const TensorView& a, const char* an, const TensorView& b,
                         const char* bn) const {
  require(a.dtype == b.dtype, std::string(an) + " and " + bn + " must have the same dtype");
}

void Checker::no_implementation() const {
  throw Unsupported(std::string(op_) + ": no implementation for device " + device_.str() +
                    " in this build (hk has cpu" +
#ifdef HK_HAVE_CUDA
                    " and cuda" +
#endif
                    std::string(" ops); move the tensors to a supported device (got ") +
                    describe() + ")");
}

void Checker::cpu_only_f64() const {
  for (const Operand& o : operands_)
    if (o.view->dtype == DType::F64)
      throw Unsupported(std::string(op_) + ": f64 is supported on cpu only (a reference dtype); " +
                        "use f32, bf16 or f16 on " + device_.str() + " (got " + describe() + ")");
}

}  // namespace hk::ops::detail
