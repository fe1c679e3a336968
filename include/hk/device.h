// hk/device.h — where a tensor lives and what that device can run.
//
// A Device is a value: type, index and (for GPUs) compute capability, e.g. 90 for sm_90. All six
// device types are known so configs and kernel metadata can name them; runtimes exist only for cpu
// and cuda. ROCm devices report themselves as cuda at the framework level elsewhere; hk keeps rocm
// a separate type and detects it at run time (see kernelize). Querying a device never initialises
// anything beyond what it must.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace hk {

enum class DeviceType : uint8_t { CPU, CUDA, ROCM, XPU, MPS, NPU };

const char* device_type_name(DeviceType type);  // "cpu", "cuda", "rocm", "xpu", "mps", "npu"

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  // Compute capability as major*10+minor for CUDA/ROCm devices (90 for H100/H200); 0 otherwise or
  // when unknown. Filled by `Device::parse` / `cuda_device` from the runtime.
  int capability = 0;

  static Device cpu() { return Device{}; }
  // A CUDA device with its capability queried from the runtime. Throws Unsupported when hk was
  // built without CUDA or no such device exists.
  static Device cuda(int index = 0);
  // Parses "cpu", "cuda", "cuda:1", "rocm", "xpu:0", ...; GPU runtimes are queried for capability
  // when available. Throws InvalidArgument on an unknown type.
  static Device parse(std::string_view text);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;  // "cpu", "cuda:0"

  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && (a.type == DeviceType::CPU || a.index == b.index);
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

// Number of CUDA devices visible; 0 when hk has no CUDA or no driver/GPU is present (never throws).
int cuda_device_count();
bool cuda_available();

}  // namespace hk
