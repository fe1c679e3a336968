// Safetensors reader: maps a file (or copies a buffer), validates the whole header up front and
// hands out zero-copy views or owning, optionally converted, copies.
//
// Validation follows the safetensors specification and its reference implementation: a header
// of at most 100 MB inside the file, a JSON object (nesting and duplicate keys checked while
// parsing, so hostile input cannot blow the stack or hide a second entry), "__metadata__" as a
// string→string map, known dtype names, shapes whose element count fits in int64, data_offsets
// [begin, end) with end - begin = numel × element size, all inside the data buffer, and tensors
// that tile the buffer exactly (no overlaps, no holes). Messages name the file and the tensor.
// Deliberately not handled: a file truncated by someone else while it is mapped (SIGBUS, as with
// every mmap reader).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "hk/error.h"
#include "hk/safetensors.h"

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; hk supports little-endian hosts only");

namespace hk {

struct SafetensorsFile::Impl {
  std::string path;
  const unsigned char* bytes = nullptr;  // whole file
  size_t size = 0;
  std::function<void()> release;  // unmaps or frees `bytes`
  uint64_t header_len = 0;
  std::vector<TensorInfo> tensors;  // name order
  std::map<std::string, std::string> metadata;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    if (release) release();
  }
  const unsigned char* data_buffer() const { return bytes + 8 + header_len; }
  uint64_t data_size() const { return size - 8 - header_len; }
};

namespace {

using json = nlohmann::json;

struct DTypeEntry {
  const char* name;
  size_t size;
  std::optional<DType> dtype;
};

// Every dtype name of the safetensors format with a whole-byte element size.
constexpr DTypeEntry kDTypes[] = {
    {"F64", 8, DType::F64},   {"F32", 4, DType::F32},       {"F16", 2, DType::F16},
    {"BF16", 2, DType::BF16}, {"I64", 8, DType::I64},       {"I32", 4, DType::I32},
    {"I16", 2, std::nullopt}, {"I8", 1, std::nullopt},      {"U8", 1, DType::U8},
    {"BOOL", 1, DType::Bool}, {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt},
    {"U16", 2, std::nullopt}, {"U32", 4, std::nullopt},     {"U64", 8, std::nullopt},
};

const DTypeEntry* find_dtype(std::string_view name) {
  for (const auto& e : kDTypes)
    if (name == e.name) return &e;
  return nullptr;
}

std::string known_dtype_list() {
  std::string s;
  for (const auto& e : kDTypes) s += (s.empty() ? "" : ", ") + std::string(e.name);
  return s;
}

// Quotes text from the file for an error message: control bytes escaped, long text cut.
std::string shown(std::string_view text, size_t max_length = 120) {
  std::string out = "'" + escape_control_bytes(text.substr(0, max_length));
  if (text.size() > max_length) out += "...";
  return out + "'";
}

// A shape for an error message; a header may hold millions of dims, the message shows a few.
std::string shape_text(const Shape& shape) {
  constexpr size_t kShown = 8;
  if (shape.size() <= kShown) return shape_str(shape);
  const std::string head = shape_str(Shape(shape.begin(), shape.begin() + kShown));
  return head.substr(0, head.size() - 1) + ", ... (rank " + std::to_string(shape.size()) + ")]";
}

[[noreturn]] void fail(const std::string& path, const std::string& detail) {
  throw InvalidArgument("'" + path + "' is not a valid safetensors file: " + detail +
                        "; re-export or re-download it");
}

[[noreturn]] void fail_tensor(const std::string& path, std::string_view name,
                              const std::string& detail) {
  fail(path, "tensor " + shown(name) + " " + detail);
}

// Thrown from the parse callback; converted to a message naming the file.
struct HeaderShapeError {
  std::string detail;
};

// Containers deeper than this are not part of any valid header (root → entry → shape array).
constexpr int kMaxJsonDepth = 4;

json parse_header_json(const std::string& path, const unsigned char* text, size_t len) {
  std::vector<std::set<std::string>> open_objects;  // keys seen, per open object
  auto guard = [&](int depth, json::parse_event_t event, json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth + 1 > kMaxJsonDepth)
          throw HeaderShapeError{"the JSON header nests deeper than a safetensors header can"};
        if (event == json::parse_event_t::object_start) open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get_ref<const std::string&>()).second)
          throw HeaderShapeError{"the JSON header has the key " +
                                 shown(parsed.get_ref<const std::string&>()) +
                                 " twice (duplicate keys are not allowed)"};
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text, text + len, guard);
  } catch (const HeaderShapeError& e) {
    fail(path, e.detail);
  } catch (const json::exception& e) {
    // Drop nlohmann's "[json.exception.parse_error.101] " prefix; keep the position and reason.
    std::string_view what = e.what();
    if (const size_t close = what.find("] "); what.starts_with("[json.") && close != what.npos)
      what.remove_prefix(close + 2);
    fail(path, "the header is not valid JSON (" + shown(what, 240) + ")");
  }
}

// Non-negative integer from the header, or nullopt when the value is anything else.
std::optional<uint64_t> as_unsigned(const json& value) {
  if (!value.is_number_unsigned()) return std::nullopt;
  return value.get<uint64_t>();
}

TensorInfo parse_entry(const std::string& path, const std::string& name, const json& entry) {
  if (!entry.is_object())
    fail_tensor(path, name, "must be a JSON object with dtype, shape and data_offsets");
  TensorInfo info;
  info.name = name;

  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string())
    fail_tensor(path, name, "has no \"dtype\" string");
  info.dtype_name = dtype_it->get<std::string>();
  const DTypeEntry* dtype = find_dtype(info.dtype_name);
  if (!dtype)
    fail_tensor(
        path, name,
        "has unknown dtype " + shown(info.dtype_name) + " (known: " + known_dtype_list() + ")");
  info.dtype = dtype->dtype;

  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array())
    fail_tensor(path, name, "has no \"shape\" array");
  for (const json& dim : *shape_it) {
    if (dim.is_number_integer() && !dim.is_number_unsigned())
      fail_tensor(path, name, "has a negative dimension in its shape: " + shown(dim.dump()));
    const auto d = as_unsigned(dim);
    if (!d)
      fail_tensor(path, name, "has a shape entry that is not an integer: " + shown(dim.dump()));
    if (*d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail_tensor(path, name, "has a dimension too large for int64: " + shown(dim.dump()));
    info.shape.push_back(static_cast<int64_t>(*d));
  }
  // The element count, and the count with empty dims read as 1 (what strides are computed
  // from), must both fit in int64, and so must the byte size.
  int64_t strided = 1;
  for (int64_t d : info.shape)
    if (__builtin_mul_overflow(strided, std::max<int64_t>(d, 1), &strided))
      fail_tensor(path, name,
                  "has a shape " + shape_text(info.shape) + " whose size overflows int64");
  const int64_t numel = info.numel();
  int64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(dtype->size), &nbytes))
    fail_tensor(path, name, "has a shape " + shape_text(info.shape) + " whose byte size overflows");

  const auto offsets_it = entry.find("data_offsets");
  const json* offsets = offsets_it == entry.end() ? nullptr : &*offsets_it;
  std::optional<uint64_t> begin, end;
  if (offsets && offsets->is_array() && offsets->size() == 2) {
    begin = as_unsigned((*offsets)[0]);
    end = as_unsigned((*offsets)[1]);
  }
  if (!begin || !end || *end < *begin)
    fail_tensor(
        path, name,
        "needs \"data_offsets\" as two increasing non-negative integers [begin, end], got " +
            (offsets ? shown(offsets->dump()) : std::string("nothing")));
  info.data_begin = *begin;
  info.data_end = *end;
  if (info.nbytes() != static_cast<uint64_t>(nbytes))
    fail_tensor(path, name,
                "has data_offsets [" + std::to_string(*begin) + ", " + std::to_string(*end) +
                    "] spanning " + std::to_string(info.nbytes()) + " bytes, but dtype " +
                    info.dtype_name + " and shape " + shape_text(info.shape) + " need " +
                    std::to_string(nbytes) + " bytes");
  return info;
}

void parse_metadata(const std::string& path, const json& value,
                    std::map<std::string, std::string>& out) {
  if (!value.is_object())
    fail(path, "\"__metadata__\" must be a JSON object of strings, got " + shown(value.dump()));
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string())
      fail(path,
           "\"__metadata__\" entry " + shown(key) + " must be a string, got " + shown(item.dump()));
    out[key] = item.get<std::string>();
  }
}

// The tensors must tile the data buffer: sorted by offset, each starts where the previous ended
// and the last ends at the end of the buffer.
void check_coverage(const std::string& path, const std::vector<TensorInfo>& tensors,
                    uint64_t data_size) {
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::tie(a->data_begin, a->data_end, a->name) <
           std::tie(b->data_begin, b->data_end, b->name);
  });
  uint64_t cursor = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo* t : by_offset) {
    if (t->data_begin < cursor)
      fail(path, "tensors " + shown(previous->name) + " [" + std::to_string(previous->data_begin) +
                     ", " + std::to_string(previous->data_end) + ") and " + shown(t->name) + " [" +
                     std::to_string(t->data_begin) + ", " + std::to_string(t->data_end) +
                     ") overlap");
    if (t->data_begin > cursor)
      fail(path, "bytes [" + std::to_string(cursor) + ", " + std::to_string(t->data_begin) +
                     ") of the data buffer, before tensor " + shown(t->name) +
                     ", belong to no tensor (the format allows no holes)");
    cursor = t->data_end;
    previous = t;
  }
  if (cursor != data_size)
    fail(path, "the data buffer has " + std::to_string(data_size - cursor) +
                   " bytes after the last tensor that belong to no tensor (the format allows "
                   "no holes)");
}

void parse(SafetensorsFile::Impl& impl) {
  const std::string& path = impl.path;
  if (impl.size < 8)
    fail(path, "it is " + std::to_string(impl.size) +
                   " bytes long, shorter than the 8-byte header length");
  uint64_t header_len = 0;
  std::memcpy(&header_len, impl.bytes, 8);
  if (header_len > kSafetensorsMaxHeaderBytes)
    fail(path, "its header length " + std::to_string(header_len) + " exceeds the " +
                   std::to_string(kSafetensorsMaxHeaderBytes) + "-byte limit");
  if (header_len > impl.size - 8)
    fail(path, "its header length " + std::to_string(header_len) + " is beyond the end of the " +
                   std::to_string(impl.size) + "-byte file (truncated?)");
  impl.header_len = header_len;

  const json header = parse_header_json(path, impl.bytes + 8, header_len);
  if (!header.is_object()) fail(path, "the header is not a JSON object");
  for (const auto& [key, value] : header.items()) {  // std::map: name order
    if (key == "__metadata__")
      parse_metadata(path, value, impl.metadata);
    else
      impl.tensors.push_back(parse_entry(path, key, value));
  }
  const uint64_t data_size = impl.data_size();
  for (const auto& t : impl.tensors)
    if (t.data_end > data_size)
      fail_tensor(path, t.name,
                  "has data_offsets [" + std::to_string(t.data_begin) + ", " +
                      std::to_string(t.data_end) + "] beyond the " + std::to_string(data_size) +
                      "-byte data buffer (truncated file?)");
  check_coverage(path, impl.tensors, data_size);
}

// ---- dtype conversion for load() -----------------------------------------------------------

bool is_integral(DType d) {
  return d == DType::I32 || d == DType::I64 || d == DType::U8 || d == DType::Bool;
}

template <class Int>
Int saturate(double v) {
  if (std::isnan(v)) return 0;
  if (v <= static_cast<double>(std::numeric_limits<Int>::min()))
    return std::numeric_limits<Int>::min();
  if (v >= static_cast<double>(std::numeric_limits<Int>::max()))
    return std::numeric_limits<Int>::max();
  return static_cast<Int>(v);
}

template <class Int>
Int saturate_int(int64_t v) {
  if (v < static_cast<int64_t>(std::numeric_limits<Int>::min()))
    return std::numeric_limits<Int>::min();
  if (v > static_cast<int64_t>(std::numeric_limits<Int>::max()))
    return std::numeric_limits<Int>::max();
  return static_cast<Int>(v);
}

void write_value(DType d, unsigned char* out, DType src, const unsigned char* in) {
  if (is_integral(src) && is_integral(d)) {
    const int64_t v = element_to_int64(src, in);
    switch (d) {
      case DType::I64:
        std::memcpy(out, &v, 8);
        return;
      case DType::I32: {
        const int32_t w = saturate_int<int32_t>(v);
        std::memcpy(out, &w, 4);
        return;
      }
      case DType::U8:
        *out = saturate_int<uint8_t>(v);
        return;
      default:
        *out = v != 0;
        return;  // Bool
    }
  }
  const double v = element_to_double(src, in);
  switch (d) {
    case DType::F64:
      std::memcpy(out, &v, 8);
      return;
    case DType::F32: {
      const float f = static_cast<float>(v);
      std::memcpy(out, &f, 4);
      return;
    }
    case DType::F16: {
      const f16_t h = float_to_f16(static_cast<float>(v));
      std::memcpy(out, &h, 2);
      return;
    }
    case DType::BF16: {
      const bf16_t h = float_to_bf16(static_cast<float>(v));
      std::memcpy(out, &h, 2);
      return;
    }
    case DType::I64: {
      const int64_t w = saturate<int64_t>(v);
      std::memcpy(out, &w, 8);
      return;
    }
    case DType::I32: {
      const int32_t w = saturate<int32_t>(v);
      std::memcpy(out, &w, 4);
      return;
    }
    case DType::U8:
      *out = saturate<uint8_t>(v);
      return;
    case DType::Bool:
      *out = v != 0;
      return;
  }
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated not to overflow when parsed
  return n;
}

size_t safetensors_dtype_size(std::string_view dtype_name) {
  const DTypeEntry* e = find_dtype(dtype_name);
  return e ? e->size : 0;
}

const char* safetensors_dtype_name(DType dtype) {
  for (const auto& e : kDTypes)
    if (e.dtype == dtype) return e.name;
  throw InvalidArgument("dtype " + std::string(dtype_name(dtype)) + " has no safetensors name");
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw NotFound("cannot open safetensors file '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InvalidArgument("'" + path +
                          "' is not a regular file; give the path of a .safetensors file");
  }
  impl->size = static_cast<size_t>(st.st_size);
  if (impl->size > 0) {
    void* mapped = ::mmap(nullptr, impl->size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int mmap_errno = errno;
    ::close(fd);
    if (mapped == MAP_FAILED)
      throw RuntimeFailure("cannot map safetensors file '" + path +
                           "': " + std::strerror(mmap_errno));
    impl->bytes = static_cast<const unsigned char*>(mapped);
    const size_t size = impl->size;
    impl->release = [mapped, size] { ::munmap(mapped, size); };
  } else {
    ::close(fd);
  }
  parse(*impl);
  return SafetensorsFile(std::move(impl));
}

SafetensorsFile SafetensorsFile::from_bytes(const void* data, size_t size,
                                            const std::string& label) {
  auto impl = std::make_shared<Impl>();
  impl->path = label;
  impl->size = size;
  // Page-aligned like a mapping, so element alignment only depends on the file's layout.
  constexpr size_t kAlign = 4096;
  void* copy = ::operator new(std::max<size_t>(size, 1), std::align_val_t(kAlign));
  if (size) std::memcpy(copy, data, size);
  impl->bytes = static_cast<const unsigned char*>(copy);
  impl->release = [copy] { ::operator delete(copy, std::align_val_t(kAlign)); };
  parse(*impl);
  return SafetensorsFile(std::move(impl));
}

const std::string& SafetensorsFile::path() const {
  return impl_->path;
}
const std::vector<TensorInfo>& SafetensorsFile::tensors() const {
  return impl_->tensors;
}
const std::map<std::string, std::string>& SafetensorsFile::metadata() const {
  return impl_->metadata;
}
uint64_t SafetensorsFile::header_bytes() const {
  return impl_->header_len;
}
uint64_t SafetensorsFile::data_bytes() const {
  return impl_->data_size();
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto& ts = impl_->tensors;
  auto it = std::lower_bound(ts.begin(), ts.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return it != ts.end() && it->name == name ? &*it : nullptr;
}

const TensorInfo& SafetensorsFile::info(std::string_view name) const {
  if (const TensorInfo* t = find(name)) return *t;
  throw NotFound("safetensors file '" + impl_->path + "' has no tensor " + shown(name) +
                 " (it has " + std::to_string(impl_->tensors.size()) +
                 " tensors; `hk inspect` lists them)");
}

namespace {

DType usable_dtype(const std::string& path, const TensorInfo& t) {
  if (!t.dtype)
    throw Unsupported("tensor " + shown(t.name) + " in '" + path + "' has dtype " + t.dtype_name +
                      ", which hk cannot compute with; convert it to F32, F16 or BF16 first");
  if (t.shape.size() > static_cast<size_t>(kMaxDims))
    throw Unsupported("tensor " + shown(t.name) + " in '" + path + "' has rank " +
                      std::to_string(t.shape.size()) + "; hk tensors have at most " +
                      std::to_string(kMaxDims) + " dimensions");
  return *t.dtype;
}

}  // namespace

TensorView SafetensorsFile::view(std::string_view name) const {
  const TensorInfo& t = info(name);
  const DType dtype = usable_dtype(impl_->path, t);
  const uint64_t offset = data_start() + t.data_begin;
  if (offset % dtype_size(dtype) != 0)
    throw Unsupported("tensor " + shown(t.name) + " in '" + impl_->path +
                      "' is not aligned to its " + std::to_string(dtype_size(dtype)) +
                      "-byte elements (the header is not padded to 8 bytes), so it cannot be "
                      "viewed in place; use load(), which copies it");
  // Base = start of the mapping (page aligned), as DLPack prefers; the tensor is at byte_offset.
  TensorView v(const_cast<unsigned char*>(impl_->bytes), Device::cpu(), dtype, t.shape);
  v.byte_offset = offset;
  return v;
}

Tensor SafetensorsFile::tensor(std::string_view name) const {
  const TensorView v = view(name);
  auto storage = std::make_shared<Storage>(Device::cpu(), const_cast<unsigned char*>(impl_->bytes),
                                           impl_->size, [keep = impl_](void*) {});
  return Tensor(std::move(storage), v);
}

Tensor SafetensorsFile::load(std::string_view name, Device device, std::optional<DType> convert_to,
                             Stream stream) const {
  const TensorInfo& t = info(name);
  const DType src = usable_dtype(impl_->path, t);
  const DType dst = convert_to.value_or(src);
  const unsigned char* bytes = impl_->data_buffer() + t.data_begin;
  const bool aligned = (data_start() + t.data_begin) % dtype_size(src) == 0;

  if (dst == src && aligned && !device.is_cpu())  // straight from the mapping to the device
    return Tensor::wrap(view(name)).to(device, stream);

  Tensor host = Tensor::empty(t.shape, dst, Device::cpu());
  const int64_t n = t.numel();
  auto* out = static_cast<unsigned char*>(host.view().ptr());
  if (dst == src) {
    if (n) std::memcpy(out, bytes, t.nbytes());
  } else {
    const size_t in_size = dtype_size(src), out_size = dtype_size(dst);
    for (int64_t i = 0; i < n; ++i) write_value(dst, out + i * out_size, src, bytes + i * in_size);
  }
  return device.is_cpu() ? host : host.to(device, stream);
}

}  // namespace hk
