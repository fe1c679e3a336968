// Safetensors with CUDA tensors (ctest label `gpu`): the writer accepts device views, including
// non-contiguous ones, and load() places tensors on the device, converted when asked.
#include <gtest/gtest.h>

#include "hk/checkpoint.h"
#include "hk/safetensors.h"
#include "io_test_util.h"

namespace hk {
namespace {

TEST(SafetensorsGpu, SaveCudaViewsAndLoadToCuda) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  test::ScratchDir dir;
  const std::string path = dir.file("gpu.safetensors");
  std::vector<float> values(12);
  for (int i = 0; i < 12; ++i) values[i] = 0.5f * static_cast<float>(i);
  const Tensor host = Tensor::from_floats(values, {3, 4}, DType::BF16);
  const Tensor device = host.to(Device::cuda());
  const Tensor transposed = device.transpose(0, 1);  // non-contiguous, on the GPU
  save_safetensors(path, {{"w", device.view()}, {"wt", transposed.view()}});

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.load("w").to_doubles(), host.to_doubles());
  EXPECT_EQ(file.load("wt").to_doubles(), host.transpose(0, 1).contiguous().to_doubles());

  const Tensor on_gpu = file.load("w", Device::cuda());
  EXPECT_TRUE(on_gpu.device().is_cuda());
  EXPECT_EQ(on_gpu.to(Device::cpu()).to_doubles(), host.to_doubles());
  const Tensor converted = Checkpoint::open(path).load("wt", Device::cuda(), DType::F32);
  EXPECT_EQ(converted.dtype(), DType::F32);
  EXPECT_TRUE(converted.device().is_cuda());
  EXPECT_EQ(converted.to(Device::cpu()).to_doubles(),
            host.transpose(0, 1).contiguous().to_doubles());
}

}  // namespace
}  // namespace hk
