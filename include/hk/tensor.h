// hk/tensor.h — TensorView (non-owning, DLTensor-like) and Tensor (shared storage + view).
//
// A TensorView is trivially copyable: base pointer, device, dtype, rank, shape, strides *in
// elements* and a byte offset — the same meaning as DLPack's DLTensor, with shape and strides held
// inline (rank ≤ 8) so a view can be passed by value across threads and into kernels. Strides are
// real: views made by slice/transpose/permute are not contiguous, and every op must either honour
// strides or call `contiguous()` first. A Tensor owns its storage through a shared_ptr; views of a
// Tensor share that storage. This header does no tensor arithmetic (ops live in hk/ops.h); the one
// arithmetic it does define is the checked size arithmetic every shape goes through.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hk/device.h"
#include "hk/dtype.h"
#include "hk/stream.h"

namespace hk {

inline constexpr int kMaxDims = 8;

using Shape = std::vector<int64_t>;

// Checked size arithmetic: the one place where tensor sizes, element counts, byte counts and
// lengths such as `prompt + max_new_tokens` are added and multiplied. Sizes come from files,
// configs and command lines, so an overflow is an InvalidArgument naming `what` (e.g. "the KV
// cache length"), never a wrapped value that allocates too little. Operands must be >= 0.
int64_t checked_add(int64_t a, int64_t b, std::string_view what);
int64_t checked_mul(int64_t a, int64_t b, std::string_view what);
// Product of `ndim` dims (each >= 0). Empty dims count as 1 when `empty_as_one` (what contiguous
// strides are computed from, so they cannot overflow either).
int64_t checked_numel(const int64_t* dims, int ndim, bool empty_as_one = false);
inline int64_t checked_numel(const Shape& shape) {
  return checked_numel(shape.data(), static_cast<int>(shape.size()));
}
// Bytes of `numel` elements of `dtype`, as an int64-representable size.
size_t checked_nbytes(int64_t numel, DType dtype);

struct TensorView {
  void* data = nullptr;  // base of the allocation (DLTensor.data)
  Device device;
  DType dtype = DType::F32;
  int32_t ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements, may be 0 (broadcast) but not negative
  uint64_t byte_offset = 0;

  TensorView() = default;
  // A contiguous (row-major) view over `data`.
  TensorView(void* data, Device device, DType dtype, const Shape& shape);

  // Address of element [0, 0, ...]: data + byte_offset.
  void* ptr() const { return static_cast<char*>(data) + byte_offset; }
  template <class T>
  T* data_as() const {
    return reinterpret_cast<T*>(ptr());
  }

  bool defined() const { return data != nullptr || (ndim > 0 && numel() == 0); }
  int64_t numel() const;  // checked: throws InvalidArgument when the product overflows int64
  size_t nbytes() const;  // numel * element size (bytes a contiguous copy occupies), checked
  // Dimension helpers accept negative indices (-1 = last). Out of range throws InvalidArgument.
  int64_t size(int dim) const;
  int64_t stride(int dim) const;
  Shape sizes() const;
  bool is_contiguous() const;
  // True when the last dimension has stride 1 and rows are laid out with a fixed row stride
  // (enough for most row-wise kernels, e.g. a slice of columns is not, a slice of rows is).
  bool rows_are_dense() const;

  // View ops (no copy). Each validates its arguments and throws InvalidArgument with the shapes.
  TensorView reshape(const Shape& shape) const;  // requires a layout that allows it without copy
  TensorView slice(int dim, int64_t start, int64_t end, int64_t step = 1) const;
  TensorView select(int dim, int64_t index) const;  // drops `dim`
  TensorView transpose(int dim0, int dim1) const;
  TensorView permute(const std::vector<int>& order) const;
  TensorView unsqueeze(int dim) const;
  TensorView squeeze(int dim) const;
  TensorView expand(const Shape& shape) const;  // broadcast size-1 dims via stride 0

  std::string str() const;  // "bf16[2, 3] cuda:0 strides [3, 1]"
};

bool same_shape(const TensorView& a, const TensorView& b);
std::string shape_str(const Shape& shape);

// Backing memory shared by a Tensor and all its views.
class Storage {
 public:
  Storage(Device device, size_t bytes, Stream stream = {});  // allocates via hk/allocator.h
  // Wraps foreign memory; `deleter` runs when the last reference goes (may be empty).
  Storage(Device device, void* data, size_t bytes, std::function<void(void*)> deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  Device device_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  std::function<void(void*)> deleter_;
  bool owned_ = false;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Storage> storage, const TensorView& view)
      : storage_(std::move(storage)), view_(view) {}

  // Uninitialised contiguous tensor.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu(),
                      Stream stream = {});
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu(),
                      Stream stream = {});
  // CPU tensor from float values, converted to `dtype` (test and fixture helper).
  static Tensor from_floats(const std::vector<float>& values, const Shape& shape,
                            DType dtype = DType::F32);
  static Tensor from_ints(const std::vector<int64_t>& values, const Shape& shape,
                          DType dtype = DType::I64);
  // Non-owning wrap of a view; the caller keeps the memory alive.
  static Tensor wrap(const TensorView& view) { return Tensor(nullptr, view); }

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }
  bool defined() const { return view_.data != nullptr || view_.ndim > 0; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  DType dtype() const { return view_.dtype; }
  Device device() const { return view_.device; }
  int ndim() const { return view_.ndim; }
  int64_t size(int dim) const { return view_.size(dim); }
  Shape sizes() const { return view_.sizes(); }
  int64_t numel() const { return view_.numel(); }
  size_t nbytes() const { return view_.nbytes(); }
  bool is_contiguous() const { return view_.is_contiguous(); }
  template <class T>
  T* data_as() const {
    return view_.data_as<T>();
  }

  // Views sharing storage.
  Tensor reshape(const Shape& shape) const { return {storage_, view_.reshape(shape)}; }
  Tensor slice(int dim, int64_t start, int64_t end, int64_t step = 1) const {
    return {storage_, view_.slice(dim, start, end, step)};
  }
  Tensor select(int dim, int64_t index) const { return {storage_, view_.select(dim, index)}; }
  Tensor transpose(int d0, int d1) const { return {storage_, view_.transpose(d0, d1)}; }
  Tensor permute(const std::vector<int>& order) const { return {storage_, view_.permute(order)}; }
  Tensor unsqueeze(int dim) const { return {storage_, view_.unsqueeze(dim)}; }
  Tensor squeeze(int dim) const { return {storage_, view_.squeeze(dim)}; }
  Tensor expand(const Shape& shape) const { return {storage_, view_.expand(shape)}; }

  // Copies (same dtype). `contiguous` returns *this when already contiguous.
  Tensor contiguous(Stream stream = {}) const;
  Tensor clone(Stream stream = {}) const;
  // Copy to another device (same dtype). Host<->device copies synchronise `stream`.
  Tensor to(Device device, Stream stream = {}) const;
  // Copies `src` into this tensor's elements (same shape and dtype, any strides, any devices).
  void copy_from(const TensorView& src, Stream stream = {}) const;

  // CPU-only conveniences for tests and tools: values converted to double / int64.
  std::vector<double> to_doubles() const;
  std::vector<int64_t> to_int64s() const;

 private:
  std::shared_ptr<Storage> storage_;
  TensorView view_;
};

// Strided copy between two views of equal shape and dtype on any devices (the core copy kernel).
void copy_view(const TensorView& dst, const TensorView& src, Stream stream = {});

}  // namespace hk
