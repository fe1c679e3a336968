// CUDA row-wise ops against the CPU path: rms_norm (+ backward), layer_norm, softmax (+ backward),
// cross_entropy (+ backward, all reductions, ignore_index), argmax, embedding (+ backward), rotary
// tables and rotary embedding (+ backward), over f32/bf16/f16, odd sizes and strided views.
#include <gtest/gtest.h>

#include <cmath>

#include "gpu_testing.h"
#include "hk/ops.h"

namespace hk {
namespace {
using namespace gpu_testing;

// Row reductions in f32 differ from the CPU's order by a few f32 ulps; outputs in 16-bit dtypes
// may then round one way or the other, and a normalised value is rounded twice (x·r, then ·w).
double row_rtol(DType dt) {
  return dt == DType::F32 ? 1e-4 : 2 * rtol_for(dt);
}
double row_atol(DType dt) {
  return dt == DType::F32 ? 1e-5 : 2 * atol_for(dt);
}

TEST(GpuRows, RmsNormForward) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 1;
  for (DType dt : float_dtypes())
    for (const Shape& shape : {Shape{37, 1024}, Shape{5, 3, 131}, Shape{4, 4096}})
      for (Layout lay : {Layout::Contiguous, Layout::PaddedRows, Layout::Transposed}) {
        const std::string what =
            std::string(dtype_name(dt)) + " " + shape_str(shape) + " " + layout_name(lay);
        const int64_t rows = shape.size() == 2 ? shape[0] : shape[0] * shape[1];
        Tensor x = random_cpu(shape, dt, seed++, -3.0f, 3.0f);
        Tensor w = random_cpu({shape.back()}, dt, seed++, 0.5f, 1.5f);
        Tensor ref = Tensor::empty(shape, dt), ref_rstd = Tensor::empty({rows}, DType::F32);
        const TensorView rr = ref_rstd.view();
        ops::rms_norm(x, w, 1e-6f, ref, &rr);
        Tensor out = gpu_output(shape, dt, lay), rstd = gpu_output({rows}, DType::F32);
        const TensorView gr = rstd.view();
        ops::rms_norm(to_gpu(x, lay), to_gpu(w), 1e-6f, out, &gr);
        EXPECT_TRUE(close(out, ref, row_atol(dt), row_rtol(dt))) << what;
        EXPECT_TRUE(close(rstd, ref_rstd, 1e-6, 1e-5)) << "rstd " << what;
      }
}

// The fused residual step against the CPU composition (add, then rms_norm): both outputs, on the
// fused path (aligned rows of 1024) and the fallback (odd width, padded rows), f32 weight too.
TEST(GpuRows, AddRmsNorm) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 900;
  for (DType dt : float_dtypes())
    for (const Shape& shape : {Shape{3, 5, 1024}, Shape{1, 1, 1024}, Shape{7, 131}})
      for (bool f32_weight : {false, true})
        for (Layout lay : {Layout::Contiguous, Layout::PaddedRows}) {
          const std::string what = std::string(dtype_name(dt)) + " " + shape_str(shape) +
                                   (f32_weight ? " f32 weight " : " ") + layout_name(lay);
          Tensor h = random_cpu(shape, dt, seed++, -3.0f, 3.0f);
          Tensor d = random_cpu(shape, dt, seed++, -1.0f, 1.0f);
          Tensor w = random_cpu({shape.back()}, f32_weight ? DType::F32 : dt, seed++, 0.5f, 1.5f);
          Tensor ref_h = h.clone(), ref_y = Tensor::empty(shape, dt);
          ops::add_rms_norm(ref_h, d, w, 1e-6f, ref_y);
          Tensor gh = to_gpu(h, lay), gy = gpu_output(shape, dt, lay);
          ops::add_rms_norm(gh, to_gpu(d, lay), to_gpu(w), 1e-6f, gy);
          // the residual is exactly ops::add: bit-identical to the CPU one
          EXPECT_TRUE(close(gh, ref_h, 0.0, 0.0)) << "residual " << what;
          EXPECT_TRUE(close(gy, ref_y, row_atol(dt), row_rtol(dt))) << what;
        }
}

TEST(GpuRows, RmsNormBackward) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 50;
  for (DType dt : float_dtypes())
    for (const Shape& shape : {Shape{37, 1024}, Shape{13, 131}})
      for (bool with_rstd : {false, true})
        for (bool accumulate : {false, true}) {
          const std::string what = std::string(dtype_name(dt)) + " " + shape_str(shape) +
                                   (with_rstd ? " rstd" : "") + (accumulate ? " accumulate" : "");
          const int64_t rows = shape[0], cols = shape[1];
          Tensor x = random_cpu(shape, dt, seed++, -2.0f, 2.0f);
          Tensor w = random_cpu({cols}, dt, seed++, 0.5f, 1.5f);
          Tensor dy = random_cpu(shape, dt, seed++);
          Tensor y = Tensor::empty(shape, dt), rstd = Tensor::empty({rows}, DType::F32);
          const TensorView rv = rstd.view();
          ops::rms_norm(x, w, 1e-5f, y, &rv);
          Tensor dw0 = random_cpu({cols}, DType::F32, seed++);
          Tensor ref_dx = Tensor::empty(shape, dt), ref_dw = dw0.clone();
          const TensorView ref_dwv = ref_dw.view();
          ops::rms_norm_backward(dy, x, w, 1e-5f, with_rstd ? &rv : nullptr, ref_dx, &ref_dwv,
                                 accumulate);
          Tensor grstd = to_gpu(rstd);
          const TensorView grv = grstd.view();
          Tensor gdx = gpu_output(shape, dt, Layout::PaddedRows), gdw = to_gpu(dw0);
          const TensorView gdwv = gdw.view();
          ops::rms_norm_backward(to_gpu(dy, Layout::Transposed), to_gpu(x), to_gpu(w), 1e-5f,
                                 with_rstd ? &grv : nullptr, gdx, &gdwv, accumulate);
          EXPECT_TRUE(close(gdx, ref_dx, row_atol(dt) * 4, row_rtol(dt))) << "dx " << what;
          // dweight sums `rows` products whose second factor was rounded to the dtype
          const double dw_atol = dt == DType::F32 ? 1e-3 : 0.05 * std::sqrt(double(rows));
          EXPECT_TRUE(close(gdw, ref_dw, dw_atol, row_rtol(dt))) << "dweight " << what;
        }
}

TEST(GpuRows, LayerNorm) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 80;
  for (DType dt : float_dtypes())
    for (bool with_bias : {false, true}) {
      const Shape shape{23, 771};
      Tensor x = random_cpu(shape, dt, seed++, -2.0f, 4.0f);
      Tensor w = random_cpu({771}, dt, seed++, 0.5f, 1.5f), b = random_cpu({771}, dt, seed++);
      Tensor ref = Tensor::empty(shape, dt);
      const TensorView bv = b.view();
      ops::layer_norm(x, w, with_bias ? &bv : nullptr, 1e-5f, ref);
      Tensor gb = to_gpu(b);
      const TensorView gbv = gb.view();
      Tensor out = gpu_output(shape, dt, Layout::PaddedRows);
      ops::layer_norm(to_gpu(x, Layout::Transposed), to_gpu(w), with_bias ? &gbv : nullptr, 1e-5f,
                      out);
      EXPECT_TRUE(close(out, ref, row_atol(dt) * 4, row_rtol(dt)))
          << dtype_name(dt) << (with_bias ? " bias" : "");
    }
}

TEST(GpuRows, SoftmaxForwardBackward) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 120;
  for (DType dt : float_dtypes())
    for (const Shape& shape : {Shape{37, 1000}, Shape{3, 7, 129}, Shape{2, 5}}) {
      const std::string what = std::string(dtype_name(dt)) + " " + shape_str(shape);
      Tensor x = random_cpu(shape, dt, seed++, -6.0f, 6.0f);
      Tensor ref = Tensor::empty(shape, dt);
      ops::softmax(x, ref);
      Tensor out = gpu_output(shape, dt, Layout::PaddedRows);
      ops::softmax(to_gpu(x, Layout::Transposed), out);
      EXPECT_TRUE(close(out, ref, row_atol(dt) * 0.1, row_rtol(dt))) << "forward " << what;

      Tensor dy = random_cpu(shape, dt, seed++);
      Tensor ref_dx = Tensor::empty(shape, dt);
      ops::softmax_backward(dy, ref, ref_dx);
      Tensor gdx = gpu_output(shape, dt);
      ops::softmax_backward(to_gpu(dy), to_gpu(ref), gdx);
      EXPECT_TRUE(close(gdx, ref_dx, row_atol(dt), row_rtol(dt))) << "backward " << what;
    }
}

TEST(GpuRows, CrossEntropyAllReductions) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 160;
  for (DType dt : float_dtypes())
    for (int64_t V : {1000, 32003})
      for (DType label_dt : {DType::I64, DType::I32})
        for (ops::Reduction red :
             {ops::Reduction::None, ops::Reduction::Mean, ops::Reduction::Sum}) {
          const std::string what = std::string(dtype_name(dt)) + " V=" + std::to_string(V) + " " +
                                   dtype_name(label_dt) + " reduction " + std::to_string(int(red));
          const int64_t N = 37;
          Tensor logits = random_cpu({N, V}, dt, seed++, -8.0f, 8.0f);
          std::vector<int64_t> lv = random_ints({N}, 0, V, seed++).to_int64s();
          for (int64_t i = 0; i < N; i += 5) lv[size_t(i)] = -100;  // ignored rows
          Tensor labels = Tensor::from_ints(lv, {N}, label_dt);
          ops::CrossEntropyOptions opt;
          opt.reduction = red;
          const Shape loss_shape = red == ops::Reduction::None ? Shape{N} : Shape{};
          Tensor ref = Tensor::empty(loss_shape, DType::F32),
                 ref_lse = Tensor::empty({N}, DType::F32);
          const TensorView rl = ref_lse.view();
          ops::cross_entropy(logits, labels, ref, opt, &rl);
          Tensor glogits = to_gpu(logits, Layout::PaddedRows), glabels = to_gpu(labels);
          Tensor loss = gpu_output(loss_shape, DType::F32), lse = gpu_output({N}, DType::F32);
          const TensorView gl = lse.view();
          ops::cross_entropy(glogits, glabels, loss, opt, &gl);
          EXPECT_TRUE(close(loss, ref, 1e-4, 1e-5)) << "loss " << what;
          EXPECT_TRUE(close(lse, ref_lse, 1e-4, 1e-6)) << "lse " << what;

          Tensor dloss = red == ops::Reduction::None ? random_cpu({N}, DType::F32, seed++)
                                                     : Tensor::from_floats({1.3f}, {}, DType::F32);
          Tensor ref_d = Tensor::empty({N, V}, dt);
          ops::cross_entropy_backward(dloss, logits, labels, ref_d, opt, nullptr);
          for (bool with_lse : {false, true}) {
            Tensor gd = gpu_output({N, V}, dt);
            ops::cross_entropy_backward(to_gpu(dloss), glogits, glabels, gd, opt,
                                        with_lse ? &gl : nullptr);
            EXPECT_TRUE(close(gd, ref_d, dt == DType::F32 ? 1e-6 : 1e-4, row_rtol(dt)))
                << "dlogits " << what << (with_lse ? " lse" : "");
          }
        }
}

TEST(GpuRows, CrossEntropyMeanOfNothingIsZero) {
  HK_REQUIRE_CUDA();
  Tensor logits = random_cpu({6, 50}, DType::BF16, 9);
  Tensor labels = Tensor::from_ints(std::vector<int64_t>(6, -100), {6});
  Tensor loss = gpu_output({}, DType::F32);
  ops::cross_entropy(to_gpu(logits), to_gpu(labels), loss, {});
  EXPECT_EQ(to_cpu(loss).to_doubles(), std::vector<double>{0.0});
  Tensor d = gpu_output({6, 50}, DType::BF16);
  ops::cross_entropy_backward(to_gpu(Tensor::from_floats({1.0f}, {}, DType::F32)), to_gpu(logits),
                              to_gpu(labels), d, {}, nullptr);
  for (double v : to_cpu(d).to_doubles()) ASSERT_EQ(v, 0.0);
}

TEST(GpuRows, Argmax) {
  HK_REQUIRE_CUDA();
  for (DType dt : float_dtypes()) {
    Tensor x = random_cpu({37, 1001}, dt, 31);
    Tensor ref = Tensor::empty({37}, DType::I64);
    ops::argmax(x, ref);
    Tensor out = gpu_output({37}, DType::I64);
    ops::argmax(to_gpu(x, Layout::Transposed), out);
    EXPECT_EQ(to_cpu(out).to_int64s(), ref.to_int64s()) << dtype_name(dt);
  }
  // ties: the first index wins
  Tensor ties = Tensor::from_floats({1, 3, 3, 0, 2, 2, 2, 2}, {2, 4});
  Tensor out = gpu_output({2}, DType::I64);
  ops::argmax(to_gpu(ties), out);
  EXPECT_EQ(to_cpu(out).to_int64s(), (std::vector<int64_t>{1, 0}));
  // vocabulary-sized rows are split over many blocks: the winner and first-index ties must
  // survive the merge across chunks
  for (DType dt : float_dtypes()) {
    Tensor big = random_cpu({3, 151936}, dt, 77);
    Tensor big_ref = Tensor::empty({3}, DType::I64);
    ops::argmax(big, big_ref);
    Tensor big_out = gpu_output({3}, DType::I64);
    ops::argmax(to_gpu(big), big_out);
    EXPECT_EQ(to_cpu(big_out).to_int64s(), big_ref.to_int64s()) << dtype_name(dt);
  }
  std::vector<float> tie_row(20000, 0.0f);
  tie_row[9000] = tie_row[5000] = tie_row[100 + 4096] = 7.0f;
  Tensor far_ties = Tensor::from_floats(tie_row, {1, 20000});
  Tensor far_out = gpu_output({1}, DType::I64);
  ops::argmax(to_gpu(far_ties), far_out);
  EXPECT_EQ(to_cpu(far_out).to_int64s(), (std::vector<int64_t>{4196}));
}

TEST(GpuRows, EmbeddingForwardBackward) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 300;
  for (DType dt : float_dtypes())
    for (int64_t H : {136, 7})
      for (DType id_dt : {DType::I32, DType::I64}) {
        const std::string what =
            std::string(dtype_name(dt)) + " H=" + std::to_string(H) + " " + dtype_name(id_dt);
        const int64_t V = 50;
        Tensor w = random_cpu({V, H}, dt, seed++);
        Tensor ids = random_ints({3, 71}, 0, V, seed++, id_dt);  // many repeats
        Tensor ref = Tensor::empty({3, 71, H}, dt);
        ops::embedding(w, ids, ref);
        Tensor out = gpu_output({3, 71, H}, dt, Layout::PaddedRows);
        ops::embedding(to_gpu(w), to_gpu(ids), out);
        EXPECT_TRUE(close(out, ref, 0.0, 0.0)) << "forward " << what;

        Tensor dout = random_cpu({3, 71, H}, dt, seed++);
        for (DType dw_dt : {DType::F32, dt}) {
          Tensor dw0 = random_cpu({V, H}, dw_dt, seed++);
          Tensor ref_dw = dw0.clone();
          ops::embedding_backward(dout, ids, ref_dw);
          Tensor gdw = to_gpu(dw0);
          ops::embedding_backward(to_gpu(dout, Layout::Transposed), to_gpu(ids), gdw);
          // up to ~10 tokens per row summed in f32; one final rounding for 16-bit dweight
          EXPECT_TRUE(close(gdw, ref_dw, dw_dt == DType::F32 ? 1e-5 : 3 * atol_for(dw_dt),
                            2 * rtol_for(dw_dt)))
              << "backward " << what << " dweight " << dtype_name(dw_dt);
        }
      }
}

TEST(GpuRows, EmbeddingOutOfRangeIdsGiveZeros) {
  HK_REQUIRE_REAL_CUDA();  // the CPU path throws on such ids instead
  Tensor w = random_cpu({10, 16}, DType::F32, 3);
  Tensor ids = Tensor::from_ints({1, -1, 10, 3}, {4});
  Tensor out = gpu_output({4, 16}, DType::F32);
  ops::embedding(to_gpu(w), to_gpu(ids), out);
  const std::vector<double> got = to_cpu(out).to_doubles(), wv = w.to_doubles();
  for (int64_t h = 0; h < 16; ++h) {
    EXPECT_EQ(got[size_t(h)], wv[size_t(16 + h)]);
    EXPECT_EQ(got[size_t(16 + h)], 0.0);
    EXPECT_EQ(got[size_t(32 + h)], 0.0);
    EXPECT_EQ(got[size_t(48 + h)], wv[size_t(48 + h)]);
  }
}

TEST(GpuRows, RotaryTables) {
  HK_REQUIRE_CUDA();
  for (double theta : {10000.0, 1000000.0})
    for (float scaling : {1.0f, 0.7f}) {
      const int64_t B = 2, S = 19, D = 64;
      Tensor pos = random_ints({B, S}, 0, 500, 7);
      Tensor rc = Tensor::empty({B, S, D}, DType::F32), rs = Tensor::empty({B, S, D}, DType::F32);
      ops::rotary_tables(pos, D, theta, scaling, rc, rs);
      Tensor gc = gpu_output({B, S, D}, DType::F32), gs = gpu_output({B, S, D}, DType::F32);
      ops::rotary_tables(to_gpu(pos), D, theta, scaling, gc, gs);
      // angles up to 500 rad: f32 angle rounding alone is ~3e-5
      EXPECT_TRUE(close(gc, rc, 2e-4, 0.0)) << "cos theta " << theta;
      EXPECT_TRUE(close(gs, rs, 2e-4, 0.0)) << "sin theta " << theta;
    }
}

// x as [B, S, H, D] stored either contiguously or as the transpose of a [B, H, S, D] buffer.
Tensor rotary_input_gpu(const Tensor& x, bool heads_first) {
  if (!heads_first) return to_gpu(x);
  const Shape s = x.sizes();
  Tensor buf = Tensor::empty({s[0], s[2], s[1], s[3]}, x.dtype(), gpu());
  Tensor view = buf.permute({0, 2, 1, 3});
  view.copy_from(x.view());
  return view;
}

TEST(GpuRows, RotaryEmbeddingForwardBackward) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 400;
  for (DType dt : float_dtypes())
    for (const Shape& shape :
         {Shape{2, 19, 4, 128}, Shape{2, 5, 3, 6}, Shape{1, 7, 33, 64}, Shape{1, 3, 40, 512}})
      for (int64_t cos_batch : {int64_t(1), shape[0]})
        for (bool heads_first : {false, true}) {
          const std::string what = std::string(dtype_name(dt)) + " " + shape_str(shape) +
                                   " cos batch " + std::to_string(cos_batch) +
                                   (heads_first ? " BHSD view" : "");
          const int64_t S = shape[1], D = shape[3];
          Tensor pos = random_ints({cos_batch, S}, 0, 300, seed++);
          Tensor cos = Tensor::empty({cos_batch, S, D}, DType::F32),
                 sin = Tensor::empty({cos_batch, S, D}, DType::F32);
          ops::rotary_tables(pos, D, 10000.0, 1.0f, cos, sin);
          Tensor x = random_cpu(shape, dt, seed++);
          Tensor ref = Tensor::empty(shape, dt);
          ops::rotary_embedding(x, cos, sin, ref);
          Tensor gcos = to_gpu(cos), gsin = to_gpu(sin);
          Tensor gx = rotary_input_gpu(x, heads_first);
          Tensor out = gpu_output(shape, dt);
          ops::rotary_embedding(gx, gcos, gsin, out);
          EXPECT_TRUE(close(out, ref, atol_for(dt), rtol_for(dt))) << "forward " << what;
          ops::rotary_embedding(gx, gcos, gsin, gx);  // in place
          EXPECT_TRUE(close(gx, ref, atol_for(dt), rtol_for(dt))) << "in place " << what;

          Tensor dy = random_cpu(shape, dt, seed++);
          Tensor ref_dx = Tensor::empty(shape, dt);
          ops::rotary_embedding_backward(dy, cos, sin, ref_dx);
          Tensor gdx = gpu_output(shape, dt);
          ops::rotary_embedding_backward(rotary_input_gpu(dy, heads_first), gcos, gsin, gdx);
          EXPECT_TRUE(close(gdx, ref_dx, atol_for(dt), rtol_for(dt))) << "backward " << what;
        }
}

}  // namespace
}  // namespace hk
