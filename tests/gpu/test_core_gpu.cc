// Core runtime on a CUDA device: caching-allocator statistics and reuse, Tensor::to round trips
// for every dtype, the strided copy kernel on transposed/sliced views, streams and events.
#include <gtest/gtest.h>

#include <cstring>

#include "gpu_testing.h"
#include "hk/allocator.h"
#include "hk/stream.h"
#include "hk/tensor.h"

namespace hk {
namespace {
using namespace gpu_testing;

TEST(GpuCore, DeviceReportsCapability) {
  HK_REQUIRE_REAL_CUDA();
  const Device d = gpu();
  EXPECT_TRUE(d.is_cuda());
  EXPECT_GE(d.capability, 50);
  EXPECT_EQ(d.str(), "cuda:0");
}

TEST(GpuCore, AllocatorStatsTrackAllocatedReservedPeak) {
  HK_REQUIRE_REAL_CUDA();
  const Device d = gpu();
  OwnedStream stream(d);
  synchronize_device(d);
  const MemoryStats before = memory_stats(d);
  reset_peak_memory_stats(d);
  const size_t bytes = size_t(3) << 20;  // 3 MiB, a whole number of MiB blocks
  {
    Tensor t = Tensor::empty({int64_t(bytes / 4)}, DType::F32, d, stream);
    const MemoryStats during = memory_stats(d);
    EXPECT_GE(during.allocated, before.allocated + bytes);
    EXPECT_GE(during.reserved, during.allocated);
    EXPECT_GE(during.peak_allocated, during.allocated);
    EXPECT_EQ(during.num_allocs, before.num_allocs + 1);
  }
  const MemoryStats after = memory_stats(d);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_GE(after.peak_allocated, before.allocated + bytes);
  EXPECT_GE(after.reserved, before.allocated + bytes) << "freed block should stay cached";
}

TEST(GpuCore, FreedBlockIsReusedOnTheSameStream) {
  HK_REQUIRE_REAL_CUDA();
  const Device d = gpu();
  OwnedStream stream(d);
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({1 << 20}, DType::F32, d, stream);
    first = t.view().data;
  }
  const size_t mallocs = memory_stats(d).num_device_mallocs;
  Tensor again = Tensor::empty({1 << 20}, DType::F32, d, stream);
  EXPECT_EQ(again.view().data, first);
  EXPECT_EQ(memory_stats(d).num_device_mallocs, mallocs) << "a cached block should be reused";
}

TEST(GpuCore, EmptyCacheReturnsReservedMemory) {
  HK_REQUIRE_REAL_CUDA();
  const Device d = gpu();
  { Tensor t = Tensor::empty({int64_t(8) << 20}, DType::F32, d); }
  const size_t reserved = memory_stats(d).reserved;
  empty_cache(d);
  EXPECT_LT(memory_stats(d).reserved, reserved);
}

TEST(GpuCore, ToRoundTripsEveryDtype) {
  HK_REQUIRE_REAL_CUDA();
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    Tensor cpu = random_cpu({3, 17, 5}, dt, 7);
    Tensor back = to_cpu(cpu.to(gpu()));
    EXPECT_EQ(back.to_doubles(), cpu.to_doubles()) << dtype_name(dt);
  }
  for (DType dt : {DType::I32, DType::I64, DType::U8}) {
    Tensor cpu = random_ints({4, 33}, 0, 200, 3, dt);
    Tensor back = to_cpu(cpu.to(gpu()));
    EXPECT_EQ(back.to_int64s(), cpu.to_int64s()) << dtype_name(dt);
  }
}

TEST(GpuCore, StridedCopyKernelMaterialisesTransposedViews) {
  HK_REQUIRE_REAL_CUDA();
  for (DType dt : {DType::F32, DType::BF16, DType::F64, DType::U8}) {
    Tensor cpu =
        is_floating(dt) ? random_cpu({5, 7, 3}, dt, 11) : random_ints({5, 7, 3}, 0, 250, 11, dt);
    Tensor g = cpu.to(gpu());
    // permute then contiguous on the GPU, compared with the same on the CPU
    Tensor g_perm = g.permute({2, 0, 1}).contiguous();
    Tensor c_perm = cpu.permute({2, 0, 1}).contiguous();
    ASSERT_TRUE(g_perm.is_contiguous());
    EXPECT_EQ(to_cpu(g_perm).to_doubles(), c_perm.to_doubles()) << dtype_name(dt);
    // sliced + stepped view, copied into a transposed destination view
    Tensor src = g.slice(1, 1, 7, 2);  // [5, 3, 3]
    Tensor dst_buf = Tensor::empty({5, 3, 3}, dt, gpu());
    Tensor dst = dst_buf.transpose(1, 2);
    dst.copy_from(src.view());
    Tensor expect = cpu.slice(1, 1, 7, 2).contiguous();
    EXPECT_EQ(to_cpu(dst).to_doubles(), expect.to_doubles()) << dtype_name(dt);
  }
}

TEST(GpuCore, BroadcastViewsCopy) {
  HK_REQUIRE_REAL_CUDA();
  Tensor row = random_cpu({1, 9}, DType::F32, 5);
  Tensor g = row.to(gpu()).expand({4, 9}).contiguous();
  std::vector<double> expect;
  for (int i = 0; i < 4; ++i)
    for (double v : row.to_doubles()) expect.push_back(v);
  EXPECT_EQ(to_cpu(g).to_doubles(), expect);
}

TEST(GpuCore, StreamOrderingAndEvents) {
  HK_REQUIRE_REAL_CUDA();
  const Device d = gpu();
  OwnedStream stream(d);
  Tensor cpu = random_cpu({1 << 16}, DType::F32, 9);
  Tensor g = cpu.to(d, stream);
  Event start, stop;
  start.record(stream);
  Tensor h = g.clone(stream);
  stop.record(stream);
  EXPECT_GE(Event::elapsed_ms(start, stop), 0.0f);
  EXPECT_EQ(to_cpu(h, stream).to_doubles(), cpu.to_doubles());
}

TEST(GpuCore, ZerosAreZero) {
  HK_REQUIRE_REAL_CUDA();
  Tensor z = Tensor::zeros({3, 1001}, DType::BF16, gpu());
  for (double v : to_cpu(z).to_doubles()) ASSERT_EQ(v, 0.0);
}

}  // namespace
}  // namespace hk
