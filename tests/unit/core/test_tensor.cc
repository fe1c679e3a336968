// TensorView algebra (reshape/slice/transpose/permute/expand), copies and DLPack round trips.
#include <gtest/gtest.h>

#include <numeric>

#include "hk/allocator.h"
#include "hk/dlpack.h"
#include "hk/error.h"
#include "hk/tensor.h"

namespace hk {
namespace {

Tensor arange(int64_t n, const Shape& shape, DType dtype = DType::F32) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.0f);
  return Tensor::from_floats(v, shape, dtype);
}

}  // namespace

TEST(Tensor, ContiguousStrides) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::F32);
  EXPECT_EQ(t.view().strides[0], 12);
  EXPECT_EQ(t.view().strides[2], 1);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.view().ptr()) % 64, 0u);
}

TEST(Tensor, TransposeAndContiguousCopy) {
  Tensor t = arange(6, {2, 3});
  Tensor tt = t.transpose(0, 1);
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.contiguous().to_doubles(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

TEST(Tensor, SliceStepAndSelect) {
  Tensor t = arange(24, {4, 6});
  Tensor s = t.slice(1, 1, 6, 2);  // columns 1,3,5
  EXPECT_EQ(s.sizes(), (Shape{4, 3}));
  EXPECT_EQ(s.select(0, 2).to_doubles(), (std::vector<double>{13, 15, 17}));
  EXPECT_EQ(t.slice(0, -2, 100).size(0), 2);
  EXPECT_THROW(t.select(0, 4), InvalidArgument);
}

TEST(Tensor, ReshapeViewRules) {
  Tensor t = arange(24, {2, 3, 4});
  EXPECT_EQ(t.reshape({6, -1}).sizes(), (Shape{6, 4}));
  // a row slice keeps rows dense: [2,3,4] sliced on dim 0 can merge 3×4
  Tensor p = t.permute({1, 0, 2});  // [3,2,4], strides [4,12,1]
  EXPECT_EQ(p.reshape({3, 2, 2, 2}).contiguous().to_doubles(), p.contiguous().to_doubles());
  EXPECT_THROW(p.reshape({6, 4}), InvalidArgument);  // needs a copy
  EXPECT_THROW(t.reshape({5, 5}), InvalidArgument);
}

TEST(Tensor, ExpandBroadcasts) {
  Tensor b = arange(3, {3});
  Tensor e = b.expand({2, 3});
  EXPECT_EQ(e.view().strides[0], 0);
  EXPECT_EQ(e.contiguous().to_doubles(), (std::vector<double>{0, 1, 2, 0, 1, 2}));
  EXPECT_THROW(b.expand({2, 4}), InvalidArgument);
}

TEST(Tensor, UnsqueezeSqueeze) {
  Tensor t = arange(6, {2, 3});
  EXPECT_EQ(t.unsqueeze(0).sizes(), (Shape{1, 2, 3}));
  EXPECT_EQ(t.unsqueeze(-1).sizes(), (Shape{2, 3, 1}));
  EXPECT_TRUE(t.unsqueeze(1).is_contiguous());
  EXPECT_EQ(t.unsqueeze(1).squeeze(1).sizes(), (Shape{2, 3}));
  EXPECT_THROW(t.squeeze(0), InvalidArgument);
}

TEST(Tensor, Bf16CopyKeepsBits) {
  Tensor t = arange(12, {3, 4}, DType::BF16);
  Tensor c = t.transpose(0, 1).contiguous().transpose(0, 1).contiguous();
  EXPECT_EQ(c.to_doubles(), t.to_doubles());
}

TEST(Tensor, DlpackRoundTrip) {
  Tensor t = arange(12, {3, 4}).transpose(0, 1);
  DLManagedTensor* m = to_dlpack(t);
  EXPECT_EQ(m->dl_tensor.ndim, 2);
  EXPECT_EQ(m->dl_tensor.strides[0], 1);
  Tensor back = from_dlpack(m);
  EXPECT_EQ(back.contiguous().to_doubles(), t.contiguous().to_doubles());
}

TEST(Allocator, HostStatsTrackPeak) {
  reset_peak_memory_stats(Device::cpu());
  const size_t before = memory_stats(Device::cpu()).allocated;
  {
    Tensor t = Tensor::empty({1000}, DType::F32);
    EXPECT_GE(memory_stats(Device::cpu()).allocated, before + 4000);
  }
  EXPECT_EQ(memory_stats(Device::cpu()).allocated, before);
  EXPECT_GE(memory_stats(Device::cpu()).peak_allocated, before + 4000);
}

}  // namespace hk
