// Device parsing and CUDA device queries. Without CUDA every query answers "no device".
#include "hk/device.h"

#include <charconv>

#include "hk/error.h"
#ifdef HK_HAVE_CUDA
#include "core/cuda_check.h"
#endif

namespace hk {

const char* device_type_name(DeviceType type) {
  switch (type) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::CUDA: return "cuda";
    case DeviceType::ROCM: return "rocm";
    case DeviceType::XPU: return "xpu";
    case DeviceType::MPS: return "mps";
    case DeviceType::NPU: return "npu";
  }
  return "?";
}

int cuda_device_count() {
#ifdef HK_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_device_count() > 0; }

Device Device::cuda(int index) {
#ifdef HK_HAVE_CUDA
  const int count = cuda_device_count();
  if (index < 0 || index >= count)
    throw Unsupported("CUDA device " + std::to_string(index) + " is not available (" +
                      std::to_string(count) + " visible); use --device cpu or check the driver");
  cudaDeviceProp prop{};
  HK_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return Device{DeviceType::CUDA, index, prop.major * 10 + prop.minor};
#else
  throw Unsupported("hk was built without CUDA; rebuild with -DHK_CUDA=ON or use --device cpu");
#endif
}

Device Device::parse(std::string_view text) {
  std::string_view type = text;
  int index = 0;
  if (auto colon = text.find(':'); colon != std::string_view::npos) {
    type = text.substr(0, colon);
    auto digits = text.substr(colon + 1);
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec != std::errc() || end != digits.data() + digits.size() || index < 0)
      throw InvalidArgument("bad device index in '" + std::string(text) +
                            "'; expected e.g. cuda:0");
  }
  if (type == "cpu") return Device::cpu();
  if (type == "cuda") return Device::cuda(index);
  static constexpr std::pair<const char*, DeviceType> kOthers[] = {
      {"rocm", DeviceType::ROCM}, {"xpu", DeviceType::XPU}, {"mps", DeviceType::MPS},
      {"npu", DeviceType::NPU}};
  for (auto [name, t] : kOthers)
    if (type == name) return Device{t, index, 0};
  throw InvalidArgument("unknown device '" + std::string(text) +
                        "'; use cpu, cuda[:N], rocm, xpu, mps or npu");
}

std::string Device::str() const {
  if (type == DeviceType::CPU) return "cpu";
  return std::string(device_type_name(type)) + ":" + std::to_string(index);
}

}  // namespace hk
