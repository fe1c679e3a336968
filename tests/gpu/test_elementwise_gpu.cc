// CUDA elementwise ops against the CPU path: add, mul, scale, cast, fill, activations and
// act_mul (forward and backward), over f32/bf16/f16, odd and vector-friendly shapes, and
// contiguous, padded-row and transposed views (plus broadcasting and in-place outputs).
#include <gtest/gtest.h>

#include "gpu_testing.h"
#include "hk/ops.h"

namespace hk {
namespace {
using namespace gpu_testing;

const Layout kLayouts[] = {Layout::Contiguous, Layout::PaddedRows, Layout::Transposed};
const Shape kShapes[] = {{64, 256}, {37, 131}, {3, 5, 9}};
const ops::Activation kActs[] = {ops::Activation::SiLU, ops::Activation::GELU,
                                 ops::Activation::GELUTanh, ops::Activation::QuickGELU};
const char* act_name(ops::Activation a) {
  switch (a) {
    case ops::Activation::SiLU:
      return "silu";
    case ops::Activation::GELU:
      return "gelu";
    case ops::Activation::GELUTanh:
      return "gelu_tanh";
    case ops::Activation::QuickGELU:
      return "quick_gelu";
  }
  return "?";
}

TEST(GpuElementwise, AddMulScale) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 1;
  for (DType dt : float_dtypes())
    for (const Shape& shape : kShapes)
      for (Layout lay : kLayouts) {
        const std::string what =
            std::string(dtype_name(dt)) + " " + shape_str(shape) + " " + layout_name(lay);
        Tensor a = random_cpu(shape, dt, seed++), b = random_cpu(shape, dt, seed++);
        Tensor ga = to_gpu(a, lay), gb = to_gpu(b, Layout::Contiguous);

        Tensor ref = Tensor::empty(shape, dt);
        ops::add(a, b, ref, 0.75f);
        Tensor out = gpu_output(shape, dt, lay);
        ops::add(ga, gb, out, 0.75f);
        EXPECT_TRUE(close(out, ref, atol_for(dt), rtol_for(dt))) << "add " << what;

        ops::mul(a, b, ref);
        out = gpu_output(shape, dt, lay);
        ops::mul(ga, gb, out);
        EXPECT_TRUE(close(out, ref, atol_for(dt), rtol_for(dt))) << "mul " << what;

        ops::scale(a, -1.5f, ref);
        out = gpu_output(shape, dt, lay);
        ops::scale(ga, -1.5f, out);
        EXPECT_TRUE(close(out, ref, atol_for(dt), rtol_for(dt))) << "scale " << what;
      }
}

TEST(GpuElementwise, AddBroadcastAndInPlace) {
  HK_REQUIRE_CUDA();
  for (DType dt : float_dtypes()) {
    const Shape shape{37, 131};
    Tensor a = random_cpu(shape, dt, 3), row = random_cpu({131}, dt, 4);
    Tensor ref = Tensor::empty(shape, dt);
    ops::add(a, row.expand(shape), ref, 1.0f);
    Tensor ga = to_gpu(a), grow = to_gpu(row);
    Tensor out = gpu_output(shape, dt);
    ops::add(ga, grow.expand(shape), out, 1.0f);
    EXPECT_TRUE(close(out, ref, atol_for(dt), rtol_for(dt))) << "broadcast " << dtype_name(dt);
    ops::add(ga, grow.expand(shape), ga, 1.0f);  // out aliases a
    EXPECT_TRUE(close(ga, ref, atol_for(dt), rtol_for(dt))) << "in place " << dtype_name(dt);
    Tensor gm = to_gpu(a, Layout::PaddedRows);
    ops::mul(gm, grow.expand(shape), gm);
    ops::mul(a, row.expand(shape), ref);
    EXPECT_TRUE(close(gm, ref, atol_for(dt), rtol_for(dt))) << "mul in place " << dtype_name(dt);
  }
}

TEST(GpuElementwise, CastBetweenFloatDtypes) {
  HK_REQUIRE_CUDA();
  for (DType from : float_dtypes())
    for (DType to : float_dtypes())
      for (Layout lay : kLayouts) {
        const Shape shape{37, 131};
        Tensor x = random_cpu(shape, from, 8, -300.0f, 300.0f);
        Tensor ref = Tensor::empty(shape, to);
        ops::cast(x, ref);
        Tensor out = gpu_output(shape, to, lay);
        ops::cast(to_gpu(x, lay), out);
        // a cast is exact (one rounding, round-to-nearest-even on both sides)
        EXPECT_TRUE(close(out, ref, 0.0, 0.0))
            << dtype_name(from) << "->" << dtype_name(to) << " " << layout_name(lay);
      }
}

TEST(GpuElementwise, CastIntegers) {
  HK_REQUIRE_CUDA();
  Tensor ids = random_ints({7, 33}, -1000, 100000, 5, DType::I64);
  Tensor ref = Tensor::empty({7, 33}, DType::I32);
  ops::cast(ids, ref);
  Tensor out = gpu_output({7, 33}, DType::I32, Layout::Transposed);
  ops::cast(to_gpu(ids), out);
  EXPECT_EQ(to_cpu(out).to_int64s(), ref.to_int64s());
  Tensor f = Tensor::empty({7, 33}, DType::F32);
  ops::cast(ids, f);
  Tensor gf = gpu_output({7, 33}, DType::F32);
  ops::cast(to_gpu(ids), gf);
  EXPECT_TRUE(close(gf, f, 0.0, 0.0));
}

TEST(GpuElementwise, Fill) {
  HK_REQUIRE_CUDA();
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64}) {
    Tensor ref = Tensor::empty({5, 77}, dt);
    ops::fill(ref, 3.0);
    Tensor out = gpu_output({5, 77}, dt, Layout::Transposed);
    ops::fill(out, 3.0);
    EXPECT_EQ(to_cpu(out).to_doubles(), ref.to_doubles()) << dtype_name(dt);
  }
}

TEST(GpuElementwise, ActivationForwardBackward) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 100;
  for (ops::Activation act : kActs)
    for (DType dt : float_dtypes())
      for (const Shape& shape : kShapes)
        for (Layout lay : kLayouts) {
          const std::string what = std::string(act_name(act)) + " " + dtype_name(dt) + " " +
                                   shape_str(shape) + " " + layout_name(lay);
          Tensor x = random_cpu(shape, dt, seed++, -5.0f, 5.0f);
          Tensor dy = random_cpu(shape, dt, seed++);
          Tensor ref = Tensor::empty(shape, dt);
          ops::activation(act, x, ref);
          Tensor gx = to_gpu(x, lay), out = gpu_output(shape, dt, lay);
          ops::activation(act, gx, out);
          EXPECT_TRUE(close(out, ref, atol_for(dt), rtol_for(dt))) << "forward " << what;

          ops::activation_backward(act, dy, x, ref);
          out = gpu_output(shape, dt);
          ops::activation_backward(act, to_gpu(dy, lay), gx, out);
          EXPECT_TRUE(close(out, ref, atol_for(dt), rtol_for(dt))) << "backward " << what;
        }
}

TEST(GpuElementwise, ActMulOnFusedGateUpHalves) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 200;
  for (ops::Activation act : kActs)
    for (DType dt : float_dtypes())
      for (int64_t inter : {256, 131}) {
        const std::string what =
            std::string(act_name(act)) + " " + dtype_name(dt) + " I=" + std::to_string(inter);
        const int64_t rows = 29;
        // gate and up as the two halves of one [rows, 2I] projection output (dense rows, not
        // contiguous), the layout of a fused gate_up_proj
        Tensor gu = random_cpu({rows, 2 * inter}, dt, seed++, -4.0f, 4.0f);
        Tensor gate = gu.slice(1, 0, inter), up = gu.slice(1, inter, 2 * inter);
        Tensor ggu = to_gpu(gu);
        Tensor ggate = ggu.slice(1, 0, inter), gup = ggu.slice(1, inter, 2 * inter);
        Tensor ref = Tensor::empty({rows, inter}, dt);
        ops::act_mul(act, gate, up, ref);
        Tensor out = gpu_output({rows, inter}, dt);
        ops::act_mul(act, ggate, gup, out);
        EXPECT_TRUE(close(out, ref, atol_for(dt), rtol_for(dt))) << "forward " << what;

        Tensor dout = random_cpu({rows, inter}, dt, seed++);
        Tensor rdg = Tensor::empty({rows, inter}, dt), rdu = Tensor::empty({rows, inter}, dt);
        ops::act_mul_backward(act, dout, gate, up, rdg, rdu);
        Tensor gdg = gpu_output({rows, inter}, dt, Layout::Transposed);
        Tensor gdu = gpu_output({rows, inter}, dt, Layout::PaddedRows);
        ops::act_mul_backward(act, to_gpu(dout), ggate, gup, gdg, gdu);
        EXPECT_TRUE(close(gdg, rdg, atol_for(dt), rtol_for(dt))) << "dgate " << what;
        EXPECT_TRUE(close(gdu, rdu, atol_for(dt), rtol_for(dt))) << "dup " << what;
      }
}

}  // namespace
}  // namespace hk
