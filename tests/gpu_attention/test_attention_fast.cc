// The fast CUDA forward attention (decode kernel and batched-GEMM prefill) against the CPU path of
// hk::ops::attention: f32/bf16/f16; prefill S = T = 300 with GQA and head dims 64/128/256; causal
// row blocks (S = 520, S < T, S > T); fewer
// queries than keys (a KV cache); decode S = 1..4 with T from 1 to 7680, both the cluster-split
// kernel (small grids) and the one-block-per-row kernel; key_start left padding
// including fully masked rows (i32 and i64); non-causal with a custom scale; q, k, v and out as
// strided views (heads-major storage, a slice of a fused qkv buffer); head dims the GEMM path
// rejects for alignment (they must still be right, through the eager kernels).
// Without probs, hk::ops::attention on CUDA takes the fast path whenever it accepts the case.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu/gpu_testing.h"
#include "hk/ops.h"

namespace hk {
namespace {
using namespace gpu_testing;

// The probabilities are rounded to the dtype before P·V on both sides, but an f32 probability
// next to a rounding boundary may round the other way: one unit in the last place of one
// probability, times |v| ≤ 1, on top of the output's own rounding.
double atol_attn(DType dt) {
  return dt == DType::BF16 ? 2e-2 : dt == DType::F16 ? 3e-3 : 2e-5;
}
double rtol_attn(DType dt) {
  return dt == DType::BF16 ? 2e-2 : dt == DType::F16 ? 4e-3 : 1e-4;
}

enum class Storage { Contiguous, HeadsMajor, FusedQkv };
const char* storage_name(Storage s) {
  return s == Storage::Contiguous ? "contiguous" : s == Storage::HeadsMajor ? "BHSD" : "fused";
}

// A GPU [B, S, H, D] view of x stored heads-major ([B, H, S, D] permuted back).
Tensor heads_major(const Tensor& x) {
  const Shape s = x.sizes();
  Tensor buf = Tensor::empty({s[0], s[2], s[1], s[3]}, x.dtype(), gpu());
  Tensor v = buf.permute({0, 2, 1, 3});
  v.copy_from(x.view());
  return v;
}
// A GPU [B, S, H, D] view of x that is a slice of wider rows [B, S, H + extra, D] (the layout of
// a fused qkv projection viewed per head), starting at head `offset`.
Tensor fused_slice(const Tensor& x, int64_t extra, int64_t offset) {
  const Shape s = x.sizes();
  Tensor buf = Tensor::empty({s[0], s[1], s[2] + extra, s[3]}, x.dtype(), gpu());
  ops::fill(buf, 0.0);
  Tensor v = buf.slice(2, offset, offset + s[2]);
  v.copy_from(x.view());
  return v;
}
Tensor place(const Tensor& x, Storage storage, int64_t offset) {
  switch (storage) {
    case Storage::HeadsMajor:
      return heads_major(x);
    case Storage::FusedQkv:
      return fused_slice(x, 3, offset);
    default:
      return to_gpu(x);
  }
}

struct Case {
  int64_t B, S, T, Hq, Hkv, D;
  bool causal = true;
  std::vector<int64_t> key_start = {};  // empty: no mask
  DType key_start_dtype = DType::I32;
  float scale = 0.0f;
};

std::string describe(const Case& c, DType dt, Storage storage) {
  std::string s = std::string(dtype_name(dt)) + " B" + std::to_string(c.B) + " S" +
                  std::to_string(c.S) + " T" + std::to_string(c.T) + " Hq" + std::to_string(c.Hq) +
                  " Hkv" + std::to_string(c.Hkv) + " D" + std::to_string(c.D) +
                  (c.causal ? " causal" : " full") + " " + storage_name(storage);
  if (!c.key_start.empty()) {
    s += " key_start";
    for (int64_t x : c.key_start) s += " " + std::to_string(x);
  }
  return s;
}

void check_case(const Case& c, DType dt, Storage storage, uint32_t& seed) {
  const std::string what = describe(c, dt, storage);
  Tensor q = random_cpu({c.B, c.S, c.Hq, c.D}, dt, seed++, -2.0f, 2.0f);
  Tensor k = random_cpu({c.B, c.T, c.Hkv, c.D}, dt, seed++, -2.0f, 2.0f);
  Tensor v = random_cpu({c.B, c.T, c.Hkv, c.D}, dt, seed++);
  ops::AttentionOptions opt, gopt;
  opt.causal = gopt.causal = c.causal;
  opt.scale = gopt.scale = c.scale;
  Tensor ks, gks;
  TensorView ksv, gksv;
  if (!c.key_start.empty()) {
    ks = Tensor::from_ints(c.key_start, {c.B}, c.key_start_dtype);
    gks = to_gpu(ks);
    ksv = ks.view();
    gksv = gks.view();
    opt.key_start = &ksv;
    gopt.key_start = &gksv;
  }
  Tensor ref = Tensor::empty({c.B, c.S, c.Hq, c.D}, dt);
  ops::attention(q, k, v, ref, opt);

  Tensor gq = place(q, storage, 1), gk = place(k, storage, 2), gv = place(v, storage, 0);
  Tensor out = storage == Storage::HeadsMajor
                   ? heads_major(Tensor::empty({c.B, c.S, c.Hq, c.D}, dt))
                   : to_gpu(Tensor::empty({c.B, c.S, c.Hq, c.D}, dt));
  ops::fill(out, NAN);  // an element the kernels never write fails the comparison
  ops::attention(gq, gk, gv, out, gopt);
  EXPECT_TRUE(close(out, ref, atol_attn(dt), rtol_attn(dt))) << what;
}

TEST(GpuAttentionFast, Prefill) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 100;
  for (DType dt : float_dtypes())
    for (int64_t D : {64, 128}) check_case({2, 300, 300, 8, 2, D}, dt, Storage::Contiguous, seed);
  for (DType dt : float_dtypes()) check_case({1, 70, 70, 4, 4, 256}, dt, Storage::Contiguous, seed);
}

// Causal prefill runs in row blocks of ≥ 128 queries, each multiplying only the keys it can see:
// 4 blocks with left padding, blocks with S < T, and more queries than keys (the first block sees
// no key at all).
TEST(GpuAttentionFast, CausalRowBlocks) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 150;
  for (DType dt : float_dtypes()) {
    Case padded{2, 520, 520, 4, 2, 64};
    padded.key_start = {0, 200};
    check_case(padded, dt, Storage::Contiguous, seed);
    check_case({2, 260, 400, 4, 2, 128}, dt, Storage::FusedQkv, seed);
    check_case({1, 300, 100, 4, 2, 64}, dt, Storage::HeadsMajor, seed);
  }
}

TEST(GpuAttentionFast, FewerQueriesThanKeys) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 200;
  for (DType dt : float_dtypes()) {
    check_case({2, 5, 77, 8, 2, 64}, dt, Storage::Contiguous, seed);
    check_case({2, 5, 77, 8, 2, 128}, dt, Storage::HeadsMajor, seed);
    check_case({3, 17, 200, 4, 1, 128}, dt, Storage::FusedQkv, seed);
  }
}

TEST(GpuAttentionFast, Decode) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 300;
  for (DType dt : float_dtypes())
    for (int64_t T : {1, 2, 31, 32, 33, 100, 255, 300}) {
      check_case({1, 1, T, 16, 8, 128}, dt, Storage::Contiguous, seed);
      check_case({2, 1, T, 8, 2, 64}, dt, Storage::FusedQkv, seed);
    }
  for (DType dt : float_dtypes()) {
    check_case({2, 3, 40, 8, 2, 128}, dt, Storage::HeadsMajor, seed);
    check_case({1, 4, 4, 2, 1, 256}, dt, Storage::Contiguous, seed);
    check_case({1, 2, 9000, 2, 1, 64}, dt, Storage::Contiguous, seed);   // too long: GEMM path
    check_case({1, 1, 7680, 2, 1, 256}, dt, Storage::Contiguous, seed);  // longest decode
    // Grids large enough to skip the cluster split: the one-block-per-row kernel.
    check_case({4, 3, 100, 32, 8, 128}, dt, Storage::FusedQkv, seed);
    check_case({9, 1, 1000, 32, 8, 64}, dt, Storage::Contiguous, seed);
  }
}

TEST(GpuAttentionFast, KeyStartAndFullyMaskedRows) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 400;
  for (DType dt : float_dtypes())
    for (DType ks_dt : {DType::I32, DType::I64}) {
      // S = T: batch 1 left-padded by 13 keys (its first 13 queries see nothing), batch 2 fully
      // padded (every row masked).
      Case prefill{3, 40, 40, 8, 2, 64};
      prefill.key_start = {0, 13, 40};
      prefill.key_start_dtype = ks_dt;
      check_case(prefill, dt, Storage::Contiguous, seed);
      Case decode{3, 1, 50, 8, 2, 128};
      decode.key_start = {0, 49, 50};
      decode.key_start_dtype = ks_dt;
      check_case(decode, dt, Storage::Contiguous, seed);
      Case cache{3, 5, 77, 4, 2, 128};
      cache.key_start = {7, 0, 77};
      cache.key_start_dtype = ks_dt;
      check_case(cache, dt, Storage::FusedQkv, seed);
    }
}

TEST(GpuAttentionFast, NonCausalWithScale) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 500;
  for (DType dt : float_dtypes()) {
    Case c{2, 33, 65, 4, 2, 64};
    c.causal = false;
    c.scale = 0.3f;
    check_case(c, dt, Storage::HeadsMajor, seed);
    Case d{2, 1, 65, 4, 2, 64};
    d.causal = false;
    d.scale = 0.3f;
    check_case(d, dt, Storage::Contiguous, seed);
  }
}

TEST(GpuAttentionFast, HeadDimsTheGemmPathRejects) {
  HK_REQUIRE_CUDA();
  uint32_t seed = 600;
  for (DType dt : float_dtypes()) {
    check_case({2, 19, 19, 4, 2, 20}, dt, Storage::Contiguous, seed);  // 40-byte bf16 rows
    check_case({2, 1, 19, 4, 2, 20}, dt, Storage::Contiguous, seed);   // decode takes any D
  }
}

}  // namespace
}  // namespace hk
