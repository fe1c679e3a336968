// The flash kernels called directly (flash.h, no libhk) against the double reference of
// tests/unit/ops/test_attention_reference.h, with every Hopper forward layout forced in turn (v1:
// producer warpgroup; v2: two warpgroups; v3: v2 with two query tiles a block; HK_FLASH_SM90_FWD,
// decode form off so even 1- and 7-row calls reach them; out and lse checked, the kernel name
// asserted) and then the dispatcher's forward, and every backward kernel forced in turn: the
// mma.sync backward and the Hopper (wgmma + TMA) backward with dq by bulk reduce-add (a warpgroup's
// or a warp's), by a third warpgroup and by atomics, each also deterministic (bitwise repeatable).
// bf16 and f16, head dims 64 and 128, lengths 1, 7, 129, 2049, S≠T both ways, GQA 1/2/3/8 and MQA,
// causal and not, softcap, window, key_start, scale, tensors stored with padding between heads
// (strided views), every output poisoned with NaN first. Head dim 256 and varlen run the mma.sync
// kernel (test_flash_attention).
//
// FlashKernels.Sm90BackwardCanary runs first and alone in scripts/gpu-test --attention: when it
// fails, the script turns the Hopper backward off (HK_FLASH_SM90_BWD=0) for everything after it.
// FlashKernels.Sm90ForwardV2Canary checks the two-warpgroup forwards (v2, v3) alone on a few
// shapes.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_attention/flash_kernel_harness.h"
#include "unit/ops/test_attention_reference.h"

namespace {

using namespace flash_harness;
using hk::test::attention_close;
using hk::test::AttnProblem;
using hk::test::AttnRef;
using hk::test::AttnTolerance;

bool have_hopper() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  return major == 9;
}
#define REQUIRE_HOPPER()                                                             \
  do {                                                                               \
    if (!have_hopper()) {                                                            \
      if (std::getenv("HK_REQUIRE_GPU")) FAIL() << "no Hopper GPU (HK_REQUIRE_GPU)"; \
      GTEST_SKIP() << "needs a Hopper GPU";                                          \
    }                                                                                \
  } while (0)

AttnTolerance tolerance(hk_flash::Dtype dt, bool gradient) {
  return hk::test::attention_tolerance(
      dt == hk_flash::Dtype::BF16 ? hk::DType::BF16 : hk::DType::F16, gradient);
}

using attention_cases::Case;

Problem problem_of(const Case& c, int d, hk_flash::Dtype dt, int pad) {
  Problem p{int(c.b), int(c.s), int(c.t), int(c.hq), int(c.hkv), d};
  p.causal = c.causal;
  p.softcap = static_cast<float>(c.softcap);
  p.window = static_cast<int>(c.window);
  p.scale = c.scale;
  p.dt = dt;
  p.pad = pad;
  if (c.key_start)
    for (int64_t b = 0; b < c.b; ++b)
      p.key_start.push_back(static_cast<int32_t>(attention_cases::key_start_of(c, b)));
  return p;
}
AttnProblem reference_problem(const Problem& p) {
  AttnProblem r;
  r.S.assign(p.b, p.s);
  r.T.assign(p.b, p.t);
  r.hq = p.hq;
  r.hkv = p.hkv;
  r.d = p.d;
  r.causal = p.causal;
  r.softcap = p.softcap;
  r.window = p.window;
  r.scale = p.scale;
  for (int32_t k : p.key_start) r.key_start.push_back(k);
  return r;
}

// The forward kernels a case runs on: each Hopper layout forced (HK_FLASH_SM90_FWD, and
// HK_FLASH_DECODE=0 so that decode-shaped calls reach it too), then the dispatcher's choice (under
// whatever the environment sets).
enum class Fwd { Sm90V1, Sm90V2, Sm90V3, Sm90V4, Sm90V5, Dispatch };
const char* fwd_name(Fwd f) {
  return f == Fwd::Sm90V1   ? "sm90 wgmma"
         : f == Fwd::Sm90V2 ? "sm90 wgmma v2"
         : f == Fwd::Sm90V3 ? "sm90 wgmma v3"
         : f == Fwd::Sm90V4 ? "sm90 wgmma v4"
         : f == Fwd::Sm90V5 ? "sm90 wgmma v5"
                            : "dispatch";
}
struct FwdScope {
  explicit FwdScope(Fwd f)
      : layout("HK_FLASH_SM90_FWD", f == Fwd::Sm90V1   ? "v1"
                                    : f == Fwd::Sm90V2 ? "v2"
                                    : f == Fwd::Sm90V3 ? "v3"
                                    : f == Fwd::Sm90V4 ? "v4"
                                    : f == Fwd::Sm90V5 ? "v5"
                                                       : nullptr),
        decode("HK_FLASH_DECODE", f == Fwd::Dispatch ? nullptr : "0") {}
  EnvScope layout, decode;
};
const std::vector<Fwd> kAllForward = {Fwd::Sm90V1, Fwd::Sm90V2, Fwd::Sm90V3,
                                      Fwd::Sm90V4, Fwd::Sm90V5, Fwd::Dispatch};
// the layouts other than v1 (the canary's), and those streaming query tiles
const std::vector<Fwd> kCanaryForwards = {Fwd::Sm90V2, Fwd::Sm90V3, Fwd::Sm90V4, Fwd::Sm90V5};
const std::vector<Fwd> kStreamingForwards = {Fwd::Sm90V4, Fwd::Sm90V5};

// Each forward kernel (out and lse against the reference), then each backward variant against
// the reference, from the dispatcher's forward (the last one run).
void run(const Case& c, int d, hk_flash::Dtype dt, const std::vector<Bwd>& kernels, int pad = 0,
         uint32_t seed = 1, const std::vector<Fwd>& forwards = kAllForward) {
  const Problem p = problem_of(c, d, dt, pad);
  SCOPED_TRACE(c.name + " D" + std::to_string(d) +
               (dt == hk_flash::Dtype::BF16 ? " bf16" : " f16") + (pad ? " strided" : ""));
  const size_t nq = static_cast<size_t>(p.b) * p.s * p.hq * d;
  const size_t nk = static_cast<size_t>(p.b) * p.t * p.hkv * d;
  const RandomValues q = random_values(nq, dt, seed), k = random_values(nk, dt, seed + 1),
                     v = random_values(nk, dt, seed + 2), dout = random_values(nq, dt, seed + 3);
  const AttnRef ref = hk::test::attention_reference(reference_problem(p), q.values, k.values,
                                                    v.values, dout.values);
  Buffers bf(p);
  bf.q.upload(q.bits);
  bf.k.upload(k.bits);
  bf.v.upload(v.bits);
  bf.dout.upload(dout.bits);
  const std::vector<double> ref_lse = hk::test::batch_lse(reference_problem(p), ref.lse);
  for (Fwd f : forwards) {
    SCOPED_TRACE(std::string("forward ") + fwd_name(f));
    FwdScope scope(f);
    const hk_flash::Params fp = forward_params(p, bf);
    if (f != Fwd::Dispatch) ASSERT_EQ(hk_flash::forward_kernel_name(fp), fwd_name(f));
    bf.out.poison();
    bf.lse.fill_nan();
    hk_flash::forward(fp, nullptr);
    check(cudaDeviceSynchronize(), "forward");
    EXPECT_TRUE(attention_close(bf.out.download(), ref.out, tolerance(dt, false), "out"));
    EXPECT_TRUE(attention_close(bf.lse.download(), ref_lse, {2e-6, 2e-5}, "lse"));
  }
  const auto gt = tolerance(dt, true);
  for (Bwd kernel : kernels)
    for (bool deterministic : {false, true}) {
      // deterministic mode takes dq out of the Hopper kernel, so the forms that differ only in how
      // dq leaves it would run Sm90Tma's deterministic kernel again
      if (deterministic && (kernel == Bwd::Sm90TmaWarp || kernel == Bwd::Sm90DqWarpgroup)) continue;
      SCOPED_TRACE(std::string(bwd_name(kernel)) + (deterministic ? " deterministic" : ""));
      BwdScope scope(kernel);
      std::vector<double> first[3];
      for (int rep = 0; rep < (deterministic ? 2 : 1); ++rep) {
        bf.dq.poison();
        bf.dk.poison();
        bf.dv.poison();
        hk_flash::backward(backward_params(p, bf, deterministic), nullptr);
        check(cudaDeviceSynchronize(), "backward");
        const std::vector<double> got[3] = {bf.dq.download(), bf.dk.download(), bf.dv.download()};
        if (rep == 0) {
          EXPECT_TRUE(attention_close(got[0], ref.dq, gt, "dq"));
          EXPECT_TRUE(attention_close(got[1], ref.dk, gt, "dk"));
          EXPECT_TRUE(attention_close(got[2], ref.dv, gt, "dv"));
          for (int i = 0; i < 3; ++i) first[i] = got[i];
        } else {
          for (int i = 0; i < 3; ++i) EXPECT_EQ(got[i], first[i]) << "repeat of tensor " << i;
        }
      }
    }
}

// The shared feature cases, and GQA 8 over several query blocks, a long non-causal S < T, and
// scores large enough (scale 3) that a row's running max rises by more than 2^8 over many key
// tiles, so the Hopper forward's lazy rescale (kRescaleLog2) moves its reference mid-row.
const std::vector<Case>& cases() {
  static const std::vector<Case> all = [] {
    std::vector<Case> c = attention_cases::feature_cases();
    c.push_back({"gqa8_m_blocks", 1, 384, 384, 16, 2});
    c.push_back({"long_noncausal_s_lt_t", 1, 130, 1030, 2, 2, false});
    c.push_back({"large_scores", 1, 700, 1100, 2, 1, false, 0, -1, false, 3.0f});
    return c;
  }();
  return all;
}

const std::vector<Bwd> kAllBackward = {Bwd::Sm80, Bwd::Sm90Tma, Bwd::Sm90TmaWarp,
                                       Bwd::Sm90DqWarpgroup, Bwd::Sm90Atomic};
const std::vector<Bwd> kSm90Backward = {Bwd::Sm90Tma, Bwd::Sm90TmaWarp, Bwd::Sm90DqWarpgroup,
                                        Bwd::Sm90Atomic};
const std::vector<Bwd> kSm90BackwardBothPasses = {
    Bwd::Sm90Tma, Bwd::Sm90TmaWarp, Bwd::Sm90DqWarpgroup, Bwd::Sm90TmaRowPasses, Bwd::Sm90Atomic};

// First, alone, under a short timeout (scripts/gpu-test): a few Hopper backwards, with the dq
// passes a tile a block (aligned tensors' default) and a row a warp; and the block order's kv-head
// sections: 6 kv heads (batch 2 × 3) in 4 + 2 and one a section (the cases above fit all their
// heads in one).
TEST(FlashKernels, Sm90BackwardCanary) {
  REQUIRE_HOPPER();
  for (int d : {64, 128}) {
    run({"canary", 1, 256, 256, 2, 1}, d, hk_flash::Dtype::BF16, kSm90BackwardBothPasses);
    run({"canary_noncausal", 2, 130, 300, 4, 2, false}, d, hk_flash::Dtype::F16,
        kSm90BackwardBothPasses);
    run({"canary_everything", 2, 129, 257, 4, 2, true, 10.0f, 50, true, 0.1f}, d,
        hk_flash::Dtype::BF16, kSm90BackwardBothPasses);
    for (const char* heads : {"4", "1"}) {
      EnvScope sections("HK_FLASH_BWD_SECTION", heads);
      run({std::string("canary_bwd_sections_") + heads, 2, 600, 600, 6, 3}, d,
          hk_flash::Dtype::BF16, kSm90Backward, 0, 1, {Fwd::Dispatch});
    }
  }
  // a dq form that is none of tma / warp / wg / atomic fails the call instead of timing the default
  const Problem p = problem_of({"typo", 1, 256, 256, 2, 1}, 128, hk_flash::Dtype::BF16, 0);
  Buffers bf(p);
  EnvScope typo("HK_FLASH_BWD_DQ", "warpgroup");
  EXPECT_THROW(hk_flash::backward(backward_params(p, bf, false), nullptr), std::invalid_argument);
}

// The Hopper forwards after v1 alone (v2, v3 with two query tiles a block, v4 streaming them, a
// block an SM, v5 streaming them with a producer warpgroup; no backward): odd lengths, S≠T, GQA,
// every mask and softcap, long enough to wrap the stage ring several times, odd and even m-block
// counts (v3's lone middle tile), the block order's head sections, v4 and v5 on 3 blocks and on
// one (many query tiles a block: the Q ring wraps, tiles with no visible key among them) with
// their jobs in pairs of m-blocks (the middle one's empty partner) and in the snake; O stored
// from registers as well as by TMA; and bad HK_FLASH_SM90_FWD and HK_FLASH_FWD_STREAM_ORDER
// values refused with a message.
TEST(FlashKernels, Sm90ForwardV2Canary) {
  REQUIRE_HOPPER();
  for (int d : {64, 128}) {
    run({"canary", 1, 256, 256, 2, 1}, d, hk_flash::Dtype::BF16, {}, 0, 1, kCanaryForwards);
    run({"canary_5_mblocks", 1, 600, 600, 2, 1}, d, hk_flash::Dtype::BF16, {}, 0, 1,
        kCanaryForwards);
    run({"canary_odd7", 2, 7, 7, 4, 2}, d, hk_flash::Dtype::F16, {}, 0, 1, kCanaryForwards);
    run({"canary_noncausal", 2, 130, 1030, 4, 2, false}, d, hk_flash::Dtype::F16, {}, 0, 1,
        kCanaryForwards);
    run({"canary_everything", 2, 129, 257, 4, 2, true, 10.0f, 50, true, 0.1f}, d,
        hk_flash::Dtype::BF16, {}, 0, 1, kCanaryForwards);
    run({"canary_large_scores", 1, 1100, 1100, 2, 1, true, 0, -1, false, 3.0f}, d,
        hk_flash::Dtype::BF16, {}, 0, 1, kCanaryForwards);
    // the block order's head sections, a short last one included: 8 heads in 3 + 3 + 2, and one
    // head a section (the cases above fit all their heads in one)
    for (const char* heads : {"3", "1"}) {
      EnvScope sections("HK_FLASH_FWD_SECTION", heads);
      run({std::string("canary_sections_") + heads, 2, 600, 600, 4, 2}, d, hk_flash::Dtype::BF16,
          {}, 0, 1, kAllForward);
    }
    // O stored from registers (HK_FLASH_FWD_O=direct, the path of outs TMA cannot write) beside
    // the default TMA stores the cases above ran
    {
      EnvScope direct("HK_FLASH_FWD_O", "direct");
      run({"canary_odd7_o_direct", 2, 7, 7, 4, 2}, d, hk_flash::Dtype::F16, {}, 0, 1, kAllForward);
      run({"canary_everything_o_direct", 2, 129, 257, 4, 2, true, 10.0f, 50, true, 0.1f}, d,
          hk_flash::Dtype::BF16, {}, 0, 1, kAllForward);
    }
    // batch 4's key_start (151) hides every key from its first query tile
    for (const char* order : {"pairs", "snake"})
      for (const char* blocks : {"3", "1"}) {
        EnvScope grid("HK_FLASH_FWD_V4_BLOCKS", blocks), jobs("HK_FLASH_FWD_STREAM_ORDER", order);
        const std::string tag = std::string("_stream_blocks_") + blocks + "_" + order;
        run({"canary_5_mblocks" + tag, 2, 600, 600, 4, 2}, d, hk_flash::Dtype::BF16, {}, 0, 1,
            kStreamingForwards);
        run({"canary_odd7" + tag, 2, 7, 7, 4, 2}, d, hk_flash::Dtype::F16, {}, 0, 1,
            kStreamingForwards);
        run({"canary_everything" + tag, 2, 129, 257, 4, 2, true, 10.0f, 50, true, 0.1f}, d,
            hk_flash::Dtype::BF16, {}, 0, 1, kStreamingForwards);
        run({"canary_noncausal" + tag, 2, 300, 1030, 4, 2, false}, d, hk_flash::Dtype::F16, {}, 0,
            1, kStreamingForwards);
        run({"canary_key_start_tiles" + tag, 5, 520, 520, 2, 1, true, 0, -1, true}, d,
            hk_flash::Dtype::BF16, {}, 0, 1, kStreamingForwards);
      }
  }
  const Problem p = problem_of({"typo", 1, 256, 256, 2, 1}, 128, hk_flash::Dtype::BF16, 0);
  Buffers bf(p);
  {
    EnvScope typo("HK_FLASH_SM90_FWD", "v9");
    EXPECT_THROW(hk_flash::forward(forward_params(p, bf), nullptr), std::invalid_argument);
  }
  EnvScope v5("HK_FLASH_SM90_FWD", "v5"), typo("HK_FLASH_FWD_STREAM_ORDER", "zigzag");
  EXPECT_THROW(hk_flash::forward(forward_params(p, bf), nullptr), std::invalid_argument);
}

// The split-KV decode goes through the caller's workspace when it has one large enough (every SM
// busy, a combine kernel), else through a cluster; HK_FLASH_DECODE_CLUSTER=1 keeps the cluster;
// prefill shapes ask for no workspace. Then both forms against the reference and each other.
TEST(FlashKernels, DecodeSplitFollowsTheWorkspace) {
  REQUIRE_HOPPER();
  const Problem p = problem_of({"b1_t32768", 1, 1, 32768, 16, 8}, 128, hk_flash::Dtype::BF16, 0);
  Buffers bf(p);
  hk_flash::Params fp = forward_params(p, bf);
  const size_t need = hk_flash::forward_workspace_size(fp);
  ASSERT_GT(need, 0u);
  auto named = [&](const char* form, bool with_workspace = false) {
    const std::string name = hk_flash::forward_kernel_name(fp, with_workspace);
    return name.find(form) != std::string::npos ? ::testing::AssertionSuccess()
                                                : ::testing::AssertionFailure() << name;
  };
  EXPECT_TRUE(named("(cluster)"));
  EXPECT_TRUE(named("(workspace)", true));
  void* ws = nullptr;
  check(cudaMalloc(&ws, need), "cudaMalloc(workspace)");
  fp.workspace = ws;
  fp.workspace_bytes = need - 1;
  EXPECT_TRUE(named("(cluster)"));
  fp.workspace_bytes = need;
  EXPECT_TRUE(named("(workspace)"));
  {
    EnvScope cluster("HK_FLASH_DECODE_CLUSTER", "1");
    EXPECT_TRUE(named("(cluster)"));
    EXPECT_EQ(hk_flash::forward_workspace_size(fp), 0u);
  }
  const Problem prefill = problem_of({"prefill", 2, 256, 256, 4, 2}, 128, hk_flash::Dtype::BF16, 0);
  Buffers pb(prefill);
  EXPECT_EQ(hk_flash::forward_workspace_size(forward_params(prefill, pb)), 0u);

  const size_t nq = static_cast<size_t>(p.s) * p.hq * p.d,
               nk = static_cast<size_t>(p.t) * p.hkv * p.d;
  const RandomValues q = random_values(nq, p.dt, 3), k = random_values(nk, p.dt, 4),
                     v = random_values(nk, p.dt, 5);
  const AttnRef ref =
      hk::test::attention_reference(reference_problem(p), q.values, k.values, v.values, {});
  bf.q.upload(q.bits);
  bf.k.upload(k.bits);
  bf.v.upload(v.bits);
  for (int form = 0; form < 2; ++form) {  // 0: workspace, 1: cluster
    SCOPED_TRACE(form == 0 ? "workspace" : "cluster");
    bf.out.poison();
    bf.lse.fill_nan();
    hk_flash::Params call = fp;
    if (form == 1) call.workspace = nullptr;
    hk_flash::forward(call, nullptr);
    check(cudaDeviceSynchronize(), "forward");
    EXPECT_TRUE(attention_close(bf.out.download(), ref.out, tolerance(p.dt, false), "out"));
    EXPECT_TRUE(attention_close(bf.lse.download(),
                                hk::test::batch_lse(reference_problem(p), ref.lse), {2e-6, 2e-5},
                                "lse"));
  }
  cudaFree(ws);
}

// One test per (dtype, head dim), so scripts/gpu-test can run them side by side.
void every_feature(int d, hk_flash::Dtype dt) {
  for (const Case& c : cases()) run(c, d, dt, kAllBackward);
}
TEST(FlashKernels, EveryFeatureBf16D64) {
  REQUIRE_HOPPER();
  every_feature(64, hk_flash::Dtype::BF16);
}
TEST(FlashKernels, EveryFeatureBf16D128) {
  REQUIRE_HOPPER();
  every_feature(128, hk_flash::Dtype::BF16);
}
TEST(FlashKernels, EveryFeatureF16D64) {
  REQUIRE_HOPPER();
  every_feature(64, hk_flash::Dtype::F16);
}
TEST(FlashKernels, EveryFeatureF16D128) {
  REQUIRE_HOPPER();
  every_feature(128, hk_flash::Dtype::F16);
}

TEST(FlashKernels, Long) {
  REQUIRE_HOPPER();
  run({"s2049", 1, 2049, 2049, 2, 1}, 128, hk_flash::Dtype::BF16, kSm90Backward);
  run({"s2049_noncausal_gqa", 1, 2049, 1000, 4, 2, false}, 64, hk_flash::Dtype::F16, kSm90Backward);
}

TEST(FlashKernels, Strided) {
  REQUIRE_HOPPER();
  for (int d : {64, 128}) {
    run({"odd7_gqa2", 2, 7, 7, 4, 2}, d, hk_flash::Dtype::BF16, kSm90BackwardBothPasses,
        /*pad=*/5);
    run({"everything", 2, 129, 257, 4, 2, true, 10.0f, 50, true, 0.1f}, d, hk_flash::Dtype::F16,
        kSm90BackwardBothPasses, /*pad=*/3);
  }
}

}  // namespace
