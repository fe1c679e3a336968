// Device decode on CUDA (label gpu).
//
//  * the decode kernels against the built-in ops: gemv (1–16 rows, three weights in one launch,
//    the RMSNorm prologue with the residual add, the SwiGLU epilogue, bf16/f16/f32, odd shapes)
//    against ops::linear / add_rms_norm / act_mul; decode attention (GQA, left padding, per-row
//    lengths, split keys) against the eager op on the CPU; the greedy pick (first index on ties,
//    finished rows get the pad id, eos marks rows finished, positions and lengths advance);
//  * the graph pool: a capture pass is served from its warm-up's blocks and a new size throws;
//  * end to end on the model fixtures (and on HK_DECODE_TEST_MODEL, e.g. the Qwen3-0.6B-shaped
//    benchmark checkpoint, when set): graph decode gives the same ids as the same step launched
//    eagerly — greedy, f32 and bf16, batch 1 and a left-padded batch of 8, in two cache buckets,
//    with and without eos, and again from the cached graph; one fused device step gives the
//    logits of the model forward within the dtype's tolerance; seeded sampling on the device step
//    repeats; a kernel mapped by KernelConfig that does not declare capture safety falls back
//    with its reason under Inference | Capture and still decodes the built-in ids, and when bound
//    (Inference only) keeps the step out of the graph, saying why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include <unistd.h>

#include "generation/decode_session.h"
#include "gpu_testing.h"
#include "hk/allocator.h"
#include "hk/error.h"
#include "hk/models.h"
#include "hk/safetensors.h"
#include "models/decoder_lm.h"
#include "ops/decode/decode_kernels.h"

namespace hk {
namespace {
using namespace gpu_testing;
namespace fs = std::filesystem;

double atol_mm(DType dt) {
  return dt == DType::F32 ? 2e-4 : dt == DType::F16 ? 4e-3 : 3e-2;
}

// ---- gemv
// ----------------------------------------------------------------------------------------

const decode::GemvKernel kGemvKernels[] = {decode::GemvKernel::Auto, decode::GemvKernel::Mma,
                                           decode::GemvKernel::Bulk};
const char* kernel_name(decode::GemvKernel k) {
  return k == decode::GemvKernel::Mma ? "mma" : k == decode::GemvKernel::Bulk ? "bulk" : "auto";
}
// Whether the kernel `p` names serves it (the mma kernel and Auto serve every 16-bit call; f32
// runs its own kernel under Auto only).
bool serves(const decode::GemvParams& p) {
  if (p.dtype == DType::F32) return p.kernel == decode::GemvKernel::Auto;
  return decode::gemv_kernel_unsupported(p).empty();
}

struct GemvCase {
  DType dt;
  int64_t m, n, k;
};

TEST(DecodeGemv, MatchesLinearForOneToThreeWeights) {
  HK_REQUIRE_REAL_CUDA();
  // (the kernel itself, whatever HK_DECODE_GEMV_MAX_ROWS lets the decode step hand it)
  uint32_t seed = 1;
  for (GemvCase c : {GemvCase{DType::BF16, 1, 2048, 1024}, GemvCase{DType::BF16, 5, 1000, 96},
                     GemvCase{DType::BF16, 9, 33, 64}, GemvCase{DType::BF16, 16, 4096, 1024},
                     GemvCase{DType::F16, 3, 777, 2048}, GemvCase{DType::F16, 16, 64, 3072},
                     GemvCase{DType::BF16, 24, 640, 1024}, GemvCase{DType::BF16, 40, 1024, 2048},
                     GemvCase{DType::F16, 64, 300, 3072}, GemvCase{DType::BF16, 64, 2048, 1024},
                     GemvCase{DType::F32, 1, 300, 1024}, GemvCase{DType::F32, 11, 65, 68},
                     GemvCase{DType::BF16, 8, 1024, 3072}, GemvCase{DType::F16, 1, 129, 32},
                     GemvCase{DType::BF16, 2, 4100, 2048}}) {
    const std::string what = std::string(dtype_name(c.dt)) + " m" + std::to_string(c.m) + " n" +
                             std::to_string(c.n) + " k" + std::to_string(c.k);
    Tensor x = random_cpu({c.m, c.k}, c.dt, seed++);
    Tensor gx = to_gpu(x);
    decode::GemvParams p;
    p.dtype = c.dt;
    p.m = c.m;
    p.k = c.k;
    p.x = gx.view().ptr();
    p.x_stride = c.k;
    // Three weights of different sizes writing into one wide output (as q, k, v).
    const int64_t ns[3] = {c.n, c.n / 2 + 1, 17};
    const int64_t width = ns[0] + ns[1] + ns[2] + 8;
    Tensor out = gpu_output({c.m, width}, c.dt);
    std::vector<Tensor> w, b, refs;
    int64_t col = 0;
    for (int s = 0; s < 3; ++s) {
      w.push_back(random_cpu({ns[s], c.k}, c.dt, seed++));
      b.push_back(random_cpu({ns[s]}, c.dt, seed++));
      Tensor ref = Tensor::empty({c.m, ns[s]}, c.dt);
      ops::linear(x, w.back(), s == 1 ? &b.back().view() : nullptr, ref);
      refs.push_back(ref);
    }
    std::vector<Tensor> gw, gb;
    for (int s = 0; s < 3; ++s) {
      gw.push_back(to_gpu(w[s]));
      gb.push_back(to_gpu(b[s]));
      p.segments[s].weight = gw[s].view().ptr();
      p.segments[s].bias = s == 1 ? gb[s].view().ptr() : nullptr;
      p.segments[s].out = static_cast<char*>(out.view().ptr()) + col * dtype_size(c.dt);
      p.segments[s].out_stride = width;
      p.segments[s].n = ns[s];
      col += ns[s];
    }
    p.num_segments = 3;
    ASSERT_EQ(decode::gemv_unsupported(p), "") << what;
    // each 16-bit kernel that serves the call (the staged one takes 1-8 rows), and the default
    for (decode::GemvKernel kernel : kGemvKernels) {
      p.kernel = kernel;
      if (!serves(p)) continue;
      const std::string run = what + " kernel " + kernel_name(kernel);
      ops::fill(out, NAN);
      decode::gemv(p, {});
      col = 0;
      for (int s = 0; s < 3; ++s) {
        EXPECT_TRUE(close(out.slice(1, col, col + ns[s]), refs[s], atol_mm(c.dt), rtol_for(c.dt)))
            << run << " weight " << s;
        col += ns[s];
      }
    }
  }
}

TEST(DecodeGemv, NormPrologueAndSwiGLUEpilogueMatchTheOps) {
  HK_REQUIRE_REAL_CUDA();
  uint32_t seed = 100;
  for (DType dt : {DType::BF16, DType::F16})
    for (int64_t m : {1, 2, 4, 8, 13})
      for (bool with_delta : {false, true})
        // (k = 896: a row's 112 16-byte pieces straddle the warps of the staged gemv's prologue)
        for (int64_t k : {1024, 896}) {
          const int64_t n = 384;
          const std::string what = std::string(dtype_name(dt)) + " m" + std::to_string(m) + " k" +
                                   std::to_string(k) + (with_delta ? " +delta" : "");
          Tensor h = random_cpu({m, k}, dt, seed++), delta = random_cpu({m, k}, dt, seed++);
          Tensor nw = random_cpu({k}, dt, seed++, 0.5f, 1.5f);
          Tensor wg = random_cpu({n, k}, dt, seed++), wu = random_cpu({n, k}, dt, seed++);
          // reference: residual add + norm, gate/up linears, act_mul
          Tensor h_ref = h.clone(), normed = Tensor::empty({m, k}, dt);
          if (with_delta)
            ops::add_rms_norm(h_ref, delta, nw, 1e-6f, normed);
          else
            ops::rms_norm(h_ref, nw, 1e-6f, normed);
          Tensor gate = Tensor::empty({m, n}, dt), up = Tensor::empty({m, n}, dt);
          ops::linear(normed, wg, nullptr, gate);
          ops::linear(normed, wu, nullptr, up);
          Tensor act = Tensor::empty({m, n}, dt);
          ops::act_mul(ops::Activation::SiLU, gate, up, act);

          Tensor gh = to_gpu(h), gd = to_gpu(delta), gn = to_gpu(nw), gwg = to_gpu(wg),
                 gwu = to_gpu(wu);
          Tensor h_out = gpu_output({m, k}, dt), out = gpu_output({m, n}, dt);
          decode::GemvParams p;
          p.dtype = dt;
          p.m = m;
          p.k = k;
          p.has_prologue = true;
          p.prologue.residual = gh.view().ptr();
          p.prologue.residual_stride = k;
          p.prologue.delta = with_delta ? gd.view().ptr() : nullptr;
          p.prologue.delta_stride = k;
          p.prologue.residual_out = with_delta ? h_out.view().ptr() : nullptr;
          p.prologue.residual_out_stride = k;
          p.prologue.norm_weight = gn.view().ptr();
          p.prologue.eps = 1e-6f;
          p.segments[0] = {gwg.view().ptr(), nullptr, out.view().ptr(), n, n};
          p.segments[1] = {gwu.view().ptr(), nullptr, out.view().ptr(), n, n};
          p.num_segments = 2;
          p.epilogue = decode::GemvEpilogue::SiluMul;
          ASSERT_EQ(decode::gemv_unsupported(p), "") << what;
          for (decode::GemvKernel kernel : kGemvKernels) {
            p.kernel = kernel;
            if (!serves(p)) continue;
            const std::string run = what + " kernel " + kernel_name(kernel);
            ops::fill(out, NAN);
            ops::fill(h_out, NAN);
            decode::gemv(p, {});
            // Two separately rounded chains (x normalised, gate and up rounded, then multiplied): a
            // one-ulp flip of a normalised element moves gate or up by that element's weight, and
            // the product amplifies it where the other factor is large. So: almost every element
            // within the elementwise tolerance, none off by more than a few percent of the scale.
            const std::vector<double> got = to_cpu(out).to_doubles(), want = act.to_doubles();
            double scale = 0, worst = 0;
            size_t off = 0;
            for (double w : want) scale = std::max(scale, std::abs(w));
            for (size_t i = 0; i < got.size(); ++i) {
              const double diff = std::abs(got[i] - want[i]);
              worst = std::max(worst, diff);
              off += !(diff <= atol_mm(dt) + 2 * rtol_for(dt) * std::abs(want[i]));
            }
            EXPECT_LE(off, got.size() / 100)
                << run << " (" << off << " elements off, worst " << worst << ")";
            EXPECT_LE(worst, 0.03 * scale) << run << " (scale " << scale << ")";
            if (with_delta) EXPECT_TRUE(close(h_out, h_ref, 0.0, 0.0)) << run << " residual";
          }
        }
}

TEST(DecodeGemv, RefusesWhatItCannotServe) {
  HK_REQUIRE_REAL_CUDA();
  decode::GemvParams p;
  p.dtype = DType::BF16;
  p.m = 65;
  p.k = 64;
  EXPECT_NE(decode::gemv_unsupported(p).find("65 rows"), std::string::npos);
  p.dtype = DType::F32;
  p.m = 17;
  EXPECT_NE(decode::gemv_unsupported(p).find("17 rows"), std::string::npos);
  p.m = 1;
  p.k = 40;  // 16-bit rows must be whole 32-element chunks (f32 rows: multiples of 4)
  EXPECT_EQ(decode::gemv_unsupported(p).find("in_features"), std::string::npos);
  p.dtype = DType::BF16;
  EXPECT_NE(decode::gemv_unsupported(p).find("multiple of 32"), std::string::npos);
  p.dtype = DType::F32;
  p.k = 42;
  EXPECT_NE(decode::gemv_unsupported(p).find("multiple of 4"), std::string::npos);
  // the staged kernel, asked for by name: 1-8 rows of 16-bit values, and it says so
  p.kernel = decode::GemvKernel::Bulk;
  p.dtype = DType::BF16;
  p.k = 64;
  p.m = 9;
  EXPECT_NE(decode::gemv_kernel_unsupported(p).find("1 to 8 rows"), std::string::npos);
  p.m = 8;
  EXPECT_EQ(decode::gemv_kernel_unsupported(p), "");
  p.kernel = decode::GemvKernel::Mma;
  p.m = 16;
  EXPECT_EQ(decode::gemv_kernel_unsupported(p), "");
}

// ---- attention ---------------------------------------------------------------------------------

struct AttnCase {
  DType dt;
  int64_t b, hq, hkv, d, t;
};

TEST(DecodeAttention, MatchesEagerAttentionPerRow) {
  HK_REQUIRE_REAL_CUDA();
  uint32_t seed = 7;
  for (AttnCase c :
       {AttnCase{DType::BF16, 1, 16, 8, 128, 2304}, AttnCase{DType::BF16, 3, 4, 2, 16, 256},
        AttnCase{DType::F16, 2, 8, 1, 64, 300}, AttnCase{DType::F32, 4, 6, 3, 32, 129},
        AttnCase{DType::BF16, 64, 16, 8, 128, 256}, AttnCase{DType::F32, 1, 2, 2, 256, 64},
        AttnCase{DType::BF16, 5, 32, 8, 128, 200}, AttnCase{DType::F16, 3, 48, 3, 128, 77}})
    for (int splits : {1, 0, -1}) {  // 0: attention_splits' choice; -1: eager semantics
      const std::string what = std::string(dtype_name(c.dt)) + " b" + std::to_string(c.b) + " hq" +
                               std::to_string(c.hq) + "/" + std::to_string(c.hkv) + " d" +
                               std::to_string(c.d) + " t" + std::to_string(c.t) + " splits " +
                               std::to_string(splits);
      Tensor q = random_cpu({c.b, 1, c.hq, c.d}, c.dt, seed++);
      Tensor kc = random_cpu({c.b, c.t, c.hkv, c.d}, c.dt, seed++);
      Tensor vc = random_cpu({c.b, c.t, c.hkv, c.d}, c.dt, seed++);
      std::mt19937 rng(seed++);
      std::vector<int64_t> lengths(c.b), starts(c.b);
      for (int64_t r = 0; r < c.b; ++r) {
        lengths[r] = std::uniform_int_distribution<int64_t>(0, c.t - 1)(rng);  // + 1 new key
        starts[r] = r % 3 == 1 ? std::min<int64_t>(lengths[r], 5) : 0;
      }
      if (c.b > 1) starts[c.b - 1] = lengths[c.b - 1] + 1;  // a fully masked row gives zeros
      Tensor gq = to_gpu(q), gk = to_gpu(kc), gv = to_gpu(vc);
      Tensor glen = to_gpu(Tensor::from_ints(lengths, {c.b}, DType::I32));
      Tensor gstart = to_gpu(Tensor::from_ints(starts, {c.b}, DType::I32));
      Tensor out = gpu_output({c.b, 1, c.hq, c.d}, c.dt);
      decode::DecodeAttentionParams p;
      p.dtype = c.dt;
      p.batch = c.b;
      p.heads_q = c.hq;
      p.heads_kv = c.hkv;
      p.head_dim = c.d;
      p.q = gq.view().ptr();
      p.q_batch_stride = c.hq * c.d;
      p.k_cache = gk.view().ptr();
      p.v_cache = gv.view().ptr();
      p.cache_batch_stride = c.t * c.hkv * c.d;
      p.cache_row_stride = c.hkv * c.d;
      p.lengths = glen.data_as<int32_t>();
      p.length_add = 1;
      p.key_start = gstart.data_as<int32_t>();
      p.out = out.view().ptr();
      p.out_batch_stride = c.hq * c.d;
      p.splits = splits == 0 ? decode::attention_splits(c.b, c.hkv, c.t) : 1;
      p.eager = splits < 0;
      Tensor ws, counters;
      if (p.splits > 1) {
        ws = Tensor::empty({int64_t(decode::attention_workspace_floats(c.b, c.hq, c.d, p.splits))},
                           DType::F32, gpu());
        counters = Tensor::zeros({c.b * c.hkv}, DType::I32, gpu());
        p.workspace = ws.data_as<float>();
        p.counters = counters.data_as<int32_t>();
      }
      ASSERT_EQ(decode::attention_unsupported(p), "") << what;
      for (int rep = 0; rep < 2; ++rep) decode::attention(p, {});  // counters reset by the kernel
      Tensor ref = Tensor::empty({c.b, 1, c.hq, c.d}, c.dt);
      for (int64_t r = 0; r < c.b; ++r) {
        const int64_t len = lengths[r] + 1;
        Tensor ks = Tensor::from_ints({starts[r]}, {1}, DType::I32);
        ops::AttentionOptions o;
        o.key_start = &ks.view();
        ops::attention(q.slice(0, r, r + 1), kc.slice(0, r, r + 1).slice(1, 0, len),
                       vc.slice(0, r, r + 1).slice(1, 0, len), ref.slice(0, r, r + 1), o);
      }
      // The eager form rounds the probabilities as the reference does: a tighter bound.
      const double atol = c.dt == DType::F32 ? 1e-5 : p.eager ? 4e-3 : 2e-2;
      EXPECT_TRUE(close(out, ref, atol, rtol_for(c.dt))) << what;
    }
}

// ---- greedy -----------------------------------------------------------------------------------

TEST(DecodeGreedy, FirstMaxPadForFinishedRowsEosAndAdvance) {
  HK_REQUIRE_REAL_CUDA();
  for (DType dt : {DType::BF16, DType::F32})
    // {vocab, row stride}: 16-byte rows (vector loads), an odd row (scalar loads), and padded
    // rows of an odd vocabulary (vector loads and a scalar tail; the padding must not be read)
    for (auto [vocab, stride] :
         {std::pair<int64_t, int64_t>{151936, 151936}, {3008, 3008}, {7, 7}, {3001, 3008}}) {
      const int64_t b = 5;
      Tensor logits = random_cpu({b, stride}, dt, 42);
      std::vector<double> v = logits.to_doubles();
      // ties: the max value again at a later and an earlier index of row 0
      std::vector<float> f(v.begin(), v.end());
      const size_t best0 = std::max_element(f.begin(), f.begin() + vocab) - f.begin();
      f[static_cast<size_t>(vocab - 1)] = f[best0];
      if (best0 > 0) f[0] = f[best0];
      for (int64_t r = 0; r < b; ++r)
        for (int64_t j = vocab; j < stride; ++j) f[static_cast<size_t>(r * stride + j)] = 1e4f;
      logits = Tensor::from_floats(f, {b, stride}, dt);
      v = logits.to_doubles();
      std::vector<int64_t> expect(b);
      for (int64_t r = 0; r < b; ++r)
        expect[r] = std::max_element(v.begin() + r * stride, v.begin() + r * stride + vocab) -
                    (v.begin() + r * stride);
      Tensor gl = to_gpu(logits);
      Tensor tokens = to_gpu(Tensor::from_ints(std::vector<int64_t>(b, -1), {b}, DType::I64));
      Tensor done = to_gpu(Tensor::from_ints({0, 1, 0, 0, 0}, {b}, DType::I32));
      Tensor eos = to_gpu(Tensor::from_ints({expect[2], 999999}, {2}, DType::I64));
      Tensor pos = to_gpu(Tensor::from_ints({3, 4, 5, 6, 7}, {b}, DType::I32));
      Tensor len = to_gpu(Tensor::from_ints({10, 10, 10, 10, 10}, {b}, DType::I32));
      decode::GreedyParams p;
      p.dtype = dt;
      p.batch = b;
      p.vocab = vocab;
      p.logits = gl.view().ptr();
      p.logits_stride = stride;
      p.tokens = tokens.data_as<int64_t>();
      p.done = done.data_as<int32_t>();
      p.eos = eos.data_as<int64_t>();
      p.num_eos = 2;
      p.pad_id = 77;
      p.positions = pos.data_as<int32_t>();
      p.lengths = len.data_as<int32_t>();
      p.blocks_per_row = decode::greedy_blocks_per_row(b, vocab);
      Tensor pv, pi, counters;
      if (p.blocks_per_row > 1) {
        pv = Tensor::empty({b * p.blocks_per_row}, DType::F32, gpu());
        pi = Tensor::empty({b * p.blocks_per_row}, DType::I32, gpu());
        counters = Tensor::zeros({b}, DType::I32, gpu());
        p.partial_values = pv.data_as<float>();
        p.partial_indices = pi.data_as<int32_t>();
        p.counters = counters.data_as<int32_t>();
      }
      decode::greedy(p, {});
      std::vector<int64_t> want = expect;
      want[1] = 77;
      EXPECT_EQ(to_cpu(tokens).to_int64s(), want) << dtype_name(dt) << " vocab " << vocab;
      std::vector<int64_t> want_done(b, 0);
      for (int64_t r = 0; r < b; ++r) want_done[r] = r == 1 || expect[r] == expect[2];
      EXPECT_EQ(to_cpu(done).to_int64s(), want_done);
      EXPECT_EQ(to_cpu(pos).to_int64s(), (std::vector<int64_t>{4, 5, 6, 7, 8}));
      EXPECT_EQ(to_cpu(len).to_int64s(), std::vector<int64_t>(b, 11));
      if (p.blocks_per_row > 1) EXPECT_EQ(to_cpu(counters).to_int64s(), std::vector<int64_t>(b, 0));
    }
}

// ---- graph pool ------------------------------------------------------------------------------

TEST(GraphPool, CapturePassIsServedFromTheWarmUp) {
  HK_REQUIRE_REAL_CUDA();
  const Device dev = Device::cuda(0);
  GraphPool pool(dev);
  auto pass = [&] {
    Tensor a = Tensor::empty({1000}, DType::F32, dev);
    Tensor b = Tensor::empty({3 << 20}, DType::BF16, dev);
    a = Tensor();
    Tensor c = Tensor::empty({1000}, DType::F32, dev);
    Tensor d = Tensor::empty({1000}, DType::F32, dev);
  };
  {
    GraphPoolScope scope(pool, true);
    pass();
  }
  const size_t mallocs = pool.num_device_mallocs();
  EXPECT_EQ(mallocs, 3u);
  {
    GraphPoolScope scope(pool, false);
    pass();
    pass();
    EXPECT_THROW(Tensor::empty({12345}, DType::F32, dev), RuntimeFailure);
  }
  EXPECT_EQ(pool.num_device_mallocs(), mallocs);
  // Outside the scope allocations use the shared cache again.
  Tensor e = Tensor::empty({12345}, DType::F32, dev);
  EXPECT_EQ(pool.num_device_mallocs(), mallocs);
}

// ---- end to end ---------------------------------------------------------------------------------

std::string fixture(const std::string& name) {
  return std::string(HK_TEST_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

// (model dir, dtypes): the fixtures in f32 and bf16; HK_DECODE_TEST_MODEL (a real-sized
// checkpoint, e.g. the benchmark's) in bf16, the dtype it is benchmarked in.
struct ModelUnderTest {
  std::string dir;
  std::vector<DType> dtypes;
  std::vector<std::string> attention;  // attn_implementation values
};
std::vector<ModelUnderTest> models_under_test() {
  std::vector<ModelUnderTest> out;
  for (const char* name : {"qwen3-tiny", "qwen3-tiny-bf16", "llama-tiny-bf16"})
    out.push_back({fixture(name), {DType::F32, DType::BF16}, {"eager"}});
  // sdpa on a head dim the flash kernels serve: their split-KV decode with device lengths
  if (const char* extra = std::getenv("HK_DECODE_TEST_MODEL"); extra && *extra)
    out.push_back({extra, {DType::BF16}, {"eager", "sdpa"}});
  return out;
}

CausalLM load(const std::string& dir, DType dtype, LoadOptions options = {},
              const std::string& attention = "") {
  options.device = "cuda";
  options.attn_implementation = attention;
  options.dtype = dtype;
  CausalLM model = AutoModelForCausalLM::from_pretrained(dir, options);
  // The fixtures' 128-position context is a config value; rotary works past it, and the second
  // cache bucket needs longer prompts.
  DecoderLM& lm = model.impl();
  lm.config.max_position_embeddings = std::max<int64_t>(lm.config.max_position_embeddings, 2048);
  return model;
}

std::vector<std::vector<int64_t>> random_prompts(int64_t vocab, size_t rows, int64_t min_len,
                                                 int64_t max_len, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int64_t>> out(rows);
  for (auto& p : out) {
    p.resize(static_cast<size_t>(std::uniform_int_distribution<int64_t>(min_len, max_len)(rng)));
    for (auto& id : p) id = std::uniform_int_distribution<int64_t>(0, vocab - 1)(rng);
  }
  return out;
}

std::string name_of(const std::string& dir) {
  return fs::path(dir).filename().string();
}

TEST(DeviceDecode, GraphGivesTheIdsOfTheEagerDeviceStep) {
  HK_REQUIRE_REAL_CUDA();
  for (const ModelUnderTest& mt : models_under_test())
    for (DType dt : mt.dtypes)
      for (const std::string& attention : mt.attention) {
        const std::string& dir = mt.dir;
        CausalLM model = load(dir, dt, {}, attention);
        const int64_t vocab = model.config().vocab_size;
        struct Case {
          size_t rows;
          int64_t min_len, max_len, new_tokens;
        };
        // bucket 256 (short prompts) and bucket 512 (prompts past 256 positions)
        for (Case c : {Case{1, 5, 5, 24}, Case{8, 3, 17, 24}, Case{1, 260, 260, 12},
                       Case{8, 240, 300, 12}}) {
          const std::string what = name_of(dir) + " " + dtype_name(dt) + " " + attention +
                                   " rows " + std::to_string(c.rows) + " len " +
                                   std::to_string(c.max_len);
          auto prompts = random_prompts(vocab, c.rows, c.min_len, c.max_len, 11);
          GenerateOptions o{.max_new_tokens = c.new_tokens,
                            .eos_token_ids = std::vector<int64_t>{}};
          o.cuda_graphs = false;
          GenerateOutput eager = model.generate(prompts, o);
          EXPECT_EQ(eager.timings.decode_path, "device")
              << what << ": " << eager.timings.decode_note;
          o.cuda_graphs = true;
          GenerateOutput graph = model.generate(prompts, o);
          EXPECT_EQ(graph.timings.decode_path, "cuda-graph")
              << what << ": " << graph.timings.decode_note;
          EXPECT_EQ(graph.sequences, eager.sequences) << what;
          // the cached session replays its graph from the first step
          EXPECT_EQ(model.generate(prompts, o).sequences, eager.sequences) << what << " (replay)";
          // with stop ids: rows finish at different steps
          std::vector<int64_t> eos;
          for (const auto& row : eager.sequences) eos.push_back(row[row.size() / 2]);
          o.eos_token_ids = eos;
          o.cuda_graphs = false;
          auto eager_eos = model.generate(prompts, o).sequences;
          o.cuda_graphs = true;
          auto graph_eos = model.generate(prompts, o).sequences;
          EXPECT_EQ(graph_eos, eager_eos) << what << " (eos)";
          for (size_t r = 0; r < c.rows; ++r)
            EXPECT_LE(graph_eos[r].size(), eager.sequences[r].size() / 2 + 1)
                << what << " row " << r;
        }
      }
}

// On CUDA the loader stores the weights of q/k/v and of gate/up as adjacent rows of one buffer
// (nn::forward_linears then runs each set as one product: the decode step at 17+ rows).
TEST(DeviceDecode, LoaderStoresSiblingWeightsAdjacently) {
  HK_REQUIRE_REAL_CUDA();
  for (const ModelUnderTest& mt : models_under_test()) {
    CausalLM model = load(mt.dir, mt.dtypes.front());
    auto follows = [](const nn::Linear& a, const nn::Linear& b) {
      const TensorView& wa = a.weight().view();
      return static_cast<const char*>(wa.ptr()) +
                 a.out_features() * a.in_features() * dtype_size(wa.dtype) ==
             b.weight().view().ptr();
    };
    int checked = 0;
    for (auto& [path, m] : model.module().named_modules()) {
      if (auto* at = dynamic_cast<nn::Attention*>(m)) {
        EXPECT_TRUE(follows(*at->q_proj, *at->k_proj) && follows(*at->k_proj, *at->v_proj))
            << name_of(mt.dir) << " " << path << ": q/k/v weights not adjacent";
        ++checked;
      }
      if (auto* mlp = dynamic_cast<nn::MLP*>(m)) {
        EXPECT_TRUE(follows(*mlp->gate_proj, *mlp->up_proj))
            << name_of(mt.dir) << " " << path << ": gate/up weights not adjacent";
        ++checked;
      }
    }
    EXPECT_GT(checked, 0) << name_of(mt.dir);
  }
}

// One device step (fused kernels) against one model forward over the same cache.
TEST(DeviceDecode, FusedStepGivesTheLogitsOfTheModelForward) {
  HK_REQUIRE_REAL_CUDA();
  for (const ModelUnderTest& mt : models_under_test())
    for (DType dt : mt.dtypes)
      for (const std::string& attention : mt.attention)
        for (size_t rows : {size_t(1), size_t(8), size_t(40)}) {
          const std::string& dir = mt.dir;
          CausalLM model = load(dir, dt, {}, attention);
          DecoderLM& lm = model.impl();
          const ModelConfig& c = lm.config;
          const std::string what = name_of(dir) + " " + dtype_name(dt) + " " + attention +
                                   " rows " + std::to_string(rows);
          auto prompts = random_prompts(c.vocab_size, rows, 3, 19, 5);
          int64_t len = 0;
          for (auto& p : prompts) len = std::max<int64_t>(len, static_cast<int64_t>(p.size()));
          const int64_t b = static_cast<int64_t>(rows);
          std::vector<int64_t> ids(static_cast<size_t>(b * len), 0), pad(static_cast<size_t>(b)),
              positions(static_cast<size_t>(b));
          for (int64_t r = 0; r < b; ++r) {
            pad[r] = len - static_cast<int64_t>(prompts[r].size());
            positions[r] = len - pad[r];
            std::copy(prompts[r].begin(), prompts[r].end(), ids.begin() + r * len + pad[r]);
          }
          std::string why;
          auto session = DecodeSession::create(lm, b, 256, /*greedy=*/false, /*graphs=*/false, why);
          ASSERT_TRUE(session) << what << ": " << why;
          ForwardOptions fwd;
          fwd.cache = &session->cache();
          fwd.logits_to_keep = 1;
          fwd.stream = session->stream();
          fwd.key_start = Tensor::from_ints(pad, {b}, DType::I64);
          Tensor logits0 = lm.forward(Tensor::from_ints(ids, {b, len}), fwd).logits;
          Tensor first = Tensor::empty({b}, DType::I64, lm.device, session->stream());
          ops::argmax(logits0.reshape({b, c.vocab_size}), first, session->stream());
          std::vector<int64_t> next = to_cpu(first, session->stream()).to_int64s();
          session->start(next, positions, len, pad, std::vector<int64_t>(static_cast<size_t>(b), 0),
                         {}, 0);
          const float* dev = session->sample_step(next);
          std::vector<float> got(dev, dev + b * c.vocab_size);

          KVCache ref_cache(c.num_hidden_layers, b, len + 2, c.num_key_value_heads, c.head_dim,
                            lm.dtype, lm.device);
          ForwardOptions rf;
          rf.cache = &ref_cache;
          rf.logits_to_keep = 1;
          rf.key_start = fwd.key_start;
          lm.forward(Tensor::from_ints(ids, {b, len}), rf);
          Tensor ref_logits = lm.forward(Tensor::from_ints(next, {b, 1}), rf).logits;
          Tensor ref32 = Tensor::empty({b, c.vocab_size}, DType::F32, lm.device);
          ops::cast(ref_logits.reshape({b, c.vocab_size}), ref32);
          std::vector<double> want = to_cpu(ref32).to_doubles();
          double scale = 0, worst = 0;
          for (double w : want) scale = std::max(scale, std::abs(w));
          for (size_t i = 0; i < want.size(); ++i)
            worst = std::max(worst, std::abs(double(got[i]) - want[i]));
          const double tol = dt == DType::F32 ? 1e-4 * (1 + scale) : 0.06 * (1 + scale);
          EXPECT_LE(worst, tol) << what << " (max |logit| " << scale << ")";
          std::printf("[ fused step ] %s: max |logit diff| %.3g (max |logit| %.3g)\n", what.c_str(),
                      worst, scale);
        }
}

TEST(DeviceDecode, SeededSamplingRepeatsOnTheDeviceStep) {
  HK_REQUIRE_REAL_CUDA();
  CausalLM model = load(fixture("qwen3-tiny-bf16"), DType::BF16);
  auto prompts = random_prompts(model.config().vocab_size, 3, 4, 9, 3);
  GenerateOptions o{.max_new_tokens = 10,
                    .do_sample = true,
                    .temperature = 0.8,
                    .top_k = 50,
                    .seed = 9,
                    .eos_token_ids = std::vector<int64_t>{}};
  auto a = model.generate(prompts, o);
  EXPECT_EQ(a.timings.decode_path, "cuda-graph") << a.timings.decode_note;
  EXPECT_EQ(model.generate(prompts, o).sequences, a.sequences);
  o.cuda_graphs = false;
  EXPECT_EQ(model.generate(prompts, o).sequences, a.sequences);
}

fs::path nocapture_kernel_dir() {
  const char* bin = std::getenv("HK_BINARY_DIR");
  fs::path root = fs::path(bin ? bin : ".") / "decode-test-hub" / "kernels-community" /
                  "test-nocapture-rmsnorm";
  if (!fs::exists(root)) return {};
  for (auto& e : fs::recursive_directory_iterator(root))
    if (e.path().filename() == "metadata.json") return e.path().parent_path();
  return {};
}

TEST(DeviceDecode, NonCaptureKernelFallsBackWithItsReasonAndDecodesTheSameIds) {
  HK_REQUIRE_REAL_CUDA();
  const fs::path kernel = nocapture_kernel_dir();
  ASSERT_FALSE(kernel.empty()) << "build hk_publish_decode_test_hub first";
  const std::string dir = fixture("qwen3-tiny-bf16");
  auto prompts = random_prompts(3008, 8, 3, 17, 21);
  GenerateOptions o{.max_new_tokens = 16, .eos_token_ids = std::vector<int64_t>{}};
  o.cuda_graphs = false;
  const auto builtin = load(dir, DType::BF16).generate(prompts, o).sequences;

  KernelConfig config{{{"RMSNorm", kernel.string() + ":RMSNorm"}}};
  config.use_local_kernel = true;
  config.inherit_mapping = false;  // only this kernel: the rest stays built-in
  LoadOptions capture;
  capture.kernel_config = config;
  capture.kernelize_capture = true;
  CausalLM model = load(dir, DType::BF16, capture);
  const KernelizeReport* report = model.kernelize_report();
  ASSERT_TRUE(report);
  EXPECT_EQ(report->mode, Mode::Inference | Mode::Capture);
  size_t norms = 0;
  for (const LayerDecision& d : report->layers) {
    if (d.layer != "RMSNorm") continue;
    ++norms;
    EXPECT_TRUE(d.kernel.empty()) << d.path << " " << d.kernel;
    EXPECT_NE(d.reason.find("not inference|capture"), std::string::npos)
        << d.path << ": " << d.reason;
  }
  EXPECT_GT(norms, 0u);
  o.cuda_graphs = true;
  GenerateOutput out = model.generate(prompts, o);
  EXPECT_EQ(out.timings.decode_path, "cuda-graph") << out.timings.decode_note;
  EXPECT_EQ(out.sequences, builtin);

  // Kernelized for Inference only, the kernel is bound and the step stays out of the graph.
  LoadOptions plain;
  plain.kernel_config = config;
  CausalLM bound = load(dir, DType::BF16, plain);
  size_t bound_norms = 0;
  for (const LayerDecision& d : bound.kernelize_report()->layers)
    bound_norms += d.layer == "RMSNorm" && !d.kernel.empty();
  EXPECT_EQ(bound_norms, norms);
  GenerateOutput refused = bound.generate(prompts, o);
  EXPECT_EQ(refused.timings.decode_path, "device");
  EXPECT_NE(refused.timings.decode_note.find("does not declare CUDA-graph capture safety"),
            std::string::npos)
      << refused.timings.decode_note;
  for (const auto& row : refused.sequences) EXPECT_EQ(row.size(), 16u);
}

// ---- the persistent step (HK_DECODE_PERSISTENT), last: a kernel that traps ends the process's
// CUDA context, and the tests above have run by then
// -------------------------------------------------

// An environment variable (HK_DECODE_PERSISTENT by default) for a scope (the plan reads it when a
// session is made), then as it was.
class PersistentStepEnv {
 public:
  explicit PersistentStepEnv(const char* value, const char* name = "HK_DECODE_PERSISTENT")
      : name_(name) {
    if (const char* v = std::getenv(name)) before_ = v, had_ = true;
    setenv(name, value, 1);
  }
  ~PersistentStepEnv() {
    if (had_)
      setenv(name_.c_str(), before_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::string before_;
  bool had_ = false;
};

// A random checkpoint of the shape the persistent step serves (hidden 1024, head dim 128, 16 q and
// 8 kv heads, intermediate 3072: Qwen3-0.6B's) with `layers` layers and a small vocabulary, written
// once per process under the system temp directory: "qwen3" (q/k norm, default rope) or "llama" (no
// q/k norm, llama3-scaled rope); both with their own lm_head (a tied random one only repeats the
// input id; gpu-test's Qwen3-0.6B checkpoint is tied). Weights uniform within
// ±1.7/√(input width), norms 1 ± 0.1, so activations stay O(1) through the layers.
std::string write_persistent_step_model(const std::string& type, int layers, int64_t vocab) {
  const fs::path dir =
      fs::temp_directory_path() / ("hk-persistent-step-" + type + "-" + std::to_string(::getpid()));
  if (fs::exists(dir / "model.safetensors")) return dir.string();
  fs::create_directories(dir);
  constexpr int64_t hidden = 1024, heads = 16, kv_heads = 8, head_dim = 128, inter = 3072;
  const bool qwen = type == "qwen3";
  {
    std::FILE* f = std::fopen((dir / "config.json").c_str(), "w");
    if (f == nullptr) throw RuntimeFailure("cannot write " + (dir / "config.json").string());
    std::fprintf(
        f,
        "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"hidden_size\": %ld, "
        "\"intermediate_size\": %ld, \"num_attention_heads\": %ld, \"num_key_value_heads\": %ld, "
        "\"head_dim\": %ld, \"num_hidden_layers\": %d, \"vocab_size\": %ld, \"hidden_act\": "
        "\"silu\", \"rms_norm_eps\": 1e-06, \"max_position_embeddings\": 4096, "
        "\"attention_bias\": false, \"mlp_bias\": false, \"tie_word_embeddings\": %s, "
        "\"torch_dtype\": \"bfloat16\", \"eos_token_id\": 0, %s}\n",
        qwen ? "Qwen3ForCausalLM" : "LlamaForCausalLM", type.c_str(), long(hidden), long(inter),
        long(heads), long(kv_heads), long(head_dim), layers, long(vocab), "false",
        qwen ? "\"rope_theta\": 1000000.0"
             : "\"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": \"llama3\", "
               "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
               "\"original_max_position_embeddings\": 256}");
    std::fclose(f);
  }
  std::mt19937 rng(type.size() * 7919u + static_cast<unsigned>(layers));
  std::vector<Tensor> keep;
  std::vector<std::pair<std::string, TensorView>> tensors;
  auto add = [&](const std::string& name, Shape shape, float scale, float offset) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& e : v) e = offset + scale * u(rng);
    Tensor t = Tensor::empty(shape, DType::BF16);
    ops::cast(Tensor::from_floats(v, shape), t);
    keep.push_back(t);
    tensors.emplace_back(name, keep.back().view());
  };
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    add(name, {rows, cols}, 1.7f / std::sqrt(static_cast<float>(cols)), 0.0f);
  };
  auto norm = [&](const std::string& name, int64_t n) { add(name, {n}, 0.1f, 1.0f); };
  add("model.embed_tokens.weight", {vocab, hidden}, 1.0f, 0.0f);
  for (int l = 0; l < layers; ++l) {
    const std::string at = "model.layers." + std::to_string(l) + ".";
    norm(at + "input_layernorm.weight", hidden);
    norm(at + "post_attention_layernorm.weight", hidden);
    matrix(at + "self_attn.q_proj.weight", heads * head_dim, hidden);
    matrix(at + "self_attn.k_proj.weight", kv_heads * head_dim, hidden);
    matrix(at + "self_attn.v_proj.weight", kv_heads * head_dim, hidden);
    matrix(at + "self_attn.o_proj.weight", hidden, heads * head_dim);
    if (qwen) {
      norm(at + "self_attn.q_norm.weight", head_dim);
      norm(at + "self_attn.k_norm.weight", head_dim);
    }
    matrix(at + "mlp.gate_proj.weight", inter, hidden);
    matrix(at + "mlp.up_proj.weight", inter, hidden);
    matrix(at + "mlp.down_proj.weight", hidden, inter);
  }
  norm("model.norm.weight", hidden);
  matrix("lm_head.weight", vocab, hidden);
  save_safetensors((dir / "model.safetensors").string(), tensors);
  return dir.string();
}

// The models the persistent step is tested on: two generated ones (3 layers, Qwen3 and Llama
// forms, 4,000 ids) and HK_DECODE_TEST_MODEL (gpu-test's random Qwen3-0.6B checkpoint) when set.
std::vector<std::string> persistent_step_models() {
  // written once, removed when the process ends (~110 MB each)
  static const struct Generated {
    std::vector<std::string> dirs = {write_persistent_step_model("qwen3", 3, 4000),
                                     write_persistent_step_model("llama", 3, 4000)};
    ~Generated() {
      std::error_code ignored;
      for (const std::string& d : dirs) fs::remove_all(d, ignored);
    }
  } generated;
  std::vector<std::string> out = generated.dirs;
  if (const char* dir = std::getenv("HK_DECODE_TEST_MODEL"); dir && *dir) out.push_back(dir);
  return out;
}

// Prefills `prompt` into `session`'s cache; the prompt's last logits, on the host.
std::vector<double> prefill(DecoderLM& lm, DecodeSession& session,
                            const std::vector<int64_t>& prompt) {
  const int64_t len = static_cast<int64_t>(prompt.size());
  ForwardOptions fwd;
  fwd.cache = &session.cache();
  fwd.logits_to_keep = 1;
  fwd.stream = session.stream();
  fwd.key_start = Tensor::from_ints({0}, {1}, DType::I64);
  Tensor logits = lm.forward(Tensor::from_ints(prompt, {1, len}), fwd).logits;
  return to_cpu(logits, session.stream()).to_doubles();
}

// A batch-1 session (no graphs, sampling logits) planned under HK_DECODE_PERSISTENT=`form`.
std::unique_ptr<DecodeSession> session_with(DecoderLM& lm, const char* form) {
  PersistentStepEnv env(form);
  std::string why;
  std::unique_ptr<DecodeSession> session =
      DecodeSession::create(lm, 1, 256, /*greedy=*/false, /*graphs=*/false, why);
  EXPECT_TRUE(session) << form << ": " << why;
  return session;
}

// Greedy ids checked teacher-forced against the kernel sequence's logits: each id's logit within
// 0.05·(1 + max|logit|) of its step's largest. Not the argmax itself — a random model's top logits
// sit within a bf16 step of each other — but an id the pick got wrong lands far below, about the
// top's distance from the mean. (The step-by-step test finds the two steps' logits within
// ~0.012·(1 + max|logit|), so a right pick is within about twice that.)
void expect_ids_near_the_sequence_argmax(DecoderLM& lm, const std::vector<int64_t>& prompt,
                                         const std::vector<int64_t>& ids) {
  std::unique_ptr<DecodeSession> sequence = session_with(lm, "0");
  ASSERT_TRUE(sequence);
  ASSERT_FALSE(ids.empty());
  const int64_t vocab = lm.config.vocab_size, len = static_cast<int64_t>(prompt.size());
  std::vector<double> logits = prefill(lm, *sequence, prompt);
  sequence->start({ids[0]}, {len}, len, {0}, {0}, {}, 0);
  for (size_t k = 0; k < ids.size(); ++k) {
    if (k > 0) {
      const float* step = sequence->sample_step({ids[k - 1]});
      logits.assign(step, step + vocab);
    }
    double top = -1e30, scale = 0;
    for (double v : logits) top = std::max(top, v), scale = std::max(scale, std::abs(v));
    ASSERT_TRUE(ids[k] >= 0 && ids[k] < vocab) << "step " << k << ": id " << ids[k];
    EXPECT_GE(logits[static_cast<size_t>(ids[k])], top - 0.05 * (1 + scale))
        << "step " << k << ": id " << ids[k];
  }
}

// Prefills `prompt` into the session's cache and starts it with the greedy id of the prefill's
// logits, which it returns.
std::vector<int64_t> start_after_prefill(DecoderLM& lm, DecodeSession& session,
                                         const std::vector<int64_t>& prompt) {
  const int64_t len = static_cast<int64_t>(prompt.size());
  const std::vector<double> logits = prefill(lm, session, prompt);
  const std::vector<int64_t> next = {
      static_cast<int64_t>(std::max_element(logits.begin(), logits.end()) - logits.begin())};
  session.start(next, {len}, len, {0}, {0}, {}, 0);
  return next;
}

// A started reference session and a candidate's step (`candidate(ids)`: its logits) fed the same
// ids (the reference's greedy pick) for `steps` steps, so their caches hold the same positions:
// each step's worst |logit diff| checked against the fused step's tolerance 0.06·(1 + max|logit|)
// — or against 0 (`same_bits`) — and the worst as a fraction of the tolerance returned.
template <class CandidateStep>
double worst_over_steps(DecodeSession& reference, CandidateStep&& candidate, int64_t vocab,
                        std::vector<int64_t> ids, int steps, const std::string& what,
                        bool same_bits = false) {
  double worst_ratio = 0;
  for (int step = 0; step < steps; ++step) {
    const float* a = reference.sample_step(ids);
    std::vector<float> want(a, a + vocab);
    const float* b = candidate(ids);
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      scale = std::max(scale, std::abs(double(want[i])));
      worst = std::max(worst, std::abs(double(b[i]) - want[i]));
    }
    const double tol = 0.06 * (1 + scale);
    if (same_bits)
      EXPECT_EQ(worst, 0.0) << what << " step " << step;
    else
      EXPECT_LE(worst, tol) << what << " step " << step << " (max |logit| " << scale << ")";
    worst_ratio = std::max(worst_ratio, worst / tol);
    ids = {static_cast<int64_t>(std::max_element(want.begin(), want.end()) - want.begin())};
  }
  return worst_ratio;
}

// The one-launch step against the kernel sequence, step by step over one prompt: logits within
// the fused step's tolerance at every step, in both accumulator forms.
TEST(PersistentStep, GivesTheLogitsOfTheKernelSequenceStepByStep) {
  HK_REQUIRE_REAL_CUDA();
  for (const std::string& dir : persistent_step_models()) {
    SCOPED_TRACE(name_of(dir));
    CausalLM model = load(dir, DType::BF16, {}, "sdpa");
    DecoderLM& lm = model.impl();
    const int64_t vocab = lm.config.vocab_size;
    const std::vector<int64_t> prompt = random_prompts(vocab, 1, 16, 16, 7)[0];
    for (const char* form : {"deterministic", "f32"}) {
      // a fresh pair a form: a prefill appends to what a session's cache already holds
      std::unique_ptr<DecodeSession> sequence = session_with(lm, "0");
      std::unique_ptr<DecodeSession> persistent = session_with(lm, form);
      ASSERT_TRUE(sequence && persistent);
      EXPECT_EQ(sequence->summary().find("persistent"), std::string::npos) << sequence->summary();
      ASSERT_NE(persistent->summary().find("one persistent launch"), std::string::npos)
          << form << ": " << persistent->summary();
      const std::vector<int64_t> ids = start_after_prefill(lm, *sequence, prompt);
      EXPECT_EQ(start_after_prefill(lm, *persistent, prompt), ids) << form;
      const double worst = worst_over_steps(
          *sequence, [&](const std::vector<int64_t>& in) { return persistent->sample_step(in); },
          vocab, ids, 12, form);
      std::printf(
          "[ persistent step ] %s %s: worst |logit diff| %.3g of the tolerance over 12 steps\n",
          name_of(dir).c_str(), form, worst);
    }
  }
}

// The measuring switches (read at each eager launch) against the default deterministic step, step
// by step: the lazy staging wait, the ring sized by the bucket, the ways of polling and counting
// the sums, their copies (integer sums), when the K/V copies are issued and gate's and up's
// products batched change no arithmetic, so the logits are the same bits; the products a warp a
// pair of chunks sum each row's columns in another order than the default's slices, and the rotated
// K reads each score's pieces in another order, so they are within the tolerance.
TEST(PersistentStep, MeasuringSwitchesGiveTheLogitsOfTheDefault) {
  HK_REQUIRE_REAL_CUDA();
  struct Switch {
    const char* name;
    const char* value;
    bool same_bits;
  };
  const Switch switches[] = {{"HK_DECODE_PERSISTENT_STAGING", "lazy", true},
                             {"HK_DECODE_PERSISTENT_RING", "bucket", true},
                             {"HK_DECODE_PERSISTENT_POLL", "all", true},
                             {"HK_DECODE_PERSISTENT_POLL", "sleep", true},
                             {"HK_DECODE_PERSISTENT_POLL", "incomplete", true},
                             {"HK_DECODE_PERSISTENT_COPIES", "4", true},
                             {"HK_DECODE_PERSISTENT_COUNT", "late", true},
                             {"HK_DECODE_PERSISTENT_KV_ISSUE", "after-norm", true},
                             {"HK_DECODE_PERSISTENT_COUNT_SLACK", "8", true},
                             {"HK_DECODE_PERSISTENT_B_WAIT", "counted", true},
                             {"HK_DECODE_PERSISTENT_PRODUCTS", "batched", true},
                             {"HK_DECODE_PERSISTENT_PRODUCTS", "pairs", false},
                             {"HK_DECODE_PERSISTENT_K_LAYOUT", "rotated", false}};
  for (const std::string& dir : persistent_step_models()) {
    SCOPED_TRACE(name_of(dir));
    CausalLM model = load(dir, DType::BF16, {}, "sdpa");
    DecoderLM& lm = model.impl();
    const int64_t vocab = lm.config.vocab_size;
    const std::vector<int64_t> prompt = random_prompts(vocab, 1, 16, 16, 11)[0];
    for (const Switch& sw : switches) {
      const std::string what = std::string(sw.name) + "=" + sw.value;
      std::unique_ptr<DecodeSession> reference = session_with(lm, "deterministic");
      std::unique_ptr<DecodeSession> candidate = session_with(lm, "deterministic");
      ASSERT_TRUE(reference && candidate);
      const std::vector<int64_t> ids = start_after_prefill(lm, *reference, prompt);
      EXPECT_EQ(start_after_prefill(lm, *candidate, prompt), ids) << what;
      const double worst = worst_over_steps(
          *reference,
          [&](const std::vector<int64_t>& in) {
            PersistentStepEnv on(sw.value, sw.name);
            return candidate->sample_step(in);  // the step has run: the switch was read
          },
          vocab, ids, 12, what, sw.same_bits);
      std::printf("[ persistent step ] %s %s: worst |logit diff| %.3g of the tolerance\n",
                  name_of(dir).c_str(), what.c_str(), worst);
    }
  }
}

// The deterministic form in generate: the CUDA graph decodes the ids of eager steps (with and
// without stop ids), and a model it does not fit decodes through the kernel sequence, saying why.
TEST(PersistentStep, GraphGivesTheIdsOfEagerStepsAndRefusalsSayWhy) {
  HK_REQUIRE_REAL_CUDA();
  PersistentStepEnv env("1");
  for (const std::string& dir : persistent_step_models()) {
    SCOPED_TRACE(name_of(dir));
    CausalLM model = load(dir, DType::BF16, {}, "sdpa");
    DecoderLM& lm = model.impl();
    auto prompts = random_prompts(model.config().vocab_size, 1, 16, 16, 3);
    GenerateOptions o{.max_new_tokens = 48, .eos_token_ids = std::vector<int64_t>{}};
    o.cuda_graphs = false;
    GenerateOutput eager = model.generate(prompts, o);
    EXPECT_EQ(eager.timings.decode_path, "device") << eager.timings.decode_note;
    EXPECT_NE(eager.timings.decode_note.find("one persistent launch"), std::string::npos)
        << eager.timings.decode_note;
    o.cuda_graphs = true;
    GenerateOutput graph = model.generate(prompts, o);
    EXPECT_EQ(graph.timings.decode_path, "cuda-graph") << graph.timings.decode_note;
    EXPECT_EQ(graph.sequences, eager.sequences);
    EXPECT_EQ(model.generate(prompts, o).sequences, eager.sequences) << "(replay)";
    expect_ids_near_the_sequence_argmax(lm, prompts[0], eager.sequences[0]);
    const std::vector<int64_t>& row = eager.sequences[0];
    o.eos_token_ids = std::vector<int64_t>{row[row.size() - 20]};
    auto stopped = model.generate(prompts, o).sequences;
    o.cuda_graphs = false;
    EXPECT_EQ(model.generate(prompts, o).sequences, stopped) << "(eos)";
    EXPECT_LE(stopped[0].size(), row.size() - 19);
    // HK_DECODE_PERSISTENT=0 plans the cached session again, as the kernel sequence (its ids
    // are not compared: random models' top logits sit within a bf16 step of each other)
    PersistentStepEnv off("0");
    o.eos_token_ids = std::vector<int64_t>{};
    GenerateOutput sequence = model.generate(prompts, o);
    EXPECT_EQ(sequence.timings.decode_note.find("persistent"), std::string::npos)
        << sequence.timings.decode_note;
    EXPECT_EQ(sequence.sequences[0].size(), row.size());
    // unset (the default): the deterministic step at batch 1, and no note at a batch it never
    // serves
    PersistentStepEnv unset("");
    GenerateOutput by_default = model.generate(prompts, o);
    EXPECT_NE(by_default.timings.decode_note.find("one persistent launch (deterministic"),
              std::string::npos)
        << by_default.timings.decode_note;
    EXPECT_EQ(by_default.sequences, eager.sequences);
    GenerateOutput two = model.generate(random_prompts(model.config().vocab_size, 2, 16, 16, 3), o);
    EXPECT_EQ(two.timings.decode_note.find("persistent"), std::string::npos)
        << two.timings.decode_note;
    // the profile build: the same ids, and its cycles a phase in the note
    PersistentStepEnv profile("1", "HK_DECODE_PERSISTENT_PROFILE");
    GenerateOutput profiled = model.generate(prompts, o);
    EXPECT_EQ(profiled.sequences, eager.sequences);
    EXPECT_NE(profiled.timings.decode_note.find("persistent profile ("), std::string::npos)
        << profiled.timings.decode_note;
  }
  CausalLM tiny = load(fixture("qwen3-tiny-bf16"), DType::BF16, {}, "sdpa");
  GenerateOptions o{.max_new_tokens = 8, .eos_token_ids = std::vector<int64_t>{}};
  GenerateOutput out = tiny.generate(random_prompts(tiny.config().vocab_size, 1, 5, 5, 1), o);
  EXPECT_EQ(out.timings.decode_path, "cuda-graph") << out.timings.decode_note;
  EXPECT_NE(out.timings.decode_note.find("persistent step not used: it serves hidden size 1024"),
            std::string::npos)
      << out.timings.decode_note;
}

}  // namespace
}  // namespace hk
