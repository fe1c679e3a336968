// hk/safetensors.h — read (mmap, fully validated) and write (atomically) safetensors files.
//
// The format: 8 bytes little-endian u64 N, then N bytes of UTF-8 JSON (an object mapping tensor
// names to {"dtype", "shape", "data_offsets": [begin, end)} plus an optional "__metadata__"
// string→string map, padded with trailing spaces), then the data buffer. Opening a file validates
// everything before any tensor is touched: the header length cap (100 MB) and bounds, JSON, the
// dtype names, shapes (non-negative, no int64 overflow), offsets (two increasing integers inside
// the buffer, size = numel × element size), and that the tensors cover the data buffer exactly —
// no overlaps and no holes, as the safetensors specification requires. Every failure is an
// hk::InvalidArgument naming the file and the tensor.
//
// Tensors of dtypes hk cannot compute with (I8, I16, U16, U32, U64, F8_E4M3, F8_E5M2) are listed
// with `dtype == std::nullopt`; viewing or loading them throws Unsupported with a sentence.
// Deliberately not here: sharded checkpoints (hk/checkpoint.h), lazy header-only reads over HTTP,
// sub-byte dtypes (F4, F6_*), and big-endian hosts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hk/device.h"
#include "hk/dtype.h"
#include "hk/stream.h"
#include "hk/tensor.h"

namespace hk {

// One entry of a safetensors header.
struct TensorInfo {
  std::string name;
  std::string dtype_name;      // as written in the file: "BF16", "F8_E4M3", ...
  std::optional<DType> dtype;  // the hk dtype, or nullopt when hk cannot compute with it
  Shape shape;
  uint64_t data_begin = 0;  // [data_begin, data_end) relative to the start of the data buffer
  uint64_t data_end = 0;

  int64_t numel() const;
  uint64_t nbytes() const { return data_end - data_begin; }
};

// Element size in bytes of a safetensors dtype name, or 0 when the name is not a known one.
size_t safetensors_dtype_size(std::string_view dtype_name);
// The safetensors name of an hk dtype ("F32", "BF16", "BOOL", ...).
const char* safetensors_dtype_name(DType dtype);

// Largest header accepted, in bytes (the limit the reference implementation uses).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// An opened, validated safetensors file. A cheap handle: copies share the same mapping, which
// stays alive while any copy or any Tensor returned by `tensor()` exists.
class SafetensorsFile {
 public:
  // Maps and validates `path`. Throws NotFound when it cannot be opened, InvalidArgument when
  // it is malformed.
  static SafetensorsFile open(const std::string& path);
  // Validates an in-memory copy of a file (fuzzing, tests, buffers from elsewhere); `label`
  // stands for the file name in error messages.
  static SafetensorsFile from_bytes(const void* data, size_t size,
                                    const std::string& label = "<memory>");

  const std::string& path() const;
  // Entries in name order.
  const std::vector<TensorInfo>& tensors() const;
  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  const TensorInfo& info(std::string_view name) const;  // throws NotFound naming the file
  const std::map<std::string, std::string>& metadata() const;
  uint64_t header_bytes() const;  // N, the JSON header length (with padding)
  uint64_t data_bytes() const;    // size of the data buffer
  // Offset of the first byte of the data buffer from the start of the file (8 + N).
  uint64_t data_start() const { return 8 + header_bytes(); }

  // Zero-copy, read-only CPU view into the mapping; valid while this handle (or a copy) lives.
  // Writing through it faults. Throws Unsupported for dtypes hk cannot use, for rank > 8, and when
  // the data is not aligned to the element size (a header not padded to 8 bytes); use load().
  TensorView view(std::string_view name) const;
  // Like view(), but the returned Tensor keeps the mapping alive by itself.
  Tensor tensor(std::string_view name) const;
  // An owning copy on `device`, converted to `convert_to` when given (f32/f16/bf16/f64 and the
  // integer types; float→int truncates toward zero, →bool is "non-zero"). Works for unaligned
  // data. Host→device copies synchronise `stream`.
  Tensor load(std::string_view name, Device device = Device::cpu(),
              std::optional<DType> convert_to = std::nullopt, Stream stream = {}) const;

  struct Impl;

 private:
  explicit SafetensorsFile(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Writes `tensors` to `path` as a safetensors file. Any views are accepted (non-contiguous, CUDA:
// they are copied to contiguous CPU memory first). Names must be unique, non-empty and not
// "__metadata__". The header lists tensors by name (JSON keys sorted) and is padded with spaces to
// a multiple of 8 bytes; data is laid out by decreasing element size, then name, so every tensor
// is aligned to its element size and can be viewed in place. The file is written to a temporary
// name in the same directory, fsync'd, renamed over `path` and the directory fsync'd: a crash
// leaves either the old file or the complete new one, never a half-written file under `path`.
// Throws InvalidArgument for bad names/tensors and RuntimeFailure for I/O errors.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, TensorView>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace hk
