// TensorView view algebra, Storage and Tensor factories. No arithmetic lives here.
#include "hk/tensor.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "core/copy_internal.h"
#include "hk/allocator.h"
#include "hk/error.h"

namespace hk {
namespace {

int wrap_dim(int dim, int ndim, const char* op) {
  const int d = dim < 0 ? dim + ndim : dim;
  if (d < 0 || d >= ndim)
    throw InvalidArgument(std::string(op) + ": dimension " + std::to_string(dim) +
                          " is out of range for a tensor of rank " + std::to_string(ndim));
  return d;
}

void set_contiguous_strides(TensorView& v) {
  checked_numel(v.shape, v.ndim, /*empty_as_one=*/true);  // so the products below cannot wrap
  int64_t s = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.strides[d] = s;
    s *= v.shape[d];
  }
}

[[noreturn]] void overflow(std::string_view what, const std::string& detail) {
  throw InvalidArgument(std::string(what) + " is too large: " + detail +
                        " does not fit in 64 bits; check the config or argument it comes from");
}

// One checked binary operation for both: negative operands are refused, overflow is a sentence.
template <class Op>
int64_t checked(int64_t a, int64_t b, std::string_view what, const char* sign, Op op) {
  int64_t out = 0;
  if (a < 0 || b < 0) throw InvalidArgument(std::string(what) + " must not be negative");
  if (op(a, b, &out)) overflow(what, std::to_string(a) + sign + std::to_string(b));
  return out;
}

}  // namespace

int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  return checked(a, b, what, " + ",
                 [](int64_t x, int64_t y, int64_t* r) { return __builtin_add_overflow(x, y, r); });
}

int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  return checked(a, b, what, " × ",
                 [](int64_t x, int64_t y, int64_t* r) { return __builtin_mul_overflow(x, y, r); });
}

int64_t checked_numel(const int64_t* dims, int ndim, bool empty_as_one) {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) {
    if (dims[d] < 0)
      throw InvalidArgument("negative dimension in shape " + shape_str(Shape(dims, dims + ndim)));
    const int64_t dim = empty_as_one ? std::max<int64_t>(dims[d], 1) : dims[d];
    if (__builtin_mul_overflow(n, dim, &n))
      overflow("the tensor shape " + shape_str(Shape(dims, dims + ndim)), "its element count");
  }
  return n;
}

size_t checked_nbytes(int64_t numel, DType dtype) {
  int64_t bytes = 0;
  if (numel < 0) throw InvalidArgument("a negative element count has no byte size");
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(dtype_size(dtype)), &bytes))
    overflow("a tensor of " + std::to_string(numel) + " " + dtype_name(dtype) + " elements",
             "its byte size");
  return static_cast<size_t>(bytes);
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

TensorView::TensorView(void* data_, Device device_, DType dtype_, const Shape& shape_)
    : data(data_), device(device_), dtype(dtype_) {
  if (shape_.size() > static_cast<size_t>(kMaxDims))
    throw InvalidArgument("tensor rank " + std::to_string(shape_.size()) + " exceeds the maximum " +
                          std::to_string(kMaxDims));
  ndim = static_cast<int32_t>(shape_.size());
  for (int d = 0; d < ndim; ++d) {
    if (shape_[d] < 0) throw InvalidArgument("negative dimension in shape " + shape_str(shape_));
    shape[d] = shape_[d];
  }
  set_contiguous_strides(*this);
}

int64_t TensorView::numel() const {
  return checked_numel(shape, ndim);
}

size_t TensorView::nbytes() const {
  return checked_nbytes(numel(), dtype);
}

int64_t TensorView::size(int dim) const {
  return shape[wrap_dim(dim, ndim, "size")];
}
int64_t TensorView::stride(int dim) const {
  return strides[wrap_dim(dim, ndim, "stride")];
}
Shape TensorView::sizes() const {
  return Shape(shape, shape + ndim);
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

bool TensorView::rows_are_dense() const {
  if (ndim == 0) return true;
  if (shape[ndim - 1] != 1 && strides[ndim - 1] != 1) return false;
  // leading dims must collapse into one row index with a single stride
  int64_t expected = -1;
  for (int d = ndim - 2; d >= 0; --d) {
    if (shape[d] == 1) continue;
    if (expected == -1) {
      if (strides[d] < shape[ndim - 1]) return false;
      expected = strides[d] * shape[d];
    } else {
      if (strides[d] != expected) return false;
      expected *= shape[d];
    }
  }
  return true;
}

TensorView TensorView::reshape(const Shape& new_shape_in) const {
  Shape new_shape = new_shape_in;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < new_shape.size(); ++i) {
    if (new_shape[i] == -1) {
      if (infer >= 0) throw InvalidArgument("reshape: only one dimension may be -1");
      infer = static_cast<int>(i);
    } else {
      if (new_shape[i] < 0)
        throw InvalidArgument("reshape: negative dimension in " + shape_str(new_shape_in));
      known = checked_mul(known, new_shape[i], "reshape target " + shape_str(new_shape_in));
    }
  }
  if (infer >= 0) new_shape[infer] = known ? numel() / known : 0;
  if (checked_numel(new_shape) != numel())
    throw InvalidArgument("reshape: cannot view " + shape_str(sizes()) + " as " +
                          shape_str(new_shape_in));
  TensorView out = *this;
  out.ndim = static_cast<int32_t>(new_shape.size());
  if (out.ndim > kMaxDims) throw InvalidArgument("reshape: rank exceeds the maximum");
  for (int d = 0; d < out.ndim; ++d) out.shape[d] = new_shape[d];
  if (is_contiguous()) {
    set_contiguous_strides(out);
    return out;
  }
  // Non-contiguous: chain strides chunk by chunk (the rule PyTorch's view() follows).
  int view_d = out.ndim - 1;
  int64_t chunk_base_stride = ndim ? strides[ndim - 1] : 1;
  int64_t tensor_numel = 1, view_numel = 1;
  for (int tensor_d = ndim - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= shape[tensor_d];
    if (tensor_d == 0 ||
        (shape[tensor_d - 1] != 1 && strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || out.shape[view_d] == 1)) {
        out.strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= out.shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel)
        throw InvalidArgument("reshape: the strided view " + str() + " cannot be viewed as " +
                              shape_str(new_shape_in) + " without a copy; call contiguous()");
      if (tensor_d > 0) {
        chunk_base_stride = strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1)
    throw InvalidArgument("reshape: the strided view " + str() + " cannot be viewed as " +
                          shape_str(new_shape_in) + " without a copy; call contiguous()");
  return out;
}

TensorView TensorView::slice(int dim, int64_t start, int64_t end, int64_t step) const {
  const int d = wrap_dim(dim, ndim, "slice");
  if (step <= 0) throw InvalidArgument("slice: step must be positive");
  const int64_t n = shape[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  TensorView out = *this;
  out.byte_offset += static_cast<uint64_t>(start * strides[d]) * dtype_size(dtype);
  out.shape[d] = (end - start + step - 1) / step;
  out.strides[d] = strides[d] * step;
  return out;
}

TensorView TensorView::select(int dim, int64_t index) const {
  const int d = wrap_dim(dim, ndim, "select");
  if (index < 0) index += shape[d];
  if (index < 0 || index >= shape[d])
    throw InvalidArgument("select: index " + std::to_string(index) + " out of range for size " +
                          std::to_string(shape[d]));
  TensorView out = *this;
  out.byte_offset += static_cast<uint64_t>(index * strides[d]) * dtype_size(dtype);
  for (int i = d; i < ndim - 1; ++i) {
    out.shape[i] = shape[i + 1];
    out.strides[i] = strides[i + 1];
  }
  out.ndim = ndim - 1;
  return out;
}

TensorView TensorView::transpose(int dim0, int dim1) const {
  const int a = wrap_dim(dim0, ndim, "transpose"), b = wrap_dim(dim1, ndim, "transpose");
  TensorView out = *this;
  std::swap(out.shape[a], out.shape[b]);
  std::swap(out.strides[a], out.strides[b]);
  return out;
}

TensorView TensorView::permute(const std::vector<int>& order) const {
  if (static_cast<int>(order.size()) != ndim)
    throw InvalidArgument("permute: order has " + std::to_string(order.size()) +
                          " entries for a tensor of rank " + std::to_string(ndim));
  TensorView out = *this;
  bool seen[kMaxDims] = {};
  for (int i = 0; i < ndim; ++i) {
    const int d = wrap_dim(order[i], ndim, "permute");
    if (seen[d]) throw InvalidArgument("permute: dimension repeated in order");
    seen[d] = true;
    out.shape[i] = shape[d];
    out.strides[i] = strides[d];
  }
  return out;
}

TensorView TensorView::unsqueeze(int dim) const {
  const int d = wrap_dim(dim, ndim + 1, "unsqueeze");
  if (ndim >= kMaxDims) throw InvalidArgument("unsqueeze: rank exceeds the maximum");
  TensorView out = *this;
  for (int i = ndim; i > d; --i) {
    out.shape[i] = shape[i - 1];
    out.strides[i] = strides[i - 1];
  }
  out.shape[d] = 1;
  out.strides[d] = d < ndim ? strides[d] * shape[d] : 1;
  out.ndim = ndim + 1;
  return out;
}

TensorView TensorView::squeeze(int dim) const {
  const int d = wrap_dim(dim, ndim, "squeeze");
  if (shape[d] != 1)
    throw InvalidArgument("squeeze: dimension " + std::to_string(dim) + " has size " +
                          std::to_string(shape[d]) + ", not 1");
  return select(d, 0);
}

TensorView TensorView::expand(const Shape& new_shape) const {
  const int n = static_cast<int>(new_shape.size());
  if (n < ndim || n > kMaxDims)
    throw InvalidArgument("expand: cannot expand " + shape_str(sizes()) + " to " +
                          shape_str(new_shape));
  TensorView out = *this;
  out.ndim = n;
  for (int i = n - 1, j = ndim - 1; i >= 0; --i, --j) {
    const int64_t src_size = j >= 0 ? shape[j] : 1;
    const int64_t src_stride = j >= 0 ? strides[j] : 0;
    const int64_t want = new_shape[i] == -1 ? src_size : new_shape[i];
    if (src_size == want) {
      out.shape[i] = want;
      out.strides[i] = src_stride;
    } else if (src_size == 1) {
      out.shape[i] = want;
      out.strides[i] = 0;
    } else {
      throw InvalidArgument("expand: cannot expand " + shape_str(sizes()) + " to " +
                            shape_str(new_shape));
    }
  }
  return out;
}

std::string TensorView::str() const {
  std::ostringstream os;
  os << dtype_name(dtype) << shape_str(sizes()) << " " << device.str();
  if (!is_contiguous()) os << " strides " << shape_str(Shape(strides, strides + ndim));
  return os.str();
}

bool same_shape(const TensorView& a, const TensorView& b) {
  if (a.ndim != b.ndim) return false;
  for (int d = 0; d < a.ndim; ++d)
    if (a.shape[d] != b.shape[d]) return false;
  return true;
}

Storage::Storage(Device device, size_t bytes, Stream stream)
    : device_(device), data_(device_alloc(device, bytes, stream)), bytes_(bytes), owned_(true) {}

Storage::Storage(Device device, void* data, size_t bytes, std::function<void(void*)> deleter)
    : device_(device), data_(data), bytes_(bytes), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (owned_) {
    device_free(device_, data_);
  } else if (deleter_) {
    deleter_(data_);
  }
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, Stream stream) {
  TensorView v(nullptr, device, dtype, shape);
  auto storage = std::make_shared<Storage>(device, v.nbytes(), stream);
  v.data = storage->data();
  return Tensor(std::move(storage), v);
}

Tensor Tensor::from_floats(const std::vector<float>& values, const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  if (static_cast<int64_t>(values.size()) != t.numel())
    throw InvalidArgument("from_floats: " + std::to_string(values.size()) + " values for shape " +
                          shape_str(shape));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::F32:
        t.data_as<float>()[i] = values[i];
        break;
      case DType::F64:
        t.data_as<double>()[i] = values[i];
        break;
      case DType::BF16:
        t.data_as<bf16_t>()[i] = float_to_bf16(values[i]);
        break;
      case DType::F16:
        t.data_as<f16_t>()[i] = float_to_f16(values[i]);
        break;
      default:
        throw InvalidArgument("from_floats: dtype must be floating");
    }
  }
  return t;
}

Tensor Tensor::from_ints(const std::vector<int64_t>& values, const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  if (static_cast<int64_t>(values.size()) != t.numel())
    throw InvalidArgument("from_ints: " + std::to_string(values.size()) + " values for shape " +
                          shape_str(shape));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::I64:
        t.data_as<int64_t>()[i] = values[i];
        break;
      case DType::I32:
        t.data_as<int32_t>()[i] = static_cast<int32_t>(values[i]);
        break;
      case DType::U8:
      case DType::Bool:
        t.data_as<uint8_t>()[i] = static_cast<uint8_t>(values[i]);
        break;
      default:
        throw InvalidArgument("from_ints: dtype must be an integer type");
    }
  }
  return t;
}

Tensor Tensor::contiguous(Stream stream) const {
  if (view_.is_contiguous()) return *this;
  return clone(stream);
}

Tensor Tensor::clone(Stream stream) const {
  Tensor out = empty(sizes(), dtype(), device(), stream);
  copy_view(out.view(), view_, stream);
  return out;
}

Tensor Tensor::to(Device target, Stream stream) const {
  if (target == device()) return *this;
  Tensor out = empty(sizes(), dtype(), target, stream);
  copy_view(out.view(), view_, stream);
  return out;
}

void Tensor::copy_from(const TensorView& src, Stream stream) const {
  copy_view(view_, src, stream);
}

namespace {
template <class Out, class F>
std::vector<Out> read_all(const Tensor& t, F convert) {
  if (!t.device().is_cpu())
    throw InvalidArgument("reading values needs a CPU tensor; call .to(Device::cpu()) first");
  Tensor c = t.contiguous();
  std::vector<Out> out(static_cast<size_t>(c.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = convert(c, i);
  return out;
}
}  // namespace

std::vector<double> Tensor::to_doubles() const {
  return read_all<double>(*this, [](const Tensor& c, size_t i) {
    return element_to_double(c.dtype(),
                             static_cast<const char*>(c.view().ptr()) + i * dtype_size(c.dtype()));
  });
}

std::vector<int64_t> Tensor::to_int64s() const {
  if (is_floating(dtype())) throw InvalidArgument("to_int64s: tensor is not of an integer dtype");
  return read_all<int64_t>(*this, [](const Tensor& c, size_t i) {
    return element_to_int64(c.dtype(),
                            static_cast<const char*>(c.view().ptr()) + i * dtype_size(c.dtype()));
  });
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device, Stream stream) {
  Tensor t = empty(shape, dtype, device, stream);
  detail::zero_contiguous(t.view(), stream);  // host memset or cudaMemsetAsync
  return t;
}

}  // namespace hk
