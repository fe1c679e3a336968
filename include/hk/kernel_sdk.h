// hk/kernel_sdk.h — header-only C++ helpers for writing a kernel library (the kernel side of
// hk_abi/hk_kernel.h).
//
// A kernel repo writes its functions as ordinary C++ that throws on bad input, and lets the SDK
// turn them into C entry points that catch every exception and return a status code with one
// sentence in `hk_call.error_message` — nothing C++ crosses the boundary. It declares its entries
// with `hk::sdk::make_entry({...})` and exports the table with one macro:
//
//   static void forward(const hk_call& call) { ... hk::sdk::fail(HK_STATUS_UNSUPPORTED, "..."); }
//   static const hk_kernel_entry kEntries[] = {hk::sdk::make_entry({
//       .name = "RMSNorm", .interface = "rms_norm", .interface_version = 1,
//       .modes = HK_MODE_INFERENCE | HK_MODE_TRAINING, .device = "cpu",
//       .dtypes = hk::sdk::kFloatDtypes, .forward = hk::sdk::entry_point<forward>})};
//   HK_KERNEL_LIBRARY(kEntries)
//
// HK_KERNEL_LIBRARY takes the repo, version and build id from the compile definitions that
// `hk_add_kernel_repo` (cmake/HkKernelRepo.cmake) sets, so the CMake call is the one place a
// version is written; HK_KERNEL_LIBRARY_EXPLICIT takes them as arguments.
//
// Everything here is inline: kernel libraries include it but never link libhk (they are loaded by
// it). TensorView conversions only touch fields (its out-of-line methods live in libhk). The host
// loader uses the same conversions and name tables, so both sides agree by construction.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "hk/tensor.h"
#include "hk_abi/hk_kernel.h"

namespace hk::sdk {

inline constexpr uint32_t kFloatDtypes =
    HK_DTYPE_BIT(HK_DTYPE_F32) | HK_DTYPE_BIT(HK_DTYPE_BF16) | HK_DTYPE_BIT(HK_DTYPE_F16);

// ---- names used in metadata.json and messages ---------------------------------------------------
inline const char* dtype_code_name(int32_t code) {
  switch (code) {
    case HK_DTYPE_F32:
      return "f32";
    case HK_DTYPE_F16:
      return "f16";
    case HK_DTYPE_BF16:
      return "bf16";
    case HK_DTYPE_I32:
      return "i32";
    case HK_DTYPE_I64:
      return "i64";
    case HK_DTYPE_U8:
      return "u8";
    case HK_DTYPE_BOOL:
      return "bool";
    case HK_DTYPE_F64:
      return "f64";
    default:
      return nullptr;
  }
}
inline constexpr int32_t kNumDtypeCodes = 8;

inline const char* mode_bit_name(uint32_t bit) {
  switch (bit) {
    case HK_MODE_INFERENCE:
      return "inference";
    case HK_MODE_TRAINING:
      return "training";
    case HK_MODE_CAPTURE:
      return "capture";
    default:
      return nullptr;
  }
}

// IEEE half ↔ float on the host, round to nearest even, NaN kept a NaN (hk/dtype.h's rule; those
// live in libhk, which kernels do not link).
inline float f16_bits_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 112) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_f16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // overflow (≥ 65520) → inf
  if (a < 0x38800000u) {                        // subnormal or zero in f16
    if (a < 0x33000000u) return sign;           // < 2^-25 rounds to 0
    const uint32_t man = (a & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(a >> 23);  // 14 + (113 - exp)
    uint32_t half = man >> shift;
    const uint32_t rest = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rest > mid || (rest == mid && (half & 1u))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t v = a - (112u << 23);
  v += 0xfffu + ((v >> 13) & 1u);
  return sign | static_cast<uint16_t>(v >> 13);
}

// One element of a floating tensor (HK_DTYPE_F32 / _BF16 / _F16 at element index i of `base`),
// widened to f32 / stored with one rounding to nearest even: the host-side element access of cpu
// kernels. Other dtypes are the caller's to refuse first.
inline float load_float(const void* base, int32_t dtype, int64_t i) {
  if (dtype == HK_DTYPE_BF16) return bf16_to_float(static_cast<const bf16_t*>(base)[i]);
  if (dtype == HK_DTYPE_F16) return f16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
  return static_cast<const float*>(base)[i];
}
inline void store_float(void* base, int32_t dtype, int64_t i, float v) {
  if (dtype == HK_DTYPE_BF16)
    static_cast<bf16_t*>(base)[i] = float_to_bf16(v);
  else if (dtype == HK_DTYPE_F16)
    static_cast<uint16_t*>(base)[i] = float_to_f16_bits(v);
  else
    static_cast<float*>(base)[i] = v;
}
// v rounded through `dtype` and back.
inline float round_float(int32_t dtype, float v) {
  if (dtype == HK_DTYPE_BF16) return bf16_to_float(float_to_bf16(v));
  if (dtype == HK_DTYPE_F16) return f16_bits_to_float(float_to_f16_bits(v));
  return v;
}

inline size_t dtype_code_size(int32_t code) {
  switch (code) {
    case HK_DTYPE_F32:
    case HK_DTYPE_I32:
      return 4;
    case HK_DTYPE_F16:
    case HK_DTYPE_BF16:
      return 2;
    case HK_DTYPE_I64:
    case HK_DTYPE_F64:
      return 8;
    case HK_DTYPE_U8:
    case HK_DTYPE_BOOL:
      return 1;
    default:
      return 0;
  }
}

// ---- errors at the boundary ---------------------------------------------------------------------
// What kernel code throws to return a status with a sentence.
class Failure : public std::exception {
 public:
  Failure(hk_status status, std::string message) : status_(status), message_(std::move(message)) {}
  hk_status status() const { return status_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  hk_status status_;
  std::string message_;
};

[[noreturn]] inline void fail(hk_status status, const std::string& message) {
  throw Failure(status, message);
}

inline void write_message(const hk_call* call, const char* message) {
  if (call == nullptr || call->error_message == nullptr || call->error_message_size == 0) return;
  std::snprintf(call->error_message, call->error_message_size, "%s", message);
}

// Runs `body`, mapping exceptions to statuses. Never throws.
template <class Body>
hk_status guard(const hk_call* call, Body&& body) noexcept {
  try {
    if (call == nullptr) return HK_STATUS_INVALID_ARGUMENT;
    body();
    return HK_STATUS_OK;
  } catch (const Failure& failure) {
    write_message(call, failure.what());
    return failure.status();
  } catch (const std::bad_alloc&) {
    write_message(call, "out of host memory");
    return HK_STATUS_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    write_message(call, e.what());
    return HK_STATUS_INTERNAL;
  } catch (...) {
    write_message(call, "unknown exception in kernel");
    return HK_STATUS_INTERNAL;
  }
}

// `hk_kernel_fn` for a C++ function `void f(const hk_call&)` that may throw.
template <void (*Impl)(const hk_call&)>
hk_status entry_point(const hk_call* call) noexcept {
  return guard(call, [&] { Impl(*call); });
}

// `hk_workspace_fn` for `size_t f(const hk_call&, uint32_t pass)` that may throw.
template <size_t (*Impl)(const hk_call&, uint32_t)>
hk_status workspace_point(const hk_call* call, uint32_t pass, size_t* bytes) noexcept {
  return guard(call, [&] {
    if (bytes == nullptr) fail(HK_STATUS_INVALID_ARGUMENT, "workspace query without an output");
    *bytes = Impl(*call, pass);
  });
}

// ---- reading a call -----------------------------------------------------------------------------
// The interface's attribute struct: the prefix the caller sent, defaults for the rest (so callers
// and kernels built against different lengths of one interface version agree on common fields).
template <class Attrs>
Attrs read_attrs(const hk_call& call) {
  Attrs attrs{};
  if (call.attrs != nullptr && call.attrs_size > 0) {
    std::memcpy(&attrs, call.attrs,
                call.attrs_size < sizeof(Attrs) ? call.attrs_size : sizeof(Attrs));
  }
  return attrs;
}

inline bool present(const hk_tensor& t) {
  return t.data != nullptr || t.ndim != 0;
}

inline const hk_tensor* optional_input(const hk_call& call, int index) {
  if (index >= call.num_inputs || !present(call.inputs[index])) return nullptr;
  return &call.inputs[index];
}
inline const hk_tensor* optional_output(const hk_call& call, int index) {
  if (index >= call.num_outputs || !present(call.outputs[index])) return nullptr;
  return &call.outputs[index];
}
inline const hk_tensor& input(const hk_call& call, int index, const char* what) {
  const hk_tensor* t = optional_input(call, index);
  if (t == nullptr) fail(HK_STATUS_INVALID_ARGUMENT, std::string("missing input ") + what);
  return *t;
}
inline const hk_tensor& output(const hk_call& call, int index, const char* what) {
  const hk_tensor* t = optional_output(call, index);
  if (t == nullptr) fail(HK_STATUS_INVALID_ARGUMENT, std::string("missing output ") + what);
  return *t;
}

inline int64_t numel(const hk_tensor& t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}
inline int64_t last_dim(const hk_tensor& t) {
  return t.ndim == 0 ? 1 : t.shape[t.ndim - 1];
}
// Product of all dims but the last.
inline int64_t rows(const hk_tensor& t) {
  return t.ndim == 0 ? 1 : numel(t) / (last_dim(t) ? last_dim(t) : 1);
}

// True when the last dim has stride 1 (or size 1) and the leading dims collapse to rows with one
// fixed row stride; `row_stride` receives it (elements).
inline bool rows_dense(const hk_tensor& t, int64_t* row_stride) {
  if (t.ndim == 0) {
    *row_stride = 1;
    return true;
  }
  const int last = t.ndim - 1;
  if (t.shape[last] > 1 && t.strides[last] != 1) return false;
  int64_t stride = t.shape[last];  // if there are no leading dims with size > 1
  bool have = false;
  int64_t expect = 0;
  for (int i = last - 1; i >= 0; --i) {
    if (t.shape[i] == 1) continue;
    if (!have) {
      stride = t.strides[i];
      expect = stride * t.shape[i];
      have = true;
    } else {
      if (t.strides[i] != expect) return false;
      expect *= t.shape[i];
    }
  }
  *row_stride = stride;
  return true;
}

inline bool same_shape(const hk_tensor& a, const hk_tensor& b) {
  if (a.ndim != b.ndim) return false;
  for (int32_t i = 0; i < a.ndim; ++i)
    if (a.shape[i] != b.shape[i]) return false;
  return true;
}

template <class T>
T* data_ptr(const hk_tensor& t) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data) + t.byte_offset);
}

// ---- hk::TensorView ↔ hk_tensor (fields only) ---------------------------------------------------
inline int32_t device_code(DeviceType type) {
  switch (type) {
    case DeviceType::CPU:
      return HK_DEVICE_CPU;
    case DeviceType::CUDA:
      return HK_DEVICE_CUDA;
    case DeviceType::ROCM:
      return HK_DEVICE_ROCM;
    case DeviceType::XPU:
      return HK_DEVICE_ONEAPI;
    case DeviceType::MPS:
      return HK_DEVICE_METAL;
    case DeviceType::NPU:
      return HK_DEVICE_NPU;
  }
  return 0;
}

// Borrowed: shape/strides point into `view`, which must outlive the result. An undefined view
// (no data, rank 0) becomes an absent tensor.
inline hk_tensor to_hk_tensor(const TensorView& view) {
  hk_tensor t{};
  t.data = view.data;
  t.device_type = device_code(view.device.type);
  t.device_id = view.device.index;
  t.dtype = static_cast<int32_t>(view.dtype);
  t.ndim = view.ndim;
  t.shape = view.shape;
  t.strides = view.strides;
  t.byte_offset = view.byte_offset;
  return t;
}

// Copies shape/strides into the view. Throws Failure for ranks above hk::kMaxDims or unknown
// device/dtype codes.
inline TensorView to_tensor_view(const hk_tensor& t) {
  TensorView v;
  if (t.ndim < 0 || t.ndim > kMaxDims)
    fail(HK_STATUS_UNSUPPORTED, "tensor rank " + std::to_string(t.ndim) + " is above hk's limit");
  if (dtype_code_name(t.dtype) == nullptr)
    fail(HK_STATUS_INVALID_ARGUMENT, "unknown dtype code " + std::to_string(t.dtype));
  switch (t.device_type) {
    case HK_DEVICE_CPU:
      v.device.type = DeviceType::CPU;
      break;
    case HK_DEVICE_CUDA:
      v.device.type = DeviceType::CUDA;
      break;
    case HK_DEVICE_ROCM:
      v.device.type = DeviceType::ROCM;
      break;
    case HK_DEVICE_ONEAPI:
      v.device.type = DeviceType::XPU;
      break;
    case HK_DEVICE_METAL:
      v.device.type = DeviceType::MPS;
      break;
    case HK_DEVICE_NPU:
      v.device.type = DeviceType::NPU;
      break;
    default:
      fail(HK_STATUS_INVALID_ARGUMENT, "unknown device code " + std::to_string(t.device_type));
  }
  v.device.index = t.device_id;
  v.data = t.data;
  v.dtype = static_cast<DType>(t.dtype);
  v.ndim = t.ndim;
  for (int32_t i = 0; i < t.ndim; ++i) {
    v.shape[i] = t.shape[i];
    v.strides[i] = t.strides[i];
  }
  v.byte_offset = t.byte_offset;
  return v;
}

// ---- declaring entries --------------------------------------------------------------------------
// Capability range of this build's device code; hk_add_kernel_repo defines them for CUDA variants
// from HK_CUDA_ARCHITECTURES (e.g. 90a → 90..90; 80 (with PTX) → 80..∞).
#ifndef HK_KERNEL_MIN_CAPABILITY
#define HK_KERNEL_MIN_CAPABILITY 0
#endif
#ifndef HK_KERNEL_MAX_CAPABILITY
#define HK_KERNEL_MAX_CAPABILITY 0
#endif

struct EntrySpec {
  const char* name = nullptr;
  const char* interface = nullptr;
  uint32_t interface_version = 0;
  uint32_t modes = 0;
  const char* device = nullptr;
  uint32_t dtypes = 0;
  hk_kernel_fn forward = nullptr;
  hk_kernel_fn backward = nullptr;
  hk_workspace_fn workspace_size = nullptr;
  const hk_layout* layout = nullptr;
  // -1 = this build's range for GPU entries (the macros above), 0 for cpu entries.
  int32_t min_capability = -1;
  int32_t max_capability = -1;
};

inline hk_kernel_entry make_entry(const EntrySpec& s) {
  const bool cpu = s.device != nullptr && std::strcmp(s.device, "cpu") == 0;
  hk_kernel_entry e{};
  e.name = s.name;
  e.interface = s.interface;
  e.interface_version = s.interface_version;
  e.modes = s.modes;
  e.device = s.device;
  e.min_capability =
      s.min_capability >= 0 ? s.min_capability : (cpu ? 0 : HK_KERNEL_MIN_CAPABILITY);
  e.max_capability =
      s.max_capability >= 0 ? s.max_capability : (cpu ? 0 : HK_KERNEL_MAX_CAPABILITY);
  e.dtypes = s.dtypes;
  e.forward = s.forward;
  e.backward = s.backward;
  e.workspace_size = s.workspace_size;
  e.layout = s.layout;
  return e;
}

}  // namespace hk::sdk

// The ABI major a library reports. Only test repos override it (to prove the loader refuses).
#ifndef HK_SDK_ABI_MAJOR
#define HK_SDK_ABI_MAJOR HK_KERNEL_ABI_MAJOR
#endif

#if defined(_WIN32)
#define HK_KERNEL_EXPORT extern "C" __declspec(dllexport)
#else
#define HK_KERNEL_EXPORT extern "C" __attribute__((visibility("default")))
#endif

// Exports `hk_kernel_library_v1` returning a table over `entries` (a static array).
#define HK_KERNEL_LIBRARY_EXPLICIT(repo, version, build_id, entries)     \
  HK_KERNEL_EXPORT const hk_kernel_library* hk_kernel_library_v1(void) { \
    static const hk_kernel_library library = {                           \
        HK_SDK_ABI_MAJOR,                                                \
        HK_KERNEL_ABI_MINOR,                                             \
        repo,                                                            \
        version,                                                         \
        build_id,                                                        \
        static_cast<uint32_t>(sizeof(hk_kernel_entry)),                  \
        static_cast<uint32_t>(sizeof(entries) / sizeof((entries)[0])),   \
        entries};                                                        \
    return &library;                                                     \
  }

// Same, with repo / version / build id from hk_add_kernel_repo's compile definitions.
#define HK_KERNEL_LIBRARY(entries) \
  HK_KERNEL_LIBRARY_EXPLICIT(HK_KERNEL_REPO, HK_KERNEL_VERSION, HK_KERNEL_BUILD_ID, entries)
