// embedding and embedding_backward on CPU: exact row gathers for every dtype and layout, the
// scatter-add against a double reference (repeated ids, f32 accumulation into a 16-bit table),
// finite differences in f64, and out-of-range ids.
#include <gtest/gtest.h>

#include "common/op_testing.h"
#include "hk/ops.h"

namespace hk {
namespace {

using namespace hk::test;

TEST(Embedding, GathersRowsExactly) {
  uint64_t seed = 1;
  for (DType dt : kTestDtypes)
    for (DType id_dtype : {DType::I32, DType::I64})
      for (Layout lo : kAllLayouts) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " ids " << dtype_name(id_dtype)
                                          << " out " << layout_name(lo));
        const int64_t vocab = 37, hidden = 33;
        Tensor weight = random_tensor({vocab, hidden}, dt, seed++);
        Tensor ids = random_ints({2, 5}, id_dtype, 0, vocab, seed++);
        Tensor out = empty_with_layout({2, 5, hidden}, dt, lo);
        ops::embedding(weight, ids, out);
        const auto w = values(weight);
        const auto id = ids.to_int64s();
        std::vector<double> ref;
        for (int64_t i : id)
          ref.insert(ref.end(), w.begin() + i * hidden, w.begin() + (i + 1) * hidden);
        EXPECT_TRUE(all_close(out, ref, Tolerance{0, 0}));
      }
}

TEST(Embedding, StridedWeightAndIds) {
  Tensor weight = with_layout(random_tensor({11, 7}, DType::BF16, 5), Layout::Transposed);
  Tensor ids_base = random_ints({4, 6}, DType::I64, 0, 11, 6);
  Tensor ids = ids_base.slice(1, 0, 6, 2);  // [4, 3] with stride 2
  Tensor out = Tensor::empty({4, 3, 7}, DType::BF16);
  ops::embedding(weight, ids, out);
  const auto w = values(weight);
  std::vector<double> ref;
  for (int64_t i : ids.to_int64s())
    ref.insert(ref.end(), w.begin() + i * 7, w.begin() + (i + 1) * 7);
  EXPECT_TRUE(all_close(out, ref, Tolerance{0, 0}));
}

TEST(Embedding, OutOfRangeIdThrows) {
  Tensor weight = random_tensor({4, 3}, DType::F32, 1);
  Tensor out = Tensor::empty({2, 3}, DType::F32);
  HK_EXPECT_INVALID(ops::embedding(weight, Tensor::from_ints({1, 4}, {2}), out), "embedding");
  HK_EXPECT_INVALID(ops::embedding(weight, Tensor::from_ints({-1, 0}, {2}), out), "embedding");
  Tensor dweight = Tensor::zeros({4, 3}, DType::F32);
  HK_EXPECT_INVALID(ops::embedding_backward(out, Tensor::from_ints({0, 9}, {2}), dweight),
                    "embedding_backward");
}

TEST(EmbeddingBackward, ScatterAddsWithRepeatsMatchesReference) {
  uint64_t seed = 50;
  for (DType dt : kTestDtypes)
    for (bool f32_table : {false, true}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << (f32_table ? " f32 table" : ""));
      const int64_t vocab = 9, hidden = 129;
      const DType table_dtype = f32_table ? DType::F32 : dt;
      Tensor ids = random_ints({3, 7}, DType::I64, 0, vocab, seed++);  // many repeats
      Tensor dout = with_layout(random_tensor({3, 7, hidden}, dt, seed++), Layout::Strided);
      Tensor dw0 = random_tensor({vocab, hidden}, table_dtype, seed++);
      Tensor dweight = with_layout(dw0, Layout::PaddedRows);
      ops::embedding_backward(dout, ids, dweight);
      auto ref = values(dw0);
      std::vector<double> naive = ref;
      const auto g = values(dout);
      const auto id = ids.to_int64s();
      for (size_t i = 0; i < id.size(); ++i)
        for (int64_t h = 0; h < hidden; ++h) {
          ref[id[i] * hidden + h] += g[i * hidden + h];
          naive[id[i] * hidden + h] =
              static_cast<float>(static_cast<float>(naive[id[i] * hidden + h]) +
                                 static_cast<float>(g[i * hidden + h]));
        }
      EXPECT_TRUE(all_close(dweight, ref, naive_bound(ref, naive)));
    }
}

TEST(EmbeddingBackward, FiniteDifferencesF64) {
  const int64_t vocab = 5, hidden = 3;
  Tensor weight = random_tensor({vocab, hidden}, DType::F64, 70);
  Tensor ids = Tensor::from_ints({1, 3, 1, 0}, {2, 2});
  Tensor w = random_tensor({2, 2, hidden}, DType::F64, 71);
  Tensor out = Tensor::empty({2, 2, hidden}, DType::F64);
  const auto wv = values(w);
  auto loss = [&] {
    ops::embedding(weight, ids, out);
    return weighted_sum(out, wv);
  };
  Tensor dweight = Tensor::zeros({vocab, hidden}, DType::F64);
  ops::embedding_backward(w, ids, dweight);
  EXPECT_TRUE(all_close(dweight, numeric_gradient(weight, loss), Tolerance{1e-8, 1e-7}));
}

}  // namespace
}  // namespace hk
