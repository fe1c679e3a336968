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

#include "core/file_io.h"
#include "core/strict_json.h"
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

// Containers deeper than this are not part of any valid header (root → entry → shape array,
// plus one level so a nested shape entry is reported as "not an integer").
constexpr int kMaxJsonDepth = 4;

// The header, read in one streaming pass (nlohmann's SAX interface) straight into TensorInfo:
// no JSON document is built, so a header of 500k tensors costs one lexing pass plus one small
// record per tensor (a document with a callback parser rescanned the root object at the end of
// every entry, which was quadratic). Each entry's fields are captured and checked when the entry
// closes, in the order dtype, shape, data_offsets, so the first problem of an entry is the one
// reported. Nesting beyond kMaxJsonDepth and duplicate keys at any level are refused.
class HeaderReader {
 public:
  using json = nlohmann::json;

  HeaderReader(const std::string& path, std::vector<TensorInfo>& tensors,
               std::map<std::string, std::string>& metadata)
      : path_(path), tensors_(tensors), metadata_(metadata) {}

  // Runs the parse and the checks that need the whole header.
  void read(const unsigned char* text, size_t len) {
    json::sax_parse(text, text + len, this, json::input_format_t::json, /*strict=*/true);
    if (!root_is_object_) fail(path_, "the header is not a JSON object");
    auto by_name = [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; };
    if (!std::is_sorted(tensors_.begin(), tensors_.end(), by_name))  // writers usually sort
      std::sort(tensors_.begin(), tensors_.end(), by_name);
    for (size_t i = 1; i < tensors_.size(); ++i)
      if (tensors_[i].name == tensors_[i - 1].name) duplicate(tensors_[i].name);
  }

  // ---- SAX interface ----
  bool null() { return scalar(Scalar::Other, "null"); }
  bool boolean(bool v) { return scalar(Scalar::Other, v ? "true" : "false"); }
  bool number_integer(json::number_integer_t v) {
    return scalar(v < 0 ? Scalar::Negative : Scalar::Unsigned, std::to_string(v),
                  static_cast<uint64_t>(v));
  }
  bool number_unsigned(json::number_unsigned_t v) {
    return scalar(Scalar::Unsigned, std::to_string(v), v);
  }
  bool number_float(json::number_float_t, const json::string_t& raw) {
    return scalar(Scalar::Other, raw);
  }
  bool string(json::string_t& v) {
    if (frames_.empty() || frames_.back().kind != Kind::Entry || field_ != Field::Dtype ||
        current_.dtype_seen)
      return scalar(Scalar::String, "\"" + v + "\"", 0, &v);
    current_.dtype_seen = true;
    current_.dtype = std::move(v);
    return true;
  }
  bool binary(json::binary_t&) { return scalar(Scalar::Other, "<binary>"); }
  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    Frame& top = frames_.back();
    if (top.kind == Kind::Entry) {
      unsigned bit = 0;
      if (k == "dtype") {
        field_ = Field::Dtype, bit = 1;
      } else if (k == "shape") {
        field_ = Field::Shape, bit = 2;
      } else if (k == "data_offsets") {
        field_ = Field::Offsets, bit = 4;
      } else {
        field_ = Field::Other;
      }
      if (bit ? (top.seen & bit) != 0 : !remember(top, k)) duplicate(k);
      top.seen |= bit;
    } else if (top.kind == Kind::Ignored && top.is_object) {
      if (!remember(top, k)) duplicate(k);
    }
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    fail(path_, "the header is not valid JSON ('" + json_error_reason(e) + "')");
  }

 private:
  enum class Kind { Root, Entry, Metadata, Shape, Offsets, Ignored };
  enum class Field { Dtype, Shape, Offsets, Other };
  enum class Scalar { Unsigned, Negative, String, Other };
  struct Frame {
    Kind kind;
    bool is_object = false;
    unsigned seen = 0;              // Entry: dtype / shape / data_offsets seen (bits 1, 2, 4)
    std::vector<std::string> keys;  // other keys of an Entry or Ignored object (rare, short)
  };
  // False when `key` was already seen in this object.
  static bool remember(Frame& frame, const std::string& key) {
    if (std::find(frame.keys.begin(), frame.keys.end(), key) != frame.keys.end()) return false;
    frame.keys.push_back(key);
    return true;
  }
  // What one entry said, checked when it closes.
  struct Entry {
    std::string name;
    bool dtype_seen = false;
    std::optional<std::string> dtype;  // nullopt: absent or not a string
    bool shape_is_array = false;
    std::vector<uint64_t> dims;
    std::string dim_problem;  // the first bad dimension, as a message
    bool offsets_is_array = false;
    std::vector<std::optional<uint64_t>> offsets;
    std::string offsets_text = "nothing";
  };

  [[noreturn]] void duplicate(const std::string& key) const {
    fail(path_,
         "the JSON header has the key " + shown(key) + " twice (duplicate keys are not allowed)");
  }

  bool open(bool is_object) {
    if (static_cast<int>(frames_.size()) + 1 > kMaxJsonDepth)
      fail(path_, "the JSON header nests deeper than a safetensors header can");
    if (frames_.empty()) {
      root_is_object_ = is_object;
      frames_.push_back({is_object ? Kind::Root : Kind::Ignored, is_object, 0, {}});
      return true;
    }
    Frame& top = frames_.back();
    Kind kind = Kind::Ignored;
    switch (top.kind) {
      case Kind::Root:
        if (key_ == "__metadata__") {
          if (!is_object)
            fail(path_, "\"__metadata__\" must be a JSON object of strings, got a list");
          if (metadata_seen_) duplicate(key_);
          metadata_seen_ = true;
          kind = Kind::Metadata;
        } else {
          if (!is_object)
            fail_tensor(path_, key_, "must be a JSON object with dtype, shape and data_offsets");
          current_ = Entry{};
          current_.name = std::move(key_);
          kind = Kind::Entry;
        }
        break;
      case Kind::Entry:
        if (field_ == Field::Shape && !is_object && !current_.shape_is_array) {
          current_.shape_is_array = true;
          kind = Kind::Shape;
        } else if (field_ == Field::Offsets && !is_object && !current_.offsets_is_array) {
          current_.offsets_is_array = true;
          current_.offsets_text = "[";
          kind = Kind::Offsets;
        } else if (field_ == Field::Dtype) {
          current_.dtype_seen = true;  // present, but not a string
        }
        break;
      case Kind::Metadata:
        fail(path_, "\"__metadata__\" entry " + shown(key_) + " must be a string, got " +
                        (is_object ? "an object" : "a list"));
      case Kind::Shape:
        dim_problem("has a shape entry that is not an integer: " +
                    shown(is_object ? "{...}" : "[...]"));
        break;
      case Kind::Offsets:
        current_.offsets.emplace_back();
        current_.offsets_text +=
            (current_.offsets.size() > 1 ? "," : "") + std::string(is_object ? "{...}" : "[...]");
        break;
      case Kind::Ignored:
        break;
    }
    frames_.push_back({kind, is_object, 0, {}});
    return true;
  }

  bool close() {
    const Kind kind = frames_.back().kind;
    frames_.pop_back();
    if (kind == Kind::Entry) finish_entry();
    if (kind == Kind::Offsets) current_.offsets_text += "]";
    return true;
  }

  void dim_problem(const std::string& problem) {
    if (current_.dim_problem.empty()) current_.dim_problem = problem;
  }

  bool scalar(Scalar type, const std::string& text, uint64_t value = 0,
              std::string* string_value = nullptr) {
    if (frames_.empty()) return true;  // a bare scalar header: "not a JSON object" at the end
    switch (frames_.back().kind) {
      case Kind::Root:
        if (key_ == "__metadata__")
          fail(path_, "\"__metadata__\" must be a JSON object of strings, got " + shown(text));
        fail_tensor(path_, key_, "must be a JSON object with dtype, shape and data_offsets");
      case Kind::Entry:
        if (field_ == Field::Dtype) current_.dtype_seen = true;  // present, not a string
        break;
      case Kind::Metadata:
        if (type != Scalar::String)
          fail(path_,
               "\"__metadata__\" entry " + shown(key_) + " must be a string, got " + shown(text));
        if (!metadata_.emplace(key_, std::move(*string_value)).second) duplicate(key_);
        break;
      case Kind::Shape:
        if (type == Scalar::Negative)
          dim_problem("has a negative dimension in its shape: " + shown(text));
        else if (type != Scalar::Unsigned)
          dim_problem("has a shape entry that is not an integer: " + shown(text));
        else if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          dim_problem("has a dimension too large for int64: " + shown(text));
        else
          current_.dims.push_back(value);
        break;
      case Kind::Offsets:
        current_.offsets.push_back(type == Scalar::Unsigned ? std::optional<uint64_t>(value)
                                                            : std::nullopt);
        current_.offsets_text += (current_.offsets.size() > 1 ? "," : "") + text;
        break;
      case Kind::Ignored:
        break;
    }
    return true;
  }

  void finish_entry() {
    Entry& e = current_;
    TensorInfo info;
    info.name = std::move(e.name);
    if (!e.dtype) fail_tensor(path_, info.name, "has no \"dtype\" string");
    info.dtype_name = std::move(*e.dtype);
    const DTypeEntry* dtype = find_dtype(info.dtype_name);
    if (!dtype)
      fail_tensor(
          path_, info.name,
          "has unknown dtype " + shown(info.dtype_name) + " (known: " + known_dtype_list() + ")");
    info.dtype = dtype->dtype;
    if (!e.shape_is_array) fail_tensor(path_, info.name, "has no \"shape\" array");
    if (!e.dim_problem.empty()) fail_tensor(path_, info.name, e.dim_problem);
    info.shape.assign(e.dims.begin(), e.dims.end());
    // The element count, the count with empty dims read as 1 (what strides are computed from)
    // and the byte size must all fit in int64: hk's one checked size arithmetic decides.
    int64_t nbytes = 0;
    try {
      checked_numel(info.shape.data(), static_cast<int>(info.shape.size()), /*empty_as_one=*/true);
    } catch (const InvalidArgument&) {
      fail_tensor(path_, info.name,
                  "has a shape " + shape_text(info.shape) + " whose size overflows int64");
    }
    try {
      nbytes = checked_mul(checked_numel(info.shape), static_cast<int64_t>(dtype->size),
                           "the byte size of tensor " + info.name);
    } catch (const InvalidArgument&) {
      fail_tensor(path_, info.name,
                  "has a shape " + shape_text(info.shape) + " whose byte size overflows");
    }
    const bool two = e.offsets_is_array && e.offsets.size() == 2 && e.offsets[0] && e.offsets[1];
    if (!two || *e.offsets[1] < *e.offsets[0])
      fail_tensor(path_, info.name,
                  "needs \"data_offsets\" as two increasing non-negative integers [begin, end], "
                  "got " +
                      (e.offsets_is_array ? shown(e.offsets_text) : std::string("nothing")));
    info.data_begin = *e.offsets[0];
    info.data_end = *e.offsets[1];
    if (info.nbytes() != static_cast<uint64_t>(nbytes))
      fail_tensor(path_, info.name,
                  "has data_offsets [" + std::to_string(info.data_begin) + ", " +
                      std::to_string(info.data_end) + "] spanning " +
                      std::to_string(info.nbytes()) + " bytes, but dtype " + info.dtype_name +
                      " and shape " + shape_text(info.shape) + " need " + std::to_string(nbytes) +
                      " bytes");
    tensors_.push_back(std::move(info));
  }

  const std::string& path_;
  std::vector<TensorInfo>& tensors_;
  std::map<std::string, std::string>& metadata_;
  std::vector<Frame> frames_;
  std::string key_;
  Field field_ = Field::Other;
  Entry current_;
  bool root_is_object_ = false;
  bool metadata_seen_ = false;
};

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

  HeaderReader(path, impl.tensors, impl.metadata).read(impl.bytes + 8, header_len);
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
  return checked_numel(shape);  // validated when parsed; checked anyway (one arithmetic)
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
  // A FIFO or device named *.safetensors is refused without blocking (open_regular).
  files::Fd file = files::open_regular(path, "safetensors file");
  impl->size = files::file_size(file.get(), path);
  if (impl->size > 0) {
    void* mapped = ::mmap(nullptr, impl->size, PROT_READ, MAP_PRIVATE, file.get(), 0);
    const int mmap_errno = errno;
    file = files::Fd();
    if (mapped == MAP_FAILED)
      throw RuntimeFailure("cannot map safetensors file '" + path +
                           "': " + std::strerror(mmap_errno));
    impl->bytes = static_cast<const unsigned char*>(mapped);
    const size_t size = impl->size;
    impl->release = [mapped, size] { ::munmap(mapped, size); };
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
