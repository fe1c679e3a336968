// The flash kernels of kernels/flash-attn on the GPU, against the double reference of
// tests/unit/ops/test_attention_reference.h, through both ways in: libhk's fused attention
// (hk::ops::fused_attention, the CUDA "sdpa") and the hub repos' C ABI entries
// (kernels-community/flash-attn2/3 from the embedded hub).
//   - forward + lse + backward (dq, dk, dv) in bf16 and f16 at head dims 64/128/256; lengths 1, 7,
//     129, 2049; S < T and S > T (rows that see nothing); GQA ratios 1, 2, 3, MQA; causal and
//     not; softcap; left window; key_start; custom scale; q/k/v/out as heads-major views and as
//     slices of a fused qkv buffer; every output poisoned with NaN first;
//   - each forward kernel forced in turn (Hopper wgmma, mma.sync prefill, split-KV decode), the
//     backward in its default (atomic dq) and deterministic modes, the latter bitwise repeatable;
//   - decode: batch 1 and small batches over caches up to 32768 keys (cluster split-KV);
//   - varlen: packed sequences (one of length 0) against the reference and per-sequence calls;
//   - flash_attn_with_kvcache: new keys written in place at cache_seqlens, left-padded rows;
//   - CUDA-graph capture of forward + backward through the ABI with a caller workspace: no
//     device allocation during capture, replays equal to direct calls;
//   - f32 and head dim 96 are refused with Unsupported (the "sdpa" function then runs eager).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "common/cuda_graph_testing.h"
#include "gpu/gpu_testing.h"
#include "gpu_attention/attention_cases.h"
#include "hk/allocator.h"
#include "hk/attention_functions.h"
#include "hk/error.h"
#include "hk/hub.h"
#include "hk/kernel_loader.h"
#include "hk/layer_interfaces.h"
#include "hk/ops.h"
#include "unit/ops/test_attention_reference.h"

namespace hk {
namespace {

using namespace gpu_testing;
using test::attention_close;
using test::attention_reference;
using test::attention_tolerance;
using test::AttnProblem;
using test::AttnRef;
using test::batch_lse;

std::vector<double> host_values(const Tensor& t) {
  return to_cpu(t).to_doubles();
}

// Which forward kernel runs: the dispatcher's choice, or one forced through the environment.
// Cluster: the split-KV decode combines its splits inside a thread-block cluster instead of
// through the workspace fused_attention gives it (the form of callers without a workspace).
enum class Path { Auto, Sm80, NoDecode, Cluster };
using attention_cases::EnvScope;
struct PathScope {
  explicit PathScope(Path p)
      : sm90("HK_FLASH_SM90", p == Path::Sm80 ? "0" : nullptr),
        decode("HK_FLASH_DECODE", p == Path::NoDecode ? "0" : nullptr),
        cluster("HK_FLASH_DECODE_CLUSTER", p == Path::Cluster ? "1" : nullptr) {}
  EnvScope sm90, decode, cluster;
};
const char* path_name(Path p) {
  return p == Path::Auto      ? "auto"
         : p == Path::Sm80    ? "sm80"
         : p == Path::Cluster ? "cluster"
                              : "no-decode";
}

enum class Storage { Contiguous, HeadsMajor, FusedQkv };

// A GPU copy of the [B, S, H, D] cpu tensor in the given storage; poison fills the rest.
Tensor place(const Tensor& x, Storage storage, int64_t offset = 0) {
  const Shape s = x.sizes();
  if (storage == Storage::Contiguous) return to_gpu(x);
  if (storage == Storage::HeadsMajor) {
    Tensor buf = Tensor::empty({s[0], s[2], s[1], s[3]}, x.dtype(), gpu());
    Tensor v = buf.permute({0, 2, 1, 3});
    v.copy_from(x.view());
    return v;
  }
  Tensor buf = Tensor::empty({s[0], s[1], s[2] + 5, s[3]}, x.dtype(), gpu());
  ops::fill(buf, 0.0);
  Tensor v = buf.slice(2, offset, offset + s[2]);
  v.copy_from(x.view());
  return v;
}
Tensor poisoned(const Shape& shape, DType dt, Storage storage = Storage::Contiguous) {
  Tensor t = place(Tensor::zeros(shape, dt), storage, 1);
  ops::fill(t, std::nan(""));
  return t;
}

using attention_cases::Case;

AttnProblem problem_of(const Case& c, int64_t d) {
  AttnProblem p;
  p.S.assign(c.b, c.s);
  p.T.assign(c.b, c.t);
  p.hq = c.hq;
  p.hkv = c.hkv;
  p.d = d;
  p.causal = c.causal;
  p.softcap = c.softcap;
  p.window = c.window;
  p.scale = c.scale;
  if (c.key_start)
    for (int64_t b = 0; b < c.b; ++b) p.key_start.push_back(attention_cases::key_start_of(c, b));
  return p;
}

struct Inputs {
  Tensor q, k, v, dout;  // cpu
  AttnRef ref;
};
Inputs make_inputs(const Case& c, int64_t d, DType dt, bool backward, uint32_t seed = 1) {
  Inputs in;
  in.q = random_cpu({c.b, c.s, c.hq, d}, dt, seed);
  in.k = random_cpu({c.b, c.t, c.hkv, d}, dt, seed + 1);
  in.v = random_cpu({c.b, c.t, c.hkv, d}, dt, seed + 2);
  in.dout = random_cpu({c.b, c.s, c.hq, d}, dt, seed + 3);
  in.ref =
      attention_reference(problem_of(c, d), in.q.to_doubles(), in.k.to_doubles(), in.v.to_doubles(),
                          backward ? in.dout.to_doubles() : std::vector<double>{});
  return in;
}

ops::FusedAttentionOptions options_of(const Case& c, const Tensor* key_start) {
  ops::FusedAttentionOptions o;
  o.causal = c.causal;
  o.softcap = static_cast<float>(c.softcap);
  o.window_left = c.window;
  o.scale = c.scale;
  o.key_start = key_start ? &key_start->view() : nullptr;
  return o;
}

void run(const Case& c, int64_t d, DType dt, Path path, Storage storage, bool backward,
         bool deterministic = false) {
  SCOPED_TRACE(c.name + " D" + std::to_string(d) + " " + dtype_name(dt) + " " + path_name(path) +
               (storage == Storage::Contiguous   ? ""
                : storage == Storage::HeadsMajor ? " BHSD"
                                                 : " fused") +
               (deterministic ? " deterministic" : ""));
  PathScope scope(path);
  const Inputs in = make_inputs(c, d, dt, backward);
  const AttnProblem p = problem_of(c, d);
  Tensor ks;
  if (c.key_start) ks = to_gpu(Tensor::from_ints(p.key_start, {c.b}, DType::I32));
  ops::FusedAttentionOptions o = options_of(c, c.key_start ? &ks : nullptr);
  o.deterministic = deterministic;
  Tensor q = place(in.q, storage, 0), k = place(in.k, storage, 2), v = place(in.v, storage, 4);
  Tensor out = poisoned(in.q.sizes(), dt, storage);
  Tensor lse = poisoned({c.b, c.hq, c.s}, DType::F32);
  ops::fused_attention(q, k, v, out, o, &lse.view());
  EXPECT_TRUE(attention_close(host_values(out), in.ref.out, attention_tolerance(dt), "out"));
  EXPECT_TRUE(attention_close(host_values(lse), batch_lse(p, in.ref.lse), {2e-6, 2e-5}, "lse"));
  if (!backward) return;
  Tensor dout = place(in.dout, storage, 1);
  Tensor dq = poisoned(in.q.sizes(), dt, storage), dk = poisoned(in.k.sizes(), dt, storage),
         dv = poisoned(in.v.sizes(), dt, storage);
  ops::fused_attention_backward(dout, q, k, v, out, lse, dq, dk, dv, o);
  const auto gt = attention_tolerance(dt, true);
  EXPECT_TRUE(attention_close(host_values(dq), in.ref.dq, gt, "dq"));
  EXPECT_TRUE(attention_close(host_values(dk), in.ref.dk, gt, "dk"));
  EXPECT_TRUE(attention_close(host_values(dv), in.ref.dv, gt, "dv"));
  if (deterministic) {  // a second run gives the same bits
    Tensor dq2 = poisoned(in.q.sizes(), dt, storage), dk2 = poisoned(in.k.sizes(), dt, storage),
           dv2 = poisoned(in.v.sizes(), dt, storage);
    ops::fused_attention_backward(dout, q, k, v, out, lse, dq2, dk2, dv2, o);
    EXPECT_EQ(host_values(dq2), host_values(dq));
    EXPECT_EQ(host_values(dk2), host_values(dk));
    EXPECT_EQ(host_values(dv2), host_values(dv));
  }
}

const std::vector<Case>& cases() {
  return attention_cases::feature_cases();
}

// First, alone and under a short timeout (scripts/gpu-test): Hopper-kernel forwards. When it
// fails the script turns that kernel off (HK_FLASH_SM90=0) for everything after it.
TEST(FlashAttention, Sm90Canary) {
  HK_REQUIRE_REAL_CUDA();
  for (int64_t d : {64, 128}) {
    run({"canary", 1, 256, 256, 2, 1}, d, DType::BF16, Path::Auto, Storage::Contiguous, false);
    run({"canary_noncausal", 2, 130, 300, 4, 2, false}, d, DType::F16, Path::Auto,
        Storage::Contiguous, false);
    run({"canary_window", 1, 400, 700, 2, 2, true, 0, 150, true}, d, DType::BF16, Path::Auto,
        Storage::Contiguous, false);
  }
}

TEST(FlashAttention, ForwardAndBackwardEveryFeature) {
  HK_REQUIRE_REAL_CUDA();
  for (int64_t d : {64, 128, 256})
    for (DType dt : {DType::BF16, DType::F16})
      for (const Case& c : cases()) run(c, d, dt, Path::Auto, Storage::Contiguous, true);
}

TEST(FlashAttention, EveryForwardKernelAndBackwardMode) {
  HK_REQUIRE_REAL_CUDA();
  const std::vector<Case> prefill = {{"m_blocks3", 2, 384, 384, 4, 2},
                                     {"long_causal", 1, 1000, 1000, 2, 1},
                                     {"noncausal_s_lt_t", 1, 130, 1030, 2, 2, false},
                                     {"everything", 2, 129, 257, 4, 2, true, 10.0, 50, true, 0.1f}};
  for (int64_t d : {64, 128})
    for (const Case& c : prefill) {
      run(c, d, DType::BF16, Path::Sm80, Storage::Contiguous, true, /*deterministic=*/true);
      run(c, d, DType::F16, Path::Auto, Storage::Contiguous, false);
    }
  run({"s2049", 1, 2049, 2049, 2, 1}, 64, DType::BF16, Path::Auto, Storage::Contiguous, true);
  run({"s2049", 1, 2049, 2049, 2, 1}, 128, DType::BF16, Path::Sm80, Storage::Contiguous, true,
      true);
  for (const Case& c : cases())
    run(c, 128, DType::BF16, Path::Auto, Storage::Contiguous, true, true);
  // decode shapes on the prefill kernel too
  run({"decode_on_prefill", 2, 1, 700, 8, 2}, 128, DType::BF16, Path::NoDecode, Storage::Contiguous,
      false);
}

TEST(FlashAttention, StridedViews) {
  HK_REQUIRE_REAL_CUDA();
  for (Storage st : {Storage::HeadsMajor, Storage::FusedQkv})
    for (int64_t d : {64, 128}) {
      run({"odd7_gqa2", 2, 7, 7, 4, 2}, d, DType::BF16, Path::Auto, st, true);
      run({"everything", 2, 129, 257, 4, 2, true, 10.0, 50, true, 0.1f}, d, DType::F16, Path::Auto,
          st, true);
      run({"decode", 2, 1, 500, 8, 2}, d, DType::BF16, Path::Auto, st, false);
    }
}

TEST(FlashAttention, DecodeSplitKv) {
  HK_REQUIRE_REAL_CUDA();
  const std::vector<Case> decode = {
      {"b1_t1", 1, 1, 1, 16, 8},
      {"b1_t63", 1, 1, 63, 16, 8},
      {"b1_t4096", 1, 1, 4096, 16, 8},
      {"b1_t32768", 1, 1, 32768, 16, 8},
      {"b4_t1000", 4, 1, 1000, 32, 8},
      {"b2_s4_t500", 2, 4, 500, 8, 2},
      {"b1_s3_t333", 1, 3, 333, 12, 4},
      {"mqa", 1, 1, 2000, 8, 1},
      {"window", 1, 1, 3000, 16, 8, true, 0, 256},
      {"softcap_key_start", 3, 2, 777, 8, 4, true, 20.0, -1, true},
  };
  for (int64_t d : {64, 128, 256})
    for (const Case& c : decode) {
      run(c, d, DType::BF16, Path::Auto, Storage::Contiguous, false);
      run(c, d, DType::BF16, Path::Cluster, Storage::Contiguous, false);
    }
  run({"b1_t4096", 1, 1, 4096, 16, 8}, 128, DType::F16, Path::Auto, Storage::Contiguous, false);
  run({"b1_t4096", 1, 1, 4096, 16, 8}, 128, DType::F16, Path::Cluster, Storage::Contiguous, false);
  {  // two blocks an SM: other split counts, same results
    EnvScope waves("HK_FLASH_DECODE_WAVES", "2");
    run({"b1_t32768", 1, 1, 32768, 16, 8}, 128, DType::BF16, Path::Auto, Storage::Contiguous,
        false);
    run({"b4_t1000", 4, 1, 1000, 32, 8}, 128, DType::BF16, Path::Auto, Storage::Contiguous, false);
  }
  // each workspace-path config where the other is the default (eight warps on long splits)
  for (const char* warps : {"4", "8"}) {
    EnvScope forced("HK_FLASH_DECODE_WARPS", warps);
    for (int64_t d : {64, 128})
      for (const Case& c : {decode[2], decode[3], decode[4], decode[7], decode[9]})
        run(c, d, DType::BF16, Path::Auto, Storage::Contiguous, false);
  }
}

// Batch 1 decodes through the workspace fused_attention gives it (splits over every SM, a combine
// kernel; which form runs is checked in hk_gpu_flash_kernels_test) or, when asked, through a
// cluster; either way a repeat gives the same bits (the splits are combined in order).
TEST(FlashAttention, DecodeSplitFormsAndRepeats) {
  HK_REQUIRE_REAL_CUDA();
  const Case c{"b1_t32768", 1, 1, 32768, 16, 8};
  const Inputs in = make_inputs(c, 128, DType::BF16, false);
  Tensor q = to_gpu(in.q), k = to_gpu(in.k), v = to_gpu(in.v);
  const ops::FusedAttentionOptions o = options_of(c, nullptr);
  for (Path path : {Path::Auto, Path::Cluster}) {
    SCOPED_TRACE(path_name(path));
    PathScope scope(path);
    Tensor out1 = poisoned(in.q.sizes(), DType::BF16, Storage::Contiguous);
    Tensor out2 = poisoned(in.q.sizes(), DType::BF16, Storage::Contiguous);
    ops::fused_attention(q, k, v, out1, o);
    ops::fused_attention(q, k, v, out2, o);
    EXPECT_EQ(host_values(out1), host_values(out2));
    EXPECT_TRUE(
        attention_close(host_values(out1), in.ref.out, attention_tolerance(DType::BF16), "out"));
  }
}

TEST(FlashAttention, VarlenMatchesReferenceAndPerSequenceCalls) {
  HK_REQUIRE_REAL_CUDA();
  AttnProblem p;
  p.S = {1, 7, 0, 129, 300};
  p.T = {1, 9, 4, 129, 420};
  p.hq = 4;
  p.hkv = 2;
  for (int64_t d : {64, 128}) {
    p.d = d;
    for (bool backward : {false, true}) {
      const int64_t nq = p.rows_q(), nk = p.rows_k();
      Tensor qc = random_cpu({nq, 4, d}, DType::BF16, 5),
             kc = random_cpu({nk, 2, d}, DType::BF16, 6),
             vc = random_cpu({nk, 2, d}, DType::BF16, 7),
             dc = random_cpu({nq, 4, d}, DType::BF16, 8);
      const AttnRef ref = attention_reference(p, qc.to_doubles(), kc.to_doubles(), vc.to_doubles(),
                                              dc.to_doubles());
      std::vector<int64_t> cq{0}, ck{0};
      for (size_t b = 0; b < p.S.size(); ++b) {
        cq.push_back(cq.back() + p.S[b]);
        ck.push_back(ck.back() + p.T[b]);
      }
      Tensor cu_q = to_gpu(Tensor::from_ints(cq, {6}, DType::I32)),
             cu_k = to_gpu(Tensor::from_ints(ck, {6}, DType::I32));
      ops::FusedAttentionOptions o;
      o.cu_seqlens_q = &cu_q.view();
      o.cu_seqlens_k = &cu_k.view();
      o.max_seqlen_q = 300;
      o.max_seqlen_k = 420;
      Tensor q = to_gpu(qc), k = to_gpu(kc), v = to_gpu(vc);
      Tensor out = poisoned({nq, 4, d}, DType::BF16), lse = poisoned({4, nq}, DType::F32);
      ops::fused_attention(q, k, v, out, o, &lse.view());
      EXPECT_TRUE(
          attention_close(host_values(out), ref.out, attention_tolerance(DType::BF16), "out"));
      EXPECT_TRUE(attention_close(host_values(lse), ref.lse, {2e-6, 2e-5}, "lse"));
      if (backward) {
        Tensor dq = poisoned({nq, 4, d}, DType::BF16), dk = poisoned({nk, 2, d}, DType::BF16),
               dv = poisoned({nk, 2, d}, DType::BF16);
        ops::fused_attention_backward(to_gpu(dc), q, k, v, out, lse, dq, dk, dv, o);
        const auto gt = attention_tolerance(DType::BF16, true);
        EXPECT_TRUE(attention_close(host_values(dq), ref.dq, gt, "dq"));
        EXPECT_TRUE(attention_close(host_values(dk), ref.dk, gt, "dk"));
        EXPECT_TRUE(attention_close(host_values(dv), ref.dv, gt, "dv"));
        continue;
      }
      // per-sequence batch calls agree with the packed rows
      const auto packed = host_values(out);
      for (size_t b = 0; b < p.S.size(); ++b) {
        if (p.S[b] == 0) continue;
        Tensor ob = Tensor::empty({1, p.S[b], 4, d}, DType::BF16, gpu());
        ops::fused_attention(q.slice(0, cq[b], cq[b + 1]).unsqueeze(0),
                             k.slice(0, ck[b], ck[b + 1]).unsqueeze(0),
                             v.slice(0, ck[b], ck[b + 1]).unsqueeze(0), ob, {});
        const auto one = host_values(ob);
        const std::vector<double> rows(packed.begin() + cq[b] * 4 * d,
                                       packed.begin() + cq[b + 1] * 4 * d);
        EXPECT_TRUE(attention_close(one, rows, {4e-3, 2e-2}, "sequence " + std::to_string(b)));
      }
    }
  }
}

TEST(FlashAttention, UnsupportedCasesAreRefusedAndSdpaFallsBack) {
  HK_REQUIRE_REAL_CUDA();
  Tensor q = to_gpu(random_cpu({1, 8, 2, 64}, DType::F32, 1));
  Tensor out = Tensor::empty(q.sizes(), DType::F32, gpu());
  EXPECT_THROW(ops::fused_attention(q, q, q, out), Unsupported);
  Tensor q96 = to_gpu(random_cpu({1, 8, 2, 96}, DType::BF16, 1));
  Tensor o96 = Tensor::empty(q96.sizes(), DType::BF16, gpu());
  EXPECT_THROW(ops::fused_attention(q96, q96, q96, o96), Unsupported);
  // the sdpa function runs the eager op for them
  nn::AttentionCall call;
  nn::attention_function("sdpa")(q, q, q, out, call, {});
  Tensor eager = Tensor::empty(q.sizes(), DType::F32, gpu());
  ops::attention(q, q, q, eager);
  EXPECT_EQ(host_values(out), host_values(eager));
}

// ---- the hub repos' entries
// ----------------------------------------------------------------------
std::shared_ptr<const KernelLibrary> load_repo(const std::string& spec) {
  hub::HubConfig hc = hub::HubConfig::from_environment();
  hc.endpoint.clear();
  hc.hub_dir = std::filesystem::path(std::getenv("HK_BINARY_DIR")) / "hub";
  hc.cache_dir = std::filesystem::temp_directory_path() / "hk-flash-test-cache";
  static hub::Hub h(hc);
  return h.load(h.resolve(spec, hub::Target::for_device(Device::cuda(0))));
}

TEST(FlashAttentionHub, KvcacheWritesInPlaceAndAttendsOverTheCache) {
  HK_REQUIRE_REAL_CUDA();
  auto lib = load_repo("kernels-community/flash-attn3");
  const KernelFunction fn = lib->function("flash_attn_with_kvcache");
  const int64_t B = 3, Tc = 4200, Hq = 16, Hkv = 8, D = 128;
  const std::vector<int64_t> seqlens{0, 100, 4000}, key_start{0, 5, 30};
  for (int64_t s_new : {1, 3}) {
    SCOPED_TRACE("S_new " + std::to_string(s_new));
    Tensor kc_cpu = random_cpu({B, Tc, Hkv, D}, DType::BF16, 40),
           vc_cpu = random_cpu({B, Tc, Hkv, D}, DType::BF16, 41);
    Tensor q_cpu = random_cpu({B, s_new, Hq, D}, DType::BF16, 42),
           kn_cpu = random_cpu({B, s_new, Hkv, D}, DType::BF16, 43),
           vn_cpu = random_cpu({B, s_new, Hkv, D}, DType::BF16, 44);
    Tensor kc = to_gpu(kc_cpu), vc = to_gpu(vc_cpu);
    Tensor seq = to_gpu(Tensor::from_ints(seqlens, {B}, DType::I32));
    Tensor ks = to_gpu(Tensor::from_ints(key_start, {B}, DType::I32));
    Tensor out = poisoned({B, s_new, Hq, D}, DType::BF16),
           lse = poisoned({B, Hq, s_new}, DType::F32);
    AttentionKvcacheAttrs attrs;
    fn.forward({to_gpu(q_cpu), kc, vc, seq, to_gpu(kn_cpu), to_gpu(vn_cpu), ks}, {out, lse}, attrs);
    // the cache now holds the new rows; build the reference over it
    const auto kc_after = host_values(kc), vc_after = host_values(vc);
    const auto kn = kn_cpu.to_doubles(), vn = vn_cpu.to_doubles();
    AttnProblem p;
    p.hq = Hq;
    p.hkv = Hkv;
    p.d = D;
    std::vector<double> k_packed, v_packed;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t T = seqlens[b] + s_new;
      p.S.push_back(s_new);
      p.T.push_back(T);
      p.key_start.push_back(key_start[b]);
      for (int64_t j = 0; j < s_new; ++j)
        for (int64_t e = 0; e < Hkv * D; ++e) {
          const size_t at = ((b * Tc + seqlens[b] + j) * Hkv) * D + e;
          ASSERT_EQ(kc_after[at], kn[(b * s_new + j) * Hkv * D + e]);
          ASSERT_EQ(vc_after[at], vn[(b * s_new + j) * Hkv * D + e]);
        }
      k_packed.insert(k_packed.end(), kc_after.begin() + b * Tc * Hkv * D,
                      kc_after.begin() + (b * Tc + T) * Hkv * D);
      v_packed.insert(v_packed.end(), vc_after.begin() + b * Tc * Hkv * D,
                      vc_after.begin() + (b * Tc + T) * Hkv * D);
    }
    const AttnRef ref = attention_reference(p, q_cpu.to_doubles(), k_packed, v_packed);
    EXPECT_TRUE(
        attention_close(host_values(out), ref.out, attention_tolerance(DType::BF16), "out"));
    EXPECT_TRUE(attention_close(host_values(lse), batch_lse(p, ref.lse), {2e-6, 2e-5}, "lse"));
  }
}

TEST(FlashAttentionHub, EntriesOfEveryRepoAgreeWithTheReference) {
  HK_REQUIRE_REAL_CUDA();
  const Case c{"everything", 2, 129, 257, 4, 2, true, 10.0, 50, true, 0.1f};
  for (const char* spec : {"kernels-community/flash-attn2", "kernels-community/flash-attn2@v2.1.0",
                           "kernels-community/flash-attn3", "kernels-community/flash-attn4"}) {
    SCOPED_TRACE(spec);
    auto lib = load_repo(spec);
    const KernelFunction fn = lib->function("flash_attn_func");
    const Inputs in = make_inputs(c, 128, DType::BF16, true, 9);
    const AttnProblem p = problem_of(c, 128);
    Tensor q = to_gpu(in.q), k = to_gpu(in.k), v = to_gpu(in.v), dout = to_gpu(in.dout);
    Tensor ks = to_gpu(Tensor::from_ints(p.key_start, {c.b}, DType::I32));
    AttentionAttrs a;
    a.scale = c.scale;
    a.softcap = static_cast<float>(c.softcap);
    a.window_left = static_cast<int32_t>(c.window);
    Tensor out = poisoned(in.q.sizes(), DType::BF16), lse = poisoned({c.b, c.hq, c.s}, DType::F32);
    fn.forward({q, k, v, ks}, {out, lse}, a);
    EXPECT_TRUE(
        attention_close(host_values(out), in.ref.out, attention_tolerance(DType::BF16), "out"));
    Tensor dq = poisoned(in.q.sizes(), DType::BF16), dk = poisoned(in.k.sizes(), DType::BF16),
           dv = poisoned(in.v.sizes(), DType::BF16);
    const std::vector<TensorView> bin{dout, q, k, v, out, lse, ks}, bout{dq, dk, dv};
    const size_t bytes = fn.workspace_size(true, bin, bout, &a, sizeof(a));
    Tensor ws = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, gpu());
    KernelCallOptions opts;
    opts.workspace = ws.view().ptr();
    opts.workspace_size = bytes;
    fn.backward(bin, bout, a, opts);
    const auto gt = attention_tolerance(DType::BF16, true);
    EXPECT_TRUE(attention_close(host_values(dq), in.ref.dq, gt, "dq"));
    EXPECT_TRUE(attention_close(host_values(dk), in.ref.dk, gt, "dk"));
    EXPECT_TRUE(attention_close(host_values(dv), in.ref.dv, gt, "dv"));
  }
}

TEST(FlashAttentionHub, CapturedForwardAndBackwardReplay) {
  HK_REQUIRE_REAL_CUDA();
  auto lib = load_repo("kernels-community/flash-attn3");
  const KernelFunction fn = lib->function("FlashAttention");
  const Case c{"capture", 2, 300, 300, 8, 2};
  const Inputs in = make_inputs(c, 128, DType::BF16, true, 17);
  Tensor q = to_gpu(in.q), k = to_gpu(in.k), v = to_gpu(in.v), dout = to_gpu(in.dout);
  Tensor out = Tensor::empty(in.q.sizes(), DType::BF16, gpu()),
         lse = Tensor::empty({c.b, c.hq, c.s}, DType::F32, gpu());
  Tensor dq = Tensor::empty(in.q.sizes(), DType::BF16, gpu()),
         dk = Tensor::empty(in.k.sizes(), DType::BF16, gpu()),
         dv = Tensor::empty(in.v.sizes(), DType::BF16, gpu());
  AttentionAttrs a;
  a.flags = kAttentionDeterministic;  // replays must equal the direct call bit for bit
  const std::vector<TensorView> bin{dout, q, k, v, out, lse}, bout{dq, dk, dv};
  const size_t bytes = fn.workspace_size(true, bin, bout, &a, sizeof(a));
  Tensor ws = Tensor::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, DType::U8, gpu());
  KernelCallOptions opts;
  opts.workspace = ws.view().ptr();
  opts.workspace_size = bytes;
  // warm-up outside the capture (one-time function attributes), and the direct results
  fn.forward({q, k, v}, {out, lse}, a, opts);
  fn.backward(bin, bout, a, opts);
  synchronize_device(gpu());
  const auto out0 = host_values(out), dq0 = host_values(dq), dk0 = host_values(dk),
             dv0 = host_values(dv);
  ops::fill(out, std::nan(""));
  ops::fill(dq, std::nan(""));
  synchronize_device(gpu());
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  opts.stream = Stream{s};
  const size_t mallocs_before = memory_stats(gpu()).num_device_mallocs;
  ASSERT_NO_FATAL_FAILURE(testing::capture_and_replay(
      s,
      [&] {
        fn.forward({q, k, v}, {out, lse}, a, opts);
        fn.backward(bin, bout, a, opts);
      },
      3));
  EXPECT_EQ(memory_stats(gpu()).num_device_mallocs, mallocs_before);
  EXPECT_EQ(host_values(out), out0);
  EXPECT_EQ(host_values(dq), dq0);
  EXPECT_EQ(host_values(dk), dk0);
  EXPECT_EQ(host_values(dv), dv0);
  EXPECT_TRUE(attention_close(out0, in.ref.out, attention_tolerance(DType::BF16), "out"));
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace hk
