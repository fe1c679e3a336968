// CPU f32 golden tests of Qwen3-MoE against Transformers (tests/fixtures, made by
// tools/fixtures/make_moe_fixtures.py): the tiny MoE models' logits within 1e-4 and identical
// greedy ids (single prompts and a left-padded batch), with the built-in MoE block and with
// kernels-community/megablocks' cpu variant; both checkpoint layouts (the Hub's per-expert keys,
// Transformers 5.x's stacked experts) give the same model; single MoE blocks on uneven routings
// (experts without tokens, one expert taking every token, top-k = E, one token), forward and
// every gradient within 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "golden/grad_fixture.h"
#include "hk/error.h"
#include "hk/kernelize.h"
#include "hk/moe.h"
#include "hk/safetensors.h"

namespace hk {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string>& moe_fixtures() {
  static const std::vector<std::string> names{"qwen3-moe-tiny", "qwen3-moe-tiny-bf16"};
  return names;
}

const std::string kMegablocks = "kernels-community/megablocks:MegaBlocksMoeMLP";

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

// A per-test kernel cache, and the embedded hub of this build.
class WithHub {
 protected:
  WithHub() {
    unsetenv("USE_HUB_KERNELS");
    cache_ = fs::temp_directory_path() / ("hk-moe-golden-cache-" + std::to_string(getpid()));
  }
  ~WithHub() { fs::remove_all(cache_); }
  KernelizeReport bind_megablocks(nn::Module& root, DType dtype, Mode mode) {
    KernelizeOptions o;
    o.device = Device::cpu();
    o.dtype = dtype;
    o.config = KernelConfig{{{"MoeMLP", KernelMappingValue(kMegablocks)}}};
    o.config.inherit_mapping = false;
    o.hub = testing::local_hub(testing::build_dir() / "hub", cache_);
    return kernelize(root, mode, o);
  }
  fs::path cache_;
};

// ---- whole models ------------------------------------------------------------------------------

class MoeGolden : public ::testing::TestWithParam<std::tuple<std::string, bool>>, public WithHub {
 protected:
  CausalLM load() {
    CausalLM model = AutoModelForCausalLM::from_pretrained(
        testing::model_fixture(std::get<0>(GetParam())), {.dtype = DType::F32});
    if (std::get<1>(GetParam())) {
      KernelizeReport report = bind_megablocks(model.module(), DType::F32, Mode::Inference);
      size_t bound = 0;
      for (const LayerDecision& d : report.layers)
        if (d.layer == "MoeMLP") {
          EXPECT_EQ(d.kernel, kMegablocks) << d.path << ": " << d.reason;
          ++bound;
        }
      EXPECT_GT(bound, 0u);
    }
    return model;
  }
};

TEST_P(MoeGolden, LogitsMatchTransformers) {
  const std::string dir = testing::model_fixture(std::get<0>(GetParam()));
  auto expected = testing::read_json(dir + "/expected.json");
  auto ref = SafetensorsFile::open(dir + "/expected.safetensors");
  CausalLM model = load();
  const int64_t keep = expected["logits_positions"].get<int64_t>();
  for (size_t i = 0; i < expected["prompts"].size(); ++i) {
    auto ids = expected["prompts"][i]["ids"].get<std::vector<int64_t>>();
    Tensor input = Tensor::from_ints(ids, {1, static_cast<int64_t>(ids.size())});
    CausalLMOutput out = model.forward(input, ForwardOptions{.logits_to_keep = keep});
    const double worst = max_abs_diff(
        out.logits.to_doubles(),
        ref.load("logits.f32." + std::to_string(i), Device::cpu(), DType::F32).to_doubles());
    EXPECT_LE(worst, 1e-4) << "prompt " << i << ": max |hk - transformers|";
  }
}

TEST_P(MoeGolden, GreedyIdsMatchTransformers) {
  const std::string dir = testing::model_fixture(std::get<0>(GetParam()));
  auto expected = testing::read_json(dir + "/expected.json");
  CausalLM model = load();
  GenerateOptions options{.max_new_tokens = expected["max_new_tokens"].get<int64_t>()};
  std::vector<std::vector<int64_t>> prompts;
  for (size_t i = 0; i < expected["prompts"].size(); ++i) {
    prompts.push_back(expected["prompts"][i]["ids"].get<std::vector<int64_t>>());
    EXPECT_EQ(model.generate(prompts.back(), options).sequences.at(0),
              expected["greedy"][i].get<std::vector<int64_t>>())
        << "prompt " << i;
  }
  GenerateOutput batch = model.generate(prompts, options);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(batch.sequences.at(i), expected["batch_greedy"][i].get<std::vector<int64_t>>())
        << "batch row " << i;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MoeGolden,
                         ::testing::Combine(::testing::ValuesIn(moe_fixtures()), ::testing::Bool()),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param) +
                                           (std::get<1>(info.param) ? "_megablocks" : "");
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// The module tree: Transformers' class names, sparse layers where the config says.
TEST(MoeModel, TreeFollowsTheConfig) {
  CausalLM tiny = AutoModelForCausalLM::from_pretrained(testing::model_fixture("qwen3-moe-tiny"));
  nn::Module& root = tiny.module();
  EXPECT_EQ(root.type_name(), "Qwen3MoeForCausalLM");
  for (int layer : {0, 2}) {
    nn::Module* mlp = root.find_module("model.layers." + std::to_string(layer) + ".mlp");
    ASSERT_NE(mlp, nullptr);
    EXPECT_EQ(mlp->type_name(), "Qwen3MoeSparseMoeBlock");
    EXPECT_EQ(mlp->layer_interface(), "MoeMLP");
    EXPECT_EQ(mlp->find_module("experts")->param("gate_up_proj").sizes(), (Shape{8, 64, 64}));
    EXPECT_EQ(mlp->find_module("experts")->param("down_proj").sizes(), (Shape{8, 64, 32}));
    EXPECT_EQ(mlp->find_module("gate")->param("weight").sizes(), (Shape{8, 64}));
    EXPECT_EQ(mlp->find_module("experts.act_fn")->layer_interface(), "SiLU");
  }
  nn::Module* dense = root.find_module("model.layers.1.mlp");  // mlp_only_layers [1]
  EXPECT_EQ(dense->type_name(), "Qwen3MoeMLP");
  EXPECT_EQ(dense->find_module("gate_proj")->param("weight").sizes(), (Shape{96, 64}));
  CausalLM bf16 =
      AutoModelForCausalLM::from_pretrained(testing::model_fixture("qwen3-moe-tiny-bf16"));
  EXPECT_EQ(bf16.module().find_module("model.layers.0.mlp")->type_name(), "Qwen3MoeMLP");
  EXPECT_EQ(bf16.module().find_module("model.layers.1.mlp")->layer_interface(), "MoeMLP");
  EXPECT_EQ(bf16.config().moe.num_experts, 6);  // from num_local_experts (5.x)
  EXPECT_EQ(tiny.config().moe.num_experts, 8);  // from num_experts (the Hub's spelling)
}

// ---- checkpoint layouts
// --------------------------------------------------------------------------

void write_tensors(const fs::path& path, const std::map<std::string, Tensor>& tensors) {
  std::vector<std::pair<std::string, TensorView>> views;
  for (const auto& [name, t] : tensors) views.emplace_back(name, t.view());
  save_safetensors(path.string(), views);
}

// Writes `dir` as a copy of `from` whose model.safetensors has the other expert layout.
void convert_layout(const std::string& from, const fs::path& dir, bool to_per_expert) {
  fs::create_directories(dir);
  for (const char* f : {"config.json", "generation_config.json"})
    fs::copy_file(fs::path(from) / f, dir / f, fs::copy_options::overwrite_existing);
  SafetensorsFile src = SafetensorsFile::open(from + "/model.safetensors");
  std::map<std::string, Tensor> out;
  for (const TensorInfo& info : src.tensors()) {
    Tensor t = src.load(info.name);
    const std::string& k = info.name;
    auto ends = [&](const std::string& s) {
      return k.size() > s.size() && k.compare(k.size() - s.size(), s.size(), s) == 0;
    };
    if (to_per_expert && (ends("experts.gate_up_proj") || ends("experts.down_proj"))) {
      const std::string prefix = k.substr(0, k.rfind('.'));
      const bool gate_up = ends("gate_up_proj");
      for (int64_t e = 0; e < t.size(0); ++e) {
        Tensor w = t.select(0, e);
        const std::string base = prefix + "." + std::to_string(e) + ".";
        if (gate_up) {
          const int64_t i = w.size(0) / 2;
          out[base + "gate_proj.weight"] = w.slice(0, 0, i).contiguous();
          out[base + "up_proj.weight"] = w.slice(0, i, 2 * i).contiguous();
        } else {
          out[base + "down_proj.weight"] = w.contiguous();
        }
      }
      continue;
    }
    out[k] = t;
  }
  ASSERT_TRUE(to_per_expert) << "only the stacked → per-expert direction is written here";
  write_tensors(dir / "model.safetensors", out);
}

TEST(MoeCheckpoint, PerExpertAndStackedLayoutsLoadTheSameModel) {
  const std::string stacked = testing::model_fixture("qwen3-moe-tiny-bf16");
  const fs::path per_expert =
      fs::temp_directory_path() / ("hk-moe-layout-" + std::to_string(getpid()));
  convert_layout(stacked, per_expert, /*to_per_expert=*/true);
  CausalLM a = AutoModelForCausalLM::from_pretrained(stacked, {.dtype = DType::F32});
  CausalLM b = AutoModelForCausalLM::from_pretrained(per_expert.string(), {.dtype = DType::F32});
  auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_EQ(pa[i].first, pb[i].first);
    EXPECT_EQ(pa[i].second->value.to_doubles(), pb[i].second->value.to_doubles()) << pa[i].first;
  }
  fs::remove_all(per_expert);
}

TEST(MoeCheckpoint, AMissingExpertIsNamed) {
  const std::string stacked = testing::model_fixture("qwen3-moe-tiny-bf16");
  const fs::path dir = fs::temp_directory_path() / ("hk-moe-missing-" + std::to_string(getpid()));
  convert_layout(stacked, dir, true);
  {
    SafetensorsFile f = SafetensorsFile::open((dir / "model.safetensors").string());
    std::map<std::string, Tensor> kept;
    for (const TensorInfo& info : f.tensors())
      if (info.name != "model.layers.1.mlp.experts.4.up_proj.weight")
        kept[info.name] = f.load(info.name);
    write_tensors(dir / "model.safetensors", kept);
  }
  try {
    AutoModelForCausalLM::from_pretrained(dir.string());
    ADD_FAILURE() << "a checkpoint without expert 4's up_proj loaded";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.experts.4.up_proj.weight"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// ---- single blocks on uneven routings --------------------------------------------------------

struct BlockCase {
  std::string name;
  int64_t T, H, I, E, k;
  bool norm;
};

void PrintTo(const BlockCase& c, std::ostream* os) {
  *os << c.name;
}

std::vector<BlockCase> block_cases() {
  SafetensorsFile f =
      SafetensorsFile::open(testing::source_dir() + "/tests/fixtures/moe/blocks.safetensors");
  std::vector<BlockCase> out;
  for (const char* name : {"random", "dead_experts", "one_expert_all", "one_expert_k1",
                           "all_experts", "single_token"}) {
    auto j = nlohmann::json::parse(f.metadata().at(name));
    out.push_back({name, j["T"], j["H"], j["I"], j["E"], j["k"], j["norm"]});
  }
  return out;
}

class MoeBlockGolden : public ::testing::TestWithParam<std::tuple<BlockCase, bool>>,
                       public WithHub {};

TEST_P(MoeBlockGolden, ForwardAndEveryGradientMatchTransformers) {
  const BlockCase& c = std::get<0>(GetParam());
  SafetensorsFile f =
      SafetensorsFile::open(testing::source_dir() + "/tests/fixtures/moe/blocks.safetensors");
  auto load = [&](const std::string& n) {
    return f.load(c.name + "." + n, Device::cpu(), DType::F32);
  };
  nn::MoeMLP block(nn::MoeShape{c.H, c.E, c.k, c.I, c.norm, "silu", "Qwen3Moe"});
  nn::load_state_dict(block, nn::TensorMapSource({{"gate.weight", load("gate")},
                                                  {"experts.gate_up_proj", load("gate_up")},
                                                  {"experts.down_proj", load("down")}}));
  if (std::get<1>(GetParam())) {
    KernelizeReport r = bind_megablocks(block, DType::F32, Mode::Training);
    ASSERT_EQ(r.find("")->kernel, kMegablocks) << r.find("")->reason;
  }
  const Tensor x = load("x");
  Tensor y = Tensor::empty(x.sizes(), DType::F32);
  block.forward(x, y);
  EXPECT_LE(testing::relative_error(y.to_doubles(), load("y").to_doubles()), 1e-5) << "y";

  block.train();
  nn::LayerContext ctx;
  Tensor y2 = Tensor::empty(x.sizes(), DType::F32);
  Tensor logits = Tensor::empty({c.T, c.E}, DType::F32);
  block.forward_train(x, y2, logits, ctx);
  EXPECT_EQ(y2.to_doubles(), y.to_doubles()) << "forward_train's y is forward's";
  EXPECT_LE(testing::relative_error(logits.to_doubles(), load("router_logits").to_doubles()), 1e-6);
  Tensor dx = Tensor::empty(x.sizes(), DType::F32);
  block.backward(x, ctx, load("dy"), nullptr, dx);
  auto grad = [&](nn::Module& m, const char* p) { return m.slot(p).grad.to_doubles(); };
  EXPECT_LE(testing::relative_error(dx.to_doubles(), load("dx").to_doubles()), 1e-5) << "dx";
  EXPECT_LE(testing::relative_error(grad(*block.gate, "weight"), load("dgate").to_doubles()), 1e-5)
      << "router";
  EXPECT_LE(
      testing::relative_error(grad(*block.experts, "gate_up_proj"), load("dgate_up").to_doubles()),
      1e-5)
      << "gate_up_proj";
  EXPECT_LE(testing::relative_error(grad(*block.experts, "down_proj"), load("ddown").to_doubles()),
            1e-5)
      << "down_proj";
  // Experts that got no token get a zero gradient (not garbage).
  const std::vector<int64_t> ids = f.load(c.name + ".topk_ids").to_int64s();
  const std::vector<double> dgu = grad(*block.experts, "gate_up_proj");
  const size_t per_expert = static_cast<size_t>(2 * c.I * c.H);
  for (int64_t e = 0; e < c.E; ++e) {
    if (std::find(ids.begin(), ids.end(), e) != ids.end()) continue;
    for (size_t i = 0; i < per_expert; ++i)
      ASSERT_EQ(dgu[e * per_expert + i], 0.0) << "expert " << e << " got no token";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, MoeBlockGolden,
                         ::testing::Combine(::testing::ValuesIn(block_cases()), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param).name +
                                  (std::get<1>(info.param) ? "_megablocks" : "");
                         });

}  // namespace
}  // namespace hk

namespace hk {
namespace {

// The default mapping (use_kernels) for MoeMLP: kernels-community/megablocks on cuda; rocm and xpu
// are routed to it too and fall back with the hub's reason (no build for them). Kernelize only
// resolves here: nothing runs on those devices.
TEST(MoeDefaultMapping, RoutesMoeMLPOnCudaRocmAndXpu) {
  unsetenv("USE_HUB_KERNELS");
  const fs::path cache = fs::temp_directory_path() / ("hk-moe-map-" + std::to_string(getpid()));
  CausalLM model = AutoModelForCausalLM::from_pretrained(testing::model_fixture("qwen3-moe-tiny"));
  auto decide = [&](Device device) {
    KernelizeOptions o;
    o.device = device;
    o.dtype = DType::BF16;
    o.use_kernels = true;
    o.hub = testing::local_hub(testing::build_dir() / "hub", cache);
    KernelizeReport r = kernelize(model.module(), Mode::Inference, o);
    const LayerDecision d = *r.find("model.layers.0.mlp");
    for (auto& [path, m] : model.module().named_modules()) m->reset_impl();
    return d;
  };
  const LayerDecision cpu = decide(Device::cpu());
  EXPECT_EQ(cpu.kernel, "");  // no cpu row: the built-in block (OpenBLAS per expert) is faster
  EXPECT_NE(cpu.reason.find("no kernel mapped for MoeMLP on cpu"), std::string::npos) << cpu.reason;
  const LayerDecision xpu = decide(Device{DeviceType::XPU, 0, 0});
  EXPECT_EQ(xpu.kernel, "");
  EXPECT_NE(xpu.reason.find("kernels-community/megablocks:MegaBlocksMoeMLP unusable"),
            std::string::npos)
      << xpu.reason;
  setenv("HK_DEVICE_BACKEND", "rocm", 1);  // ROCm reports itself as cuda
  const LayerDecision rocm = decide(Device{DeviceType::CUDA, 0, 90});
  unsetenv("HK_DEVICE_BACKEND");
  EXPECT_EQ(rocm.kernel, "");
  EXPECT_NE(rocm.reason.find("kernels-community/megablocks:MegaBlocksMoeMLP unusable"),
            std::string::npos)
      << rocm.reason;
  const LayerDecision cuda = decide(Device{DeviceType::CUDA, 0, 90});
  // A build without CUDA publishes the cpu variant only: then the cuda row falls back, saying so.
  const fs::path repo = testing::build_dir() / "hub" / "kernels-community" / "megablocks";
  bool cuda_variant = false;
  if (fs::exists(repo))
    for (const auto& e : fs::recursive_directory_iterator(repo))
      if (e.is_directory() && e.path().filename().string().rfind("hk1-cu", 0) == 0)
        cuda_variant = true;
  if (cuda_variant && cuda.reason.find("CUDA runtime") == std::string::npos) {
    EXPECT_EQ(cuda.kernel, "kernels-community/megablocks:MegaBlocksMoeMLP") << cuda.reason;
    EXPECT_EQ(cuda.variant.find("hk1-cu"), 0u) << cuda.variant;
  } else if (!cuda_variant && fs::exists(repo)) {
    EXPECT_EQ(cuda.kernel, "");
    EXPECT_NE(cuda.reason.find("a cpu build cannot run on a cuda device"), std::string::npos)
        << cuda.reason;
  }
  RecordProperty("xpu_reason", xpu.reason);
  RecordProperty("rocm_reason", rocm.reason);
  fs::remove_all(cache);
}

}  // namespace
}  // namespace hk
