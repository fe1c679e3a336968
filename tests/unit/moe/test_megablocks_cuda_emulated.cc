// The cuda variant of kernels-community/megablocks run on an emulated device (device_emulation.h)
// against its cpu variant, on the CPU: forward (router logits, routing, the expert-sorted gate_up
// pre-activations, y) and backward (dx and every weight gradient, with and without accumulation
// and drouter_logits), bf16 and f16, over uneven routings and shapes that cross every tile edge
// (rows of one expert over two M tiles, K and N tails). It checks the logic of the cuda sources —
// tile walks, the device permutation, ldmatrix/mma fragment layouts, epilogues, workspace — not
// their speed or anything only hardware shows; the GPU tests (tests/gpu/test_moe_gpu.cc) do that.
//
// Inputs are chosen so the router logits and the gate_up pre-activations are exact in f32 (small
// multiples of powers of two): both variants then route identically and those outputs must be
// bit-identical; the rest is compared norm-wise at 16-bit precision.
#define MEGABLOCKS_DEVICE_EMULATION "unit/moe/device_emulation.h"
#include "../../../kernels/megablocks/src/cuda/moe_cuda.cu"
#undef threadIdx
#undef blockIdx
#undef gridDim
#undef blockDim

#define HK_KERNEL_REPO "kernels-community/megablocks"
#define HK_KERNEL_VERSION "test"
#define HK_KERNEL_BUILD_ID "emulation-test"
#include "../../../kernels/megablocks/src/cpu/moe_cpu.cc"

#include <gtest/gtest.h>

#include <random>

#include "hk/tensor.h"
#include "unit/moe/moe_problems.h"

namespace megablocks {
namespace {

using Case = hk::test::MoeProblem;

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

// An hk_tensor over host memory (the emulated device's memory is the host's).
hk_tensor view_of(void* data, const std::vector<int64_t>& shape,
                  const std::vector<int64_t>& strides, int32_t dtype, int32_t device) {
  hk_tensor t{};
  t.data = data;
  t.device_type = device;
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  t.shape = shape.data();
  t.strides = strides.data();
  return t;
}

// A host "device" tensor of 16-bit values given as floats, with its hk_tensor.
struct Buf {
  std::vector<uint16_t> bits;
  std::vector<int64_t> shape, strides;
  int32_t dtype;
  Buf(std::vector<int64_t> s, int32_t dt, const std::vector<float>& values = {})
      : shape(s), dtype(dt) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    strides.assign(shape.size(), 1);
    for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d)
      strides[d] = strides[d + 1] * shape[d + 1];
    bits.assign(static_cast<size_t>(n), 0);
    for (size_t i = 0; i < values.size(); ++i) set(i, values[i]);
  }
  void set(size_t i, float v) {
    if (dtype == HK_DTYPE_BF16) {
      bits[i] = hk::float_to_bf16(v).bits;
    } else {
      _Float16 h = static_cast<_Float16>(v);
      std::memcpy(&bits[i], &h, 2);
    }
  }
  float get(size_t i) const {
    if (dtype == HK_DTYPE_BF16) return hk::bf16_to_float(hk::bf16_t{bits[i]});
    _Float16 h;
    std::memcpy(&h, &bits[i], 2);
    return static_cast<float>(h);
  }
  std::vector<float> values() const {
    std::vector<float> v(bits.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = get(i);
    return v;
  }
  hk_tensor tensor(int32_t device) const {
    return view_of(const_cast<uint16_t*>(bits.data()), shape, strides, dtype, device);
  }
};

// A tensor over `data`; `shape` and `strides` are kept by the caller (the tensor points at them).
template <class V>
hk_tensor raw_tensor(std::vector<V>& data, std::vector<int64_t>& shape,
                     std::vector<int64_t>& strides, int32_t dtype, int32_t device) {
  strides.assign(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d)
    strides[d] = strides[d + 1] * shape[d + 1];
  return view_of(data.data(), shape, strides, dtype, device);
}

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * static_cast<double>(got[i] - want[i]);
    den += want[i] * static_cast<double>(want[i]);
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Everything one variant produces for a case.
struct Outputs {
  std::vector<float> y, logits, gate_up, dx, dwr, dgu, dwd;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// (case, dtype, N extent of the expert GEMM tiles: 128, or 256 via MEGABLOCKS_GEMM_TILE)
class EmulatedCuda : public ::testing::TestWithParam<std::tuple<Case, int32_t, int>> {
 protected:
  void SetUp() override {
    const Case& c = std::get<0>(GetParam());
    dtype_ = std::get<1>(GetParam());
    if (std::get<2>(GetParam()) == 256)
      setenv("MEGABLOCKS_GEMM_TILE", "128x256", 1);
    else
      unsetenv("MEGABLOCKS_GEMM_TILE");
    const hk::test::MoeProblemValues v = hk::test::moe_problem_values(c, 1234);
    const std::vector<float>&x = v.x, &wr = v.wr, &wgu = v.wgu, &wd = v.wd, &dy = v.dy;
    x_ = std::make_unique<Buf>(std::vector<int64_t>{c.T, c.H}, dtype_, x);
    wr_ = std::make_unique<Buf>(std::vector<int64_t>{c.E, c.H}, dtype_, wr);
    wgu_ = std::make_unique<Buf>(std::vector<int64_t>{c.E, 2 * c.I, c.H}, dtype_, wgu);
    wd_ = std::make_unique<Buf>(std::vector<int64_t>{c.E, c.H, c.I}, dtype_, wd);
    dy_ = std::make_unique<Buf>(std::vector<int64_t>{c.T, c.H}, dtype_, dy);
    drouter_ = v.drouter;
  }

  // One forward + backward through `fwd` / `bwd` (the C entry points of one variant).
  Outputs run(hk_kernel_fn fwd, hk_kernel_fn bwd, hk_workspace_fn ws, int32_t device,
              bool accumulate_twice, bool with_drouter) {
    const Case& c = std::get<0>(GetParam());
    Buf y({c.T, c.H}, dtype_), logits({c.T, c.E}, dtype_), gate_up({c.T * c.k, 2 * c.I}, dtype_);
    std::vector<int32_t> ids(c.T * c.k, -7);
    std::vector<float> weights(c.T * c.k, -1.0f);
    std::vector<int64_t> s_ids, s_w, shape_k{c.T, c.k}, shape_e{c.T, c.E};
    hk::MoeMlpAttrs attrs;
    attrs.top_k = static_cast<int32_t>(c.k);
    attrs.norm_topk_prob = c.norm;
    hk_tensor in[4] = {x_->tensor(device), wr_->tensor(device), wgu_->tensor(device),
                       wd_->tensor(device)};
    hk_tensor out[5] = {y.tensor(device), logits.tensor(device),
                        raw_tensor(ids, shape_k, s_ids, HK_DTYPE_I32, device),
                        raw_tensor(weights, shape_k, s_w, HK_DTYPE_F32, device),
                        gate_up.tensor(device)};
    std::vector<char> workspace;
    char message[512] = {};
    auto call_of = [&](const hk_tensor* i, int ni, const hk_tensor* o, int no, const void* a) {
      hk_call call{};
      call.struct_size = sizeof(hk_call);
      call.inputs = i;
      call.num_inputs = ni;
      call.outputs = o;
      call.num_outputs = no;
      call.attrs = a;
      call.attrs_size = sizeof(attrs);
      call.error_message = message;
      call.error_message_size = sizeof message;
      return call;
    };
    auto with_workspace = [&](hk_call& call, uint32_t pass) {
      if (!ws) return;
      size_t bytes = 0;
      EXPECT_EQ(ws(&call, pass, &bytes), HK_STATUS_OK) << message;
      workspace.assign(bytes, 0);
      call.workspace = workspace.data();
      call.workspace_size = bytes;
    };
    hk_call f = call_of(in, 4, out, 5, &attrs);
    with_workspace(f, HK_PASS_FORWARD);
    EXPECT_EQ(fwd(&f), HK_STATUS_OK) << message;

    Buf dx({c.T, c.H}, dtype_), dwr({c.E, c.H}, dtype_), dgu({c.E, 2 * c.I, c.H}, dtype_),
        dwd({c.E, c.H, c.I}, dtype_);
    std::vector<int64_t> s_dr;
    std::vector<float> drouter = drouter_;
    hk_tensor bin[10] = {dy_->tensor(device),
                         in[0],
                         in[1],
                         in[2],
                         in[3],
                         out[1],
                         out[2],
                         out[3],
                         out[4],
                         raw_tensor(drouter, shape_e, s_dr, HK_DTYPE_F32, device)};
    hk_tensor bout[4] = {dx.tensor(device), dwr.tensor(device), dgu.tensor(device),
                         dwd.tensor(device)};
    for (int pass = 0; pass < (accumulate_twice ? 2 : 1); ++pass) {
      attrs.flags = pass ? hk::kAccumulateWeightGrads : 0u;
      hk_call b = call_of(bin, with_drouter ? 10 : 9, bout, 4, &attrs);
      with_workspace(b, HK_PASS_BACKWARD);
      EXPECT_EQ(bwd(&b), HK_STATUS_OK) << message;
    }
    return {y.values(),   logits.values(), gate_up.values(), dx.values(),
            dwr.values(), dgu.values(),    dwd.values(),     ids,
            weights};
  }

  int32_t dtype_ = HK_DTYPE_BF16;
  std::unique_ptr<Buf> x_, wr_, wgu_, wd_, dy_;
  std::vector<float> drouter_;
  void TearDown() override { unsetenv("MEGABLOCKS_GEMM_TILE"); }
};

TEST_P(EmulatedCuda, MatchesTheCpuVariant) {
  const Case& c = std::get<0>(GetParam());
  for (bool twice : {false, true}) {
    SCOPED_TRACE(twice ? "weight gradients accumulated over two backward calls" : "one backward");
    const Outputs want = run(kEntries[0].forward, kEntries[0].backward, nullptr, HK_DEVICE_CPU,
                             twice, /*with_drouter=*/c.T > 1);
    const Outputs got =
        run(hk::sdk::entry_point<cuda::forward>, hk::sdk::entry_point<cuda::backward>,
            hk::sdk::workspace_point<cuda::workspace>, HK_DEVICE_CUDA, twice, c.T > 1);
    EXPECT_EQ(got.logits, want.logits) << "router logits (exact inputs)";
    EXPECT_EQ(got.ids, want.ids) << "top-k ids";
    EXPECT_EQ(got.weights, want.weights) << "top-k weights";
    EXPECT_EQ(got.gate_up, want.gate_up) << "gate_up pre-activations in expert order";
    const double tol = dtype_ == HK_DTYPE_BF16 ? 1e-2 : 2e-3;
    EXPECT_LE(rel_error(got.y, want.y), tol) << "y";
    EXPECT_LE(rel_error(got.dx, want.dx), tol) << "dx";
    EXPECT_LE(rel_error(got.dwr, want.dwr), tol) << "d router_w";
    EXPECT_LE(rel_error(got.dgu, want.dgu), tol) << "d gate_up_w";
    EXPECT_LE(rel_error(got.dwd, want.dwd), tol) << "d down_w";
    // Experts without rows get exact zeros (or keep what was accumulated: zeros here too).
    std::vector<int64_t> count(c.E, 0);
    for (int32_t e : got.ids) ++count[e];
    for (int64_t e = 0; e < c.E; ++e) {
      if (count[e]) continue;
      for (int64_t i = 0; i < 2 * c.I * c.H; ++i) ASSERT_EQ(got.dgu[e * 2 * c.I * c.H + i], 0.0f);
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<Case, int32_t, int>>& info) {
  return std::string(std::get<0>(info.param).name) +
         (std::get<1>(info.param) == HK_DTYPE_BF16 ? "_bf16" : "_f16") +
         (std::get<2>(info.param) == 256 ? "_tile256" : "");
}
const Case* kCases = hk::test::kMoeProblems;  // the first seven: the rest are GPU only
INSTANTIATE_TEST_SUITE_P(Cases, EmulatedCuda,
                         ::testing::Combine(::testing::ValuesIn(kCases, kCases + 7),
                                            ::testing::Values(HK_DTYPE_BF16),
                                            ::testing::Values(128)),
                         case_name);
// f16 (another mma instruction and rounding) on the small cases.
INSTANTIATE_TEST_SUITE_P(F16, EmulatedCuda,
                         ::testing::Combine(::testing::ValuesIn(kCases, kCases + 5),
                                            ::testing::Values(HK_DTYPE_F16),
                                            ::testing::Values(128)),
                         case_name);
// The 128×256 tiles (64×64 warp tiles) on the cases that cross tile edges, in bf16.
const Case kWideTileCases[] = {kCases[0], kCases[1], kCases[3], kCases[6]};
INSTANTIATE_TEST_SUITE_P(WideTiles, EmulatedCuda,
                         ::testing::Combine(::testing::ValuesIn(kWideTileCases),
                                            ::testing::Values(HK_DTYPE_BF16),
                                            ::testing::Values(256)),
                         case_name);

// HK_MEGABLOCKS_GEMM picks the expert GEMMs' kernels: "mma" (tile N from MEGABLOCKS_GEMM_TILE), or
// unset: wgmma on an sm_90 GPU with sm_90a code, mma here (the emulation has none); "wgmma" is
// refused with a sentence here (on the GPU tests/gpu/test_moe_gpu.cc runs it); anything else is an
// invalid argument.
TEST(MegablocksGemmSelection, TheEnvironmentPicksTheKernelsOrSaysWhyNot) {
  auto status_of = [](const char* value) -> hk_status {
    setenv("HK_MEGABLOCKS_GEMM", value, 1);
    try {
      cuda::gemm_kernels();
    } catch (const hk::sdk::Failure& f) {
      EXPECT_NE(std::string(f.what()).find("HK_MEGABLOCKS_GEMM"), std::string::npos) << f.what();
      return f.status();
    }
    return HK_STATUS_OK;
  };
  unsetenv("HK_MEGABLOCKS_GEMM");
  unsetenv("MEGABLOCKS_GEMM_TILE");
  EXPECT_FALSE(cuda::gemm_kernels().wgmma);
  EXPECT_EQ(cuda::gemm_kernels().bn, 128);
  setenv("MEGABLOCKS_GEMM_TILE", "128x256", 1);
  setenv("HK_MEGABLOCKS_GEMM", "mma", 1);
  EXPECT_FALSE(cuda::gemm_kernels().wgmma);
  EXPECT_EQ(cuda::gemm_kernels().bn, 256);
  unsetenv("MEGABLOCKS_GEMM_TILE");
  EXPECT_EQ(status_of("wgmma"), HK_STATUS_UNSUPPORTED);
  EXPECT_EQ(status_of("tcgen05"), HK_STATUS_INVALID_ARGUMENT);
  unsetenv("HK_MEGABLOCKS_GEMM");
}

// The device permutation's phases (routing.h), run on the host, against a stable sort.
TEST(MegablocksPermutation, ChunkedCountingSortIsTheStableSortByExpert) {
  std::mt19937 rng(5);
  for (int64_t n : {1, 255, 1000, 1023, 1024, 1025, 3000, 4099}) {
    const int32_t E = 13;
    std::vector<int32_t> ids(n);
    for (auto& e : ids) e = std::uniform_int_distribution<int32_t>(0, E - 1)(rng);
    const int64_t chunks = num_chunks(n);
    std::vector<int32_t> hist(chunks * E, 0), rank(n);
    for (int64_t a = 0; a < n; ++a) {
      rank[a] = chunk_rank(ids.data() + a / kChunk * kChunk, static_cast<int32_t>(a % kChunk));
      ++hist[(a / kChunk) * E + ids[a]];
    }
    std::vector<int64_t> counts(E), offsets(E + 1), tiles(E + 1);
    for (int32_t e = 0; e < E; ++e) counts[e] = chunk_prefix(hist.data(), chunks, E, e);
    expert_offsets(counts.data(), E, 128, offsets.data(), tiles.data());
    std::vector<int64_t> order(n);
    for (int64_t a = 0; a < n; ++a) order[a] = a;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
    for (int64_t r = 0; r < n; ++r) {
      const int64_t a = order[r];
      ASSERT_EQ(sorted_row(ids.data(), hist.data(), offsets.data(), E, a, rank[a]), r) << n;
    }
    for (int32_t e = 0; e < E; ++e) {
      EXPECT_EQ(tiles[e + 1] - tiles[e], (counts[e] + 127) / 128);
      for (int64_t t = tiles[e]; t < tiles[e + 1]; ++t)
        EXPECT_EQ(tile_expert(tiles.data(), E, t), e);
    }
  }
}

}  // namespace
}  // namespace megablocks
