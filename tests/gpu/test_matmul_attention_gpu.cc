// CUDA matmul/linear (cuBLASLt) and eager attention against the CPU path: transposes (flags and
// transposed views), alpha/beta, batched and broadcast batches, odd shapes, bias, linear backward;
// attention with causal masks, GQA, fewer queries than keys, key_start left padding (including
// fully masked rows), head dims 40/64/128, and its backward from the saved probabilities.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "gpu_testing.h"
#include "hk/ops.h"

namespace hk {
namespace {
using namespace gpu_testing;

// Sums of K products of values in [-1, 1]: f32 order differences ~ K·eps·|terms|; 16-bit outputs
// add their own rounding of the result.
double mm_atol(DType dt, int64_t K) {
  const double base = dt == DType::F32 ? 1e-6 : dt == DType::F16 ? 2e-3 : 1.6e-2;
  return base * std::sqrt(double(K)) + (dt == DType::F32 ? 1e-5 : 0.0);
}

// A GPU copy of a logical [.., R, C] matrix stored column-major (a transposed view).
Tensor gpu_transposed_view(const Tensor& m) {
  return to_gpu(m, Layout::Transposed);
}

TEST(GpuMatmul, TwoDimensionalAllTransposes) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 1;
  struct Dims {
    int64_t M, N, K;
  };
  for (DType dt : float_dtypes())
    for (Dims d : {Dims{67, 45, 129}, Dims{128, 256, 64}, Dims{1, 300, 17}})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (bool views : {false, true}) {
            const std::string what = std::string(dtype_name(dt)) + " M" + std::to_string(d.M) +
                                     " N" + std::to_string(d.N) + " K" + std::to_string(d.K) +
                                     (ta ? " ta" : "") + (tb ? " tb" : "") +
                                     (views ? " views" : "");
            Tensor a = random_cpu(ta ? Shape{d.K, d.M} : Shape{d.M, d.K}, dt, seed++);
            Tensor b = random_cpu(tb ? Shape{d.N, d.K} : Shape{d.K, d.N}, dt, seed++);
            Tensor c0 = random_cpu({d.M, d.N}, dt, seed++);
            ops::MatmulOptions opt;
            opt.trans_a = ta;
            opt.trans_b = tb;
            opt.alpha = 0.5f;
            opt.beta = 0.25f;
            Tensor ref = c0.clone();
            ops::matmul(a, b, ref, opt);
            Tensor ga = views ? gpu_transposed_view(a) : to_gpu(a);
            Tensor gb = views ? gpu_transposed_view(b) : to_gpu(b);
            Tensor gc = to_gpu(c0, views ? Layout::PaddedRows : Layout::Contiguous);
            ops::matmul(ga, gb, gc, opt);
            EXPECT_TRUE(close(gc, ref, mm_atol(dt, d.K), rtol_for(dt))) << what;
          }
}

TEST(GpuMatmul, BatchedAndBroadcast) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 40;
  for (DType dt : float_dtypes())
    for (int64_t b_batch : {int64_t(3), int64_t(1)}) {
      const int64_t Bt = 3, M = 33, N = 70, K = 96;
      Tensor a = random_cpu({Bt, M, K}, dt, seed++), b = random_cpu({b_batch, K, N}, dt, seed++);
      Tensor ref = Tensor::empty({Bt, M, N}, dt);
      ops::matmul(a, b, ref);
      Tensor gc = gpu_output({Bt, M, N}, dt);
      ops::matmul(to_gpu(a), to_gpu(b, Layout::Transposed), gc);
      EXPECT_TRUE(close(gc, ref, mm_atol(dt, K), rtol_for(dt)))
          << dtype_name(dt) << " B batch " << b_batch;
    }
}

TEST(GpuMatmul, LinearWithAndWithoutBias) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 60;
  for (DType dt : float_dtypes())
    for (bool with_bias : {false, true})
      for (Layout lay : {Layout::Contiguous, Layout::PaddedRows}) {
        const int64_t K = 96, N = 80;
        Tensor x = random_cpu({2, 7, K}, dt, seed++), w = random_cpu({N, K}, dt, seed++);
        Tensor bias = random_cpu({N}, dt, seed++);
        const TensorView bv = bias.view();
        Tensor ref = Tensor::empty({2, 7, N}, dt);
        ops::linear(x, w, with_bias ? &bv : nullptr, ref);
        Tensor gbias = to_gpu(bias);
        const TensorView gbv = gbias.view();
        Tensor out = gpu_output({2, 7, N}, dt, lay);
        ops::linear(to_gpu(x, lay), to_gpu(w), with_bias ? &gbv : nullptr, out);
        EXPECT_TRUE(close(out, ref, mm_atol(dt, K), rtol_for(dt)))
            << dtype_name(dt) << (with_bias ? " bias " : " ") << layout_name(lay);
      }
}

TEST(GpuMatmul, LinearBackward) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 80;
  for (DType dt : float_dtypes())
    for (bool accumulate : {false, true}) {
      const int64_t R = 14, K = 96, N = 80;
      Tensor dy = random_cpu({R, N}, dt, seed++), x = random_cpu({R, K}, dt, seed++);
      Tensor w = random_cpu({N, K}, dt, seed++);
      Tensor dw0 = random_cpu({N, K}, dt, seed++), db0 = random_cpu({N}, dt, seed++);
      Tensor rdx = Tensor::empty({R, K}, dt), rdw = dw0.clone(), rdb = db0.clone();
      const TensorView rdxv = rdx.view(), rdwv = rdw.view(), rdbv = rdb.view();
      ops::linear_backward(dy, x, w, &rdxv, &rdwv, &rdbv, accumulate);
      Tensor gdx = gpu_output({R, K}, dt), gdw = to_gpu(dw0), gdb = to_gpu(db0);
      const TensorView gdxv = gdx.view(), gdwv = gdw.view(), gdbv = gdb.view();
      ops::linear_backward(to_gpu(dy), to_gpu(x, Layout::Transposed), to_gpu(w), &gdxv, &gdwv,
                           &gdbv, accumulate);
      const std::string what = std::string(dtype_name(dt)) + (accumulate ? " accumulate" : "");
      EXPECT_TRUE(close(gdx, rdx, mm_atol(dt, N), rtol_for(dt))) << "dx " << what;
      EXPECT_TRUE(close(gdw, rdw, mm_atol(dt, R), rtol_for(dt))) << "dw " << what;
      EXPECT_TRUE(close(gdb, rdb, mm_atol(dt, R), rtol_for(dt))) << "dbias " << what;
    }
}

// q/k/v [B, S, H, D] stored as [B, H, S, D] and permuted: the layout after a head transpose.
Tensor bhsd_view(const Tensor& x) {
  const Shape s = x.sizes();
  Tensor buf = Tensor::empty({s[0], s[2], s[1], s[3]}, x.dtype(), gpu());
  Tensor v = buf.permute({0, 2, 1, 3});
  v.copy_from(x.view());
  return v;
}

struct AttnCase {
  int64_t B, S, T, Hq, Hkv, D;
  bool causal;
  bool key_start;
};

void check_attention_against_cpu(uint32_t seed) {
  const AttnCase cases[] = {
      {2, 19, 19, 4, 2, 64, true, false},  {2, 5, 19, 4, 2, 64, true, false},
      {2, 19, 19, 4, 4, 40, false, false}, {2, 19, 19, 8, 1, 128, true, true},
      {1, 33, 33, 2, 2, 128, true, true},  {2, 1, 17, 4, 2, 64, true, true},
  };
  for (DType dt : float_dtypes())
    for (const AttnCase& c : cases)
      for (bool strided : {false, true}) {
        const std::string what = std::string(dtype_name(dt)) + " B" + std::to_string(c.B) + " S" +
                                 std::to_string(c.S) + " T" + std::to_string(c.T) + " Hq" +
                                 std::to_string(c.Hq) + " Hkv" + std::to_string(c.Hkv) + " D" +
                                 std::to_string(c.D) + (c.causal ? " causal" : "") +
                                 (c.key_start ? " key_start" : "") + (strided ? " BHSD" : "");
        Tensor q = random_cpu({c.B, c.S, c.Hq, c.D}, dt, seed++, -2.0f, 2.0f);
        Tensor k = random_cpu({c.B, c.T, c.Hkv, c.D}, dt, seed++, -2.0f, 2.0f);
        Tensor v = random_cpu({c.B, c.T, c.Hkv, c.D}, dt, seed++);
        // second batch left-padded by 5 keys: with S = T its first 5 queries see nothing
        std::vector<int64_t> starts(size_t(c.B), 0);
        if (c.B > 1) starts[1] = 5;
        Tensor ks = Tensor::from_ints(starts, {c.B}, DType::I32);
        Tensor gks = to_gpu(ks);
        const TensorView ksv = ks.view(), gksv = gks.view();
        ops::AttentionOptions opt, gopt;
        opt.causal = gopt.causal = c.causal;
        if (c.key_start) {
          opt.key_start = &ksv;
          gopt.key_start = &gksv;
        }
        Tensor ref = Tensor::empty({c.B, c.S, c.Hq, c.D}, dt);
        Tensor rprobs = Tensor::empty({c.B, c.Hq, c.S, c.T}, DType::F32);
        const TensorView rpv = rprobs.view();
        ops::attention(q, k, v, ref, opt, &rpv);

        Tensor gq = strided ? bhsd_view(q) : to_gpu(q), gk = strided ? bhsd_view(k) : to_gpu(k);
        Tensor gv = strided ? bhsd_view(v) : to_gpu(v);
        Tensor out = gpu_output({c.B, c.S, c.Hq, c.D}, dt);
        Tensor probs = gpu_output({c.B, c.Hq, c.S, c.T}, DType::F32);
        const TensorView gpv = probs.view();
        ops::attention(gq, gk, gv, out, gopt, &gpv);
        EXPECT_TRUE(close(probs, rprobs, 2e-5, 1e-4)) << "probs " << what;
        EXPECT_TRUE(close(out, ref, mm_atol(dt, 8), rtol_for(dt))) << "out " << what;

        Tensor dout = random_cpu({c.B, c.S, c.Hq, c.D}, dt, seed++);
        Tensor rdq = Tensor::empty(q.sizes(), dt), rdk = Tensor::empty(k.sizes(), dt),
               rdv = Tensor::empty(v.sizes(), dt);
        ops::attention_backward(dout, q, k, v, rprobs, rdq, rdk, rdv, opt);
        Tensor gdq = gpu_output(q.sizes(), dt), gdk = gpu_output(k.sizes(), dt),
               gdv = gpu_output(v.sizes(), dt);
        ops::attention_backward(strided ? bhsd_view(dout) : to_gpu(dout), gq, gk, gv, probs, gdq,
                                gdk, gdv, gopt);
        const double tol = mm_atol(dt, c.T) * 2;
        EXPECT_TRUE(close(gdq, rdq, tol, rtol_for(dt) * 2)) << "dq " << what;
        EXPECT_TRUE(close(gdk, rdk, tol, rtol_for(dt) * 2)) << "dk " << what;
        EXPECT_TRUE(close(gdv, rdv, tol, rtol_for(dt) * 2)) << "dv " << what;
      }
}

// The forward's products on cuBLASLt (the default path).
TEST(GpuAttention, ForwardAndBackwardMatchCpu) {
  HK_REQUIRE_CUDA();
  check_attention_against_cpu(500);
}

// The loop kernels the forward falls back to (HK_ATTENTION_NO_GEMM=1 forces them).
TEST(GpuAttention, LoopKernelsMatchCpu) {
  HK_REQUIRE_CUDA();
  setenv("HK_ATTENTION_NO_GEMM", "1", 1);
  check_attention_against_cpu(600);
  unsetenv("HK_ATTENTION_NO_GEMM");
}

}  // namespace
}  // namespace hk
