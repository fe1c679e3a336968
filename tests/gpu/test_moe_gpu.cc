// Qwen3-MoE and kernels-community/megablocks on CUDA (label gpu; scripts/gpu-test --moe):
//  - the cuda variant, with each kernel set of the expert GEMMs (mma.sync with both tile configs,
//    MEGABLOCKS_GEMM_TILE; the Hopper wgmma kernels, HK_MEGABLOCKS_GEMM=wgmma; the TMA kernels,
//    HK_MEGABLOCKS_GEMM=tma, bf16 only: in f16 they fall back to wgmma), against the cpu
//    variant on the same bf16 and f16 inputs (uneven routings: experts with 0 rows, 1 row, one
//    expert taking every row, group sizes that are no multiple of 64 or 128; shapes across every
//    tile edge of every kernel set): router logits, top-k ids and the expert-sorted gate_up
//    pre-activations bit for bit (inputs that make those GEMMs exact), top-k weights to a few f32
//    ulps (expf), y, dx and every weight gradient at 16-bit precision, experts without rows
//    getting exact zero gradients;
//  - at Qwen3-30B-A3B block shapes (H 2048, 128 experts, top-8, I 768), wgmma and tma (and mma at
//    the odd token count), against hk's built-in MoE block on CUDA (cuBLAS per expert);
//  - capture, mma, wgmma and tma: the forward and backward recorded into a CUDA graph replay bit
//    for bit; two backward calls give bit-identical gradients (no atomics);
//  - every kernel set: an infinity in one expert's rows stays out of the other experts' weight
//    gradients (the rows past an expert's end in a K-grouped GEMM's last k-tile);
//  - the tiny bf16 Qwen3-MoE model against Transformers in bf16 on cuda (tests/fixtures, made by
//    tools/fixtures/make_moe_fixtures.py --cuda): last-position logits, greedy ids, the training
//    loss with the router aux loss and the gradients, with the cuda variant and with the built-in
//    block; use_kernels binds megablocks on cuda by the default mapping and not for f32.
// Every check prints PASS/FAIL through gtest; scripts/gpu-test --moe summarises them.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>

#include <filesystem>
#include <random>

#include "common/cuda_graph_testing.h"
#include "golden/grad_fixture.h"
#include "gpu/gpu_testing.h"
#include "hk/hub.h"
#include "hk/kernel_loader.h"
#include "hk/kernelize.h"
#include "hk/layer_interfaces.h"
#include "hk/moe.h"
#include "hk/safetensors.h"
#include "unit/moe/moe_problems.h"

namespace hk {
namespace {

namespace fs = std::filesystem;
using testing::relative_error;

const std::string kMegablocks = "kernels-community/megablocks:MegaBlocksMoeMLP";

// The kernel sets of the expert GEMMs (the library reads the variables on every call).
struct GemmKernels {
  const char* name;
  const char* gemm;  // HK_MEGABLOCKS_GEMM
  const char* tile;  // MEGABLOCKS_GEMM_TILE (mma only)
};
constexpr GemmKernels kMma{"mma 128x128", "mma", "128x128"};
constexpr GemmKernels kMmaWide{"mma 128x256", "mma", "128x256"};
constexpr GemmKernels kWgmma{"wgmma", "wgmma", "128x128"};
constexpr GemmKernels kTma{"tma", "tma", "128x128"};  // TMA kernels in bf16 (f16: the wgmma ones)

// Selects a kernel set for its lifetime.
class UseGemm {
 public:
  explicit UseGemm(const GemmKernels& k) {
    setenv("HK_MEGABLOCKS_GEMM", k.gemm, 1);
    setenv("MEGABLOCKS_GEMM_TILE", k.tile, 1);
  }
  ~UseGemm() {
    unsetenv("HK_MEGABLOCKS_GEMM");
    unsetenv("MEGABLOCKS_GEMM_TILE");
  }
};

class MoeGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    HK_REQUIRE_REAL_CUDA();
    unsetenv("USE_HUB_KERNELS");
    cache_ = fs::temp_directory_path() / ("hk-moe-gpu-cache-" + std::to_string(getpid()));
  }
  void TearDown() override { fs::remove_all(cache_); }
  std::shared_ptr<hub::Hub> hub() {
    return testing::local_hub(testing::build_dir() / "hub", cache_);
  }
  // Binds megablocks to every MoeMLP under `root`; the report must show it bound.
  void bind_megablocks(nn::Module& root, Device device, DType dtype, Mode mode) {
    KernelizeOptions o{.device = device,
                       .dtype = dtype,
                       .config = KernelConfig{{{"MoeMLP", KernelMappingValue(kMegablocks)}}}};
    o.config.inherit_mapping = false;
    o.hub = hub();
    KernelizeReport r = kernelize(root, mode, o);
    for (const LayerDecision& d : r.layers)
      if (d.layer == "MoeMLP") ASSERT_EQ(d.kernel, kMegablocks) << d.path << ": " << d.reason;
  }
  void capture_and_compare();  // the capture test with the kernel set of the environment
  KernelFunction cuda_entry() {
    auto h = hub();
    hub::Resolution res = h->resolve(kMegablocks, hub::Target::for_device(Device::cuda(0)));
    std::shared_ptr<const KernelLibrary> lib = h->load(res);
    return lib->function("MegaBlocksMoeMLP");
  }
  fs::path cache_;
};

// ---- block problems --------------------------------------------------------------------------

using Problem = test::MoeProblem;

// A problem's inputs as host f32 tensors (values exact in bf16; see moe_problems.h).
struct Block {
  Problem s;
  Tensor x, wr, wgu, wd, dy;
};

Block make_block(const Problem& s, uint64_t seed) {
  const test::MoeProblemValues v = test::moe_problem_values(s, static_cast<uint32_t>(seed));
  return {s,
          Tensor::from_floats(v.x, {s.T, s.H}),
          Tensor::from_floats(v.wr, {s.E, s.H}),
          Tensor::from_floats(v.wgu, {s.E, 2 * s.I, s.H}),
          Tensor::from_floats(v.wd, {s.E, s.H, s.I}),
          Tensor::from_floats(v.dy, {s.T, s.H})};
}

Tensor on(const Tensor& host, Device d, DType dt) {
  Tensor c = Tensor::empty(host.sizes(), dt);
  ops::cast(host, c);
  return d.is_cpu() ? c : c.to(d);
}

std::shared_ptr<nn::MoeMLP> make_module(const Block& b, Device d, DType dt) {
  auto m = std::make_shared<nn::MoeMLP>(
      nn::MoeShape{b.s.H, b.s.E, b.s.k, b.s.I, b.s.norm, "silu", "Qwen3Moe"});
  nn::LoadStateOptions lo;
  lo.device = d;
  lo.dtype = dt;
  nn::load_state_dict(
      *m,
      nn::TensorMapSource(
          {{"gate.weight", b.wr}, {"experts.gate_up_proj", b.wgu}, {"experts.down_proj", b.wd}}),
      lo);
  return m;
}

struct Outcome {
  std::vector<double> y, logits, dx, dwr, dgu, dwd, gate_up, weights;
  std::vector<int64_t> ids;
};

std::vector<double> host(const Tensor& t) {
  return testing::host_values(t);
}

// forward_train + backward of `m` on the block's inputs; the megablocks context's saved state
// (ids, weights, gate_up) when `saved`.
Outcome run(nn::MoeMLP& m, const Block& b, Device d, DType dt, bool saved) {
  m.train();
  const Tensor x = on(b.x, d, dt), dy = on(b.dy, d, dt);
  Tensor y = Tensor::empty(x.sizes(), dt, d), logits = Tensor::empty({b.s.T, b.s.E}, dt, d);
  nn::LayerContext ctx;
  m.forward_train(x, y, logits, ctx);
  Outcome r;
  r.y = host(y);
  r.logits = host(logits);
  if (saved) {
    r.ids = ctx.saved("topk_ids").to(Device::cpu()).to_int64s();
    r.weights = host(ctx.saved("topk_weights"));
    r.gate_up = host(ctx.saved("gate_up"));
  }
  Tensor dx = Tensor::empty(x.sizes(), dt, d);
  m.backward(x, ctx, dy, nullptr, dx);
  synchronize(d);
  r.dx = host(dx);
  r.dwr = host(m.gate->slot("weight").grad);
  r.dgu = host(m.experts->slot("gate_up_proj").grad);
  r.dwd = host(m.experts->slot("down_proj").grad);
  return r;
}

void expect_close(const Outcome& got, const Outcome& want, double tol, const std::string& what) {
  EXPECT_LE(relative_error(got.y, want.y), tol) << what << ": y";
  EXPECT_LE(relative_error(got.dx, want.dx), tol) << what << ": dx";
  EXPECT_LE(relative_error(got.dwr, want.dwr), tol) << what << ": d router_w";
  EXPECT_LE(relative_error(got.dgu, want.dgu), tol) << what << ": d gate_up_w";
  EXPECT_LE(relative_error(got.dwd, want.dwd), tol) << what << ": d down_w";
}

TEST_F(MoeGpu, CudaVariantMatchesTheCpuVariant) {
  for (const Problem& s : test::kMoeProblems)
    for (DType dt : {DType::BF16, DType::F16}) {
      // f16 on the cases that cross tile edges and leave experts empty (the cpu reference is
      // single-threaded)
      const std::string name = s.name;
      if (dt == DType::F16 && name != "random" && name != "dead_experts" && name != "tile_edges" &&
          name != "wgmma_edges")
        continue;
      const Block b = make_block(s, 11);
      auto cpu = make_module(b, Device::cpu(), dt);
      bind_megablocks(*cpu, Device::cpu(), dt, Mode::Training);
      const Outcome want = run(*cpu, b, Device::cpu(), dt, true);
      for (const GemmKernels& kernels : {kMma, kMmaWide, kWgmma, kTma}) {
        SCOPED_TRACE(std::string(s.name) + ", " + dtype_name(dt) + ", " + kernels.name);
        const UseGemm use(kernels);
        auto gpu = make_module(b, Device::cuda(0), dt);
        bind_megablocks(*gpu, Device::cuda(0), dt, Mode::Training);
        const Outcome got = run(*gpu, b, Device::cuda(0), dt, true);
        EXPECT_EQ(got.logits, want.logits) << "router logits";
        EXPECT_EQ(got.ids, want.ids) << "top-k ids";
        // The weights go through expf, whose last bit differs between the device and the host.
        ASSERT_EQ(got.weights.size(), want.weights.size());
        for (size_t i = 0; i < got.weights.size(); ++i)
          ASSERT_NEAR(got.weights[i], want.weights[i], 2e-6 * std::abs(want.weights[i])) << i;
        EXPECT_EQ(got.gate_up, want.gate_up) << "gate_up pre-activations, expert order";
        expect_close(got, want, dt == DType::BF16 ? 1e-2 : 2e-3, "cuda vs cpu variant");
        // Experts without rows: exact zero weight gradients (the K-grouped GEMMs' empty groups).
        std::vector<int64_t> rows(s.E, 0);
        for (int64_t e : got.ids) ++rows[e];
        for (int64_t e = 0; e < s.E; ++e) {
          if (rows[e]) continue;
          const int64_t gu = 2 * s.I * s.H, d = s.H * s.I;
          for (int64_t i = 0; i < gu; ++i) ASSERT_EQ(got.dgu[e * gu + i], 0.0) << "expert " << e;
          for (int64_t i = 0; i < d; ++i) ASSERT_EQ(got.dwd[e * d + i], 0.0) << "expert " << e;
        }
      }
    }
}

// Qwen3-30B-A3B's MoE block (H 2048, E 128, top-8, I 768), megablocks against the built-in block
// on cuda; 4096 tokens and an odd count.
TEST_F(MoeGpu, CudaVariantMatchesTheBuiltinAtQwen3_30B_A3BShapes) {
  for (int64_t tokens : {4096, 1531}) {
    const Block b = make_block({"30b", tokens, 128, 8, 2048, 768, true, 0}, 5);
    auto builtin = make_module(b, Device::cuda(0), DType::BF16);
    const Outcome want = run(*builtin, b, Device::cuda(0), DType::BF16, false);
    // (each run moves ~600 M gradient values to the host: mma, unchanged, on the odd count only)
    const std::vector<GemmKernels> sets = tokens == 4096
                                              ? std::vector<GemmKernels>{kWgmma, kTma}
                                              : std::vector<GemmKernels>{kMma, kWgmma, kTma};
    for (const GemmKernels& kernels : sets) {
      SCOPED_TRACE("tokens " + std::to_string(tokens) + ", " + kernels.name);
      const UseGemm use(kernels);
      auto kernel = make_module(b, Device::cuda(0), DType::BF16);
      bind_megablocks(*kernel, Device::cuda(0), DType::BF16, Mode::Training);
      const Outcome got = run(*kernel, b, Device::cuda(0), DType::BF16, true);
      EXPECT_EQ(got.logits, want.logits) << "router logits (exact inputs)";
      expect_close(got, want, 2e-2, "megablocks vs built-in");
    }
  }
}

// Rows past an expert's end inside a weight-gradient GEMM's last k-tile hold the next expert's
// rows: they must add nothing, whatever they hold. dy of the token owning the next expert's first
// sorted row set to infinity: that expert's gradients (and the router's) are not finite, and every
// expert the token is not routed to keeps gradients bit-identical to a run with finite dy (an
// operand left unzeroed there would add 0 · inf = NaN to the expert before).
TEST_F(MoeGpu, AnInfinityInOneExpertsRowsStaysOutOfTheOthersWeightGradients) {
  const Problem s{"inf_rows", 300, 4, 1, 264, 72, false, 0};
  for (const GemmKernels& kernels : {kMma, kMmaWide, kWgmma, kTma}) {
    SCOPED_TRACE(kernels.name);
    const UseGemm use(kernels);
    Block b = make_block(s, 17);
    auto gpu = [&](const Block& blk) {
      auto m = make_module(blk, Device::cuda(0), DType::BF16);
      bind_megablocks(*m, Device::cuda(0), DType::BF16, Mode::Training);
      return run(*m, blk, Device::cuda(0), DType::BF16, true);
    };
    const Outcome finite = gpu(b);
    // The canonical sorted order: expert ascending, then assignment t·k + j.
    std::vector<int64_t> rows(s.E, 0), first(s.E, -1);
    for (int64_t a = 0; a < s.T * s.k; ++a) {
      const int64_t e = finite.ids[a];
      if (first[e] < 0) first[e] = a;
      ++rows[e];
    }
    int64_t before = -1, next = -1;  // an expert whose rows end inside a k-tile, the next with rows
    for (int64_t e = 0; e < s.E && next < 0; ++e) {
      if (rows[e] % 64 == 0) continue;
      for (int64_t f = e + 1; f < s.E; ++f)
        if (rows[f] > 0) {
          before = e, next = f;
          break;
        }
    }
    ASSERT_GE(next, 0) << "the routing left no expert whose rows end inside a k-tile";
    const int64_t token = first[next] / s.k;
    std::vector<float> dy = test::moe_problem_values(s, 17).dy;  // (make_block's values)
    for (int64_t h = 0; h < s.H; ++h) dy[token * s.H + h] = INFINITY;
    b.dy = Tensor::from_floats(dy, {s.T, s.H});
    const Outcome inf = gpu(b);

    std::vector<bool> routed(s.E, false);
    for (int64_t j = 0; j < s.k; ++j) routed[inf.ids[token * s.k + j]] = true;
    ASSERT_FALSE(routed[before]);
    const int64_t gu = 2 * s.I * s.H, d = s.H * s.I;
    int64_t next_finite = 0;
    for (int64_t i = 0; i < gu; ++i) next_finite += std::isfinite(inf.dgu[next * gu + i]);
    EXPECT_LT(next_finite, gu) << "expert " << next << " took the infinite row";
    for (int64_t e = 0; e < s.E; ++e) {
      if (routed[e]) continue;
      int64_t differ = 0;
      for (int64_t i = 0; i < gu; ++i) differ += inf.dgu[e * gu + i] != finite.dgu[e * gu + i];
      for (int64_t i = 0; i < d; ++i) differ += inf.dwd[e * d + i] != finite.dwd[e * d + i];
      EXPECT_EQ(differ, 0) << "expert " << e << (e == before ? " (the one before)" : "")
                           << ": weight-gradient values that differ from the finite run";
    }
  }
}

// The capture claim: forward and backward recorded into one CUDA graph (workspace preallocated)
// replay bit for bit; and a second eager backward gives the same bits (deterministic).
TEST_F(MoeGpu, CaptureReplaysBitForBitAndBackwardIsDeterministic) {
  for (const GemmKernels& kernels : {kMma, kWgmma, kTma}) {
    SCOPED_TRACE(kernels.name);
    const UseGemm use(kernels);
    capture_and_compare();
  }
}

void MoeGpu::capture_and_compare() {
  const Block b = make_block({"capture", 777, 32, 4, 1024, 256, true, 0}, 3);
  const Device d = Device::cuda(0);
  const DType dt = DType::BF16;
  KernelFunction fn = cuda_entry();
  const Tensor x = on(b.x, d, dt), wr = on(b.wr, d, dt), wgu = on(b.wgu, d, dt),
               wd = on(b.wd, d, dt), dy = on(b.dy, d, dt);
  const int64_t T = b.s.T, E = b.s.E, k = b.s.k, H = b.s.H, I = b.s.I;
  Tensor y = Tensor::empty({T, H}, dt, d), logits = Tensor::empty({T, E}, dt, d);
  Tensor ids = Tensor::empty({T, k}, DType::I32, d), w = Tensor::empty({T, k}, DType::F32, d);
  Tensor gu = Tensor::empty({T * k, 2 * I}, dt, d), dx = Tensor::empty({T, H}, dt, d);
  Tensor dwr = Tensor::empty({E, H}, dt, d), dgu = Tensor::empty({E, 2 * I, H}, dt, d),
         dwd = Tensor::empty({E, H, I}, dt, d);
  MoeMlpAttrs attrs;
  attrs.top_k = static_cast<int32_t>(k);
  attrs.norm_topk_prob = 1;
  const std::vector<TensorView> fin{x, wr, wgu, wd}, fout{y, logits, ids, w, gu};
  const std::vector<TensorView> bin{dy, x, wr, wgu, wd, logits, ids, w, gu},
      bout{dx, dwr, dgu, dwd};
  const size_t ws = std::max(fn.workspace_size(false, fin, fout, &attrs, sizeof attrs),
                             fn.workspace_size(true, bin, bout, &attrs, sizeof attrs));
  Tensor workspace = Tensor::empty({static_cast<int64_t>(ws)}, DType::U8, d);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  KernelCallOptions o;
  o.stream.handle = stream;
  o.workspace = workspace.view().ptr();
  o.workspace_size = ws;
  auto step = [&] {
    fn.forward(fin, fout, attrs, o);
    fn.backward(bin, bout, attrs, o);
  };
  auto outputs = [&] {
    return std::vector<std::vector<double>>{host(y),   host(logits), host(gu), host(dx),
                                            host(dwr), host(dgu),    host(dwd)};
  };
  step();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const auto eager = outputs();
  step();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(outputs(), eager) << "a second eager forward + backward differs: not deterministic";
  for (const Tensor* t : {&y, &logits, &gu, &dx, &dwr, &dgu, &dwd})
    ASSERT_EQ(cudaMemset(t->view().ptr(), 0xff, t->nbytes()), cudaSuccess);
  ASSERT_NO_FATAL_FAILURE(testing::capture_and_replay(stream, step));
  const auto replay = outputs();
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_EQ(replay[i], eager[i]) << "output " << i;
  cudaStreamDestroy(stream);
}

// ---- the tiny bf16 model against Transformers bf16 on cuda
// ---------------------------------------

constexpr const char* kBf16Model = "qwen3-moe-tiny-bf16";

class MoeModelGpu : public MoeGpu, public ::testing::WithParamInterface<bool> {
 protected:
  CausalLM load(DType dtype, Mode mode) {
    CausalLM model = AutoModelForCausalLM::from_pretrained(testing::model_fixture(kBf16Model),
                                                           {.device = "cuda", .dtype = dtype});
    if (GetParam()) bind_megablocks(model.module(), model.device(), dtype, mode);
    return model;
  }
};

TEST_P(MoeModelGpu, Bf16LogitsAndGreedyIdsMatchTransformers) {
  const std::string dir = testing::model_fixture(kBf16Model);
  auto expected = testing::read_json(dir + "/expected.json");
  auto ref = SafetensorsFile::open(dir + "/expected.safetensors");
  CausalLM model = load(DType::BF16, Mode::Inference);
  for (size_t i = 0; i < expected["prompts"].size(); ++i) {
    auto ids = expected["prompts"][i]["ids"].get<std::vector<int64_t>>();
    Tensor input = Tensor::from_ints(ids, {1, static_cast<int64_t>(ids.size())});
    std::vector<double> got =
        host(model.forward(input, ForwardOptions{.logits_to_keep = 1}).logits);
    std::vector<double> want =
        ref.load("logits.bf16." + std::to_string(i), Device::cpu(), DType::F32).to_doubles();
    ASSERT_EQ(got.size(), want.size());
    double scale = 0;
    for (double v : want) scale = std::max(scale, std::abs(v));
    for (size_t j = 0; j < got.size(); ++j)
      ASSERT_NEAR(got[j], want[j], 0.02 + 0.02 * scale)
          << "prompt " << i << " id " << j << " (reference made on "
          << expected["bf16_device"].get<std::string>() << ")";
  }
  // Greedy ids, teacher-forced: a bf16 model on another device (the reference may come from
  // Transformers on cpu) can meet a near-tie where the two argmaxes differ and the continuations
  // part for good. So each of Transformers' tokens must be hk's argmax after Transformers' own
  // prefix, or within the logit tolerance above of hk's top logit.
  for (size_t i = 0; i < expected["prompts"].size(); ++i) {
    // the prompt, then Transformers' new tokens (the fixture holds the new tokens only)
    auto want = expected["prompts"][i]["ids"].get<std::vector<int64_t>>();
    const size_t prompt_size = want.size();
    for (int64_t id : expected["greedy_bf16"][i].get<std::vector<int64_t>>()) want.push_back(id);
    ASSERT_GT(want.size(), prompt_size);
    for (size_t t = prompt_size; t < want.size(); ++t) {
      std::vector<int64_t> prefix(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(t));
      Tensor input = Tensor::from_ints(prefix, {1, static_cast<int64_t>(prefix.size())});
      std::vector<double> logits =
          host(model.forward(input, ForwardOptions{.logits_to_keep = 1}).logits);
      const size_t top =
          static_cast<size_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      double scale = 0;
      for (double v : logits) scale = std::max(scale, std::abs(v));
      const double gap = logits[top] - logits.at(static_cast<size_t>(want[t]));
      EXPECT_LE(gap, 0.02 + 0.02 * scale)
          << "prompt " << i << " position " << t << ": Transformers chose " << want[t]
          << ", hk's argmax is " << top << " (" << gap << " higher)";
    }
  }
  // And generate() follows the argmax of the same forward (no cache or sampling drift).
  GenerateOptions options{.max_new_tokens = expected["max_new_tokens"].get<int64_t>()};
  for (size_t i = 0; i < expected["prompts"].size(); ++i) {
    auto ids = expected["prompts"][i]["ids"].get<std::vector<int64_t>>();
    std::vector<int64_t> got = ids;  // the prompt, then generate()'s new tokens
    const GenerateOutput out = model.generate(ids, options);  // kept: the loop reads into it
    for (int64_t id : out.sequences.at(0)) got.push_back(id);
    ASSERT_GT(got.size(), ids.size());
    for (size_t t = ids.size(); t < got.size(); ++t) {
      Tensor input = Tensor::from_ints(std::vector<int64_t>(got.begin(), got.begin() + t),
                                       {1, static_cast<int64_t>(t)});
      std::vector<double> logits =
          host(model.forward(input, ForwardOptions{.logits_to_keep = 1}).logits);
      const double top = *std::max_element(logits.begin(), logits.end());
      EXPECT_LE(top - logits.at(static_cast<size_t>(got[t])), 1e-3 * std::max(1.0, std::abs(top)))
          << "prompt " << i << " position " << t << ": generate() chose " << got[t]
          << ", not the forward's argmax";
    }
  }
}

// As tests/gpu/test_training_gpu.cc: the loss to 1 %, each gradient within max(3 %, 2 × the
// distance between Transformers' own bf16 and f32 gradients) of both.
TEST_P(MoeModelGpu, Bf16TrainingWithAuxLossMatchesTransformers) {
  testing::GradFixture f = testing::GradFixture::open(kBf16Model, ".bf16");
  CausalLM model = load(DType::BF16, Mode::Training);
  model.train();
  ForwardOptions o{.key_start = f.key_start, .labels = f.labels};
  o.output_router_logits = true;
  CausalLMOutput out = model.forward(f.input_ids, o);
  out.loss.backward();
  synchronize(model.device());
  const double loss = host(out.loss).at(0);
  EXPECT_LE(std::abs(loss - f.loss()) / std::abs(f.loss()), 1e-2) << loss << " vs " << f.loss();
  EXPECT_LE(std::abs(host(out.aux_loss).at(0) - f.loss("aux_loss")), 2e-2 * f.loss("aux_loss"));
  size_t compared = 0;
  for (auto& [name, p] : model.named_parameters()) {
    if (!f.has("grad." + name)) continue;
    ASSERT_TRUE(p->grad.defined()) << name;
    const std::vector<double> got = host(p->grad), want = f.values("grad." + name),
                              exact = f.values("grad_f32." + name);
    const double tol = std::max(3e-2, 2 * relative_error(want, exact));
    EXPECT_LE(relative_error(got, want), tol) << name << " vs Transformers bf16";
    EXPECT_LE(relative_error(got, exact), tol) << name << " vs Transformers f32";
    ++compared;
  }
  EXPECT_GE(compared, 8u);
}

INSTANTIATE_TEST_SUITE_P(Impl, MoeModelGpu, ::testing::Bool(), [](const auto& info) {
  return std::string(info.param ? "megablocks" : "builtin");
});

TEST_F(MoeGpu, UseKernelsBindsMegablocksOnCudaInBf16Only) {
  setenv("HK_KERNELS_CACHE", cache_.c_str(), 1);
  const std::string dir = testing::model_fixture(kBf16Model);
  CausalLM bf16 = AutoModelForCausalLM::from_pretrained(
      dir, {.device = "cuda", .dtype = DType::BF16, .use_kernels = true});
  const LayerDecision* d = bf16.kernelize_report()->find("model.layers.1.mlp");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->kernel, "kernels-community/megablocks:MegaBlocksMoeMLP") << d->reason;
  CausalLM f32 = AutoModelForCausalLM::from_pretrained(
      dir, {.device = "cuda", .dtype = DType::F32, .use_kernels = true});
  d = f32.kernelize_report()->find("model.layers.1.mlp");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->kernel, "");
  EXPECT_NE(d->reason.find("f32"), std::string::npos) << d->reason;
  // f32 on cuda runs the built-in block: Transformers' f32 logits to 1e-4.
  auto expected = testing::read_json(dir + "/expected.json");
  auto ref = SafetensorsFile::open(dir + "/expected.safetensors");
  auto ids = expected["prompts"][0]["ids"].get<std::vector<int64_t>>();
  Tensor input = Tensor::from_ints(ids, {1, static_cast<int64_t>(ids.size())});
  const int64_t keep = expected["logits_positions"].get<int64_t>();
  std::vector<double> got = host(f32.forward(input, ForwardOptions{.logits_to_keep = keep}).logits);
  std::vector<double> want = ref.load("logits.f32.0", Device::cpu(), DType::F32).to_doubles();
  double worst = 0;
  for (size_t j = 0; j < got.size(); ++j) worst = std::max(worst, std::abs(got[j] - want[j]));
  EXPECT_LE(worst, 1e-4);
  unsetenv("HK_KERNELS_CACHE");
}

}  // namespace
}  // namespace hk
