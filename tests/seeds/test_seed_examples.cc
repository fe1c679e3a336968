// The seed documents' code examples (../shared/seeds: the Kernels page, its overview, the loading
// guide — the Chinese and Portuguese pages repeat the same examples — and the writing guide's
// stateful kernel), walked in order, each in its hk forms: the C++ API (LoadOptions /
// KernelConfig / kernelize), the --kernel-config JSON and the CLI flags, checked to do what the
// text says. docs/kernel-config.md shows every form and cites this file.
//
// Compiled twice: the cpu variants (CI) and, with HK_SEEDS_CUDA, the same walk on cuda in bf16
// (label gpu). Examples that name a device this machine has no runtime for (rocm, xpu) are shown
// through the simulated selection (nothing loaded). Not walked here, with their issues: the
// Liger TrainingArguments examples and the backward half of "mode awareness" (training) and the
// attn_implementation examples (attention kernels); fusion and layouts beyond the guide's example
// are tests/unit/kernelize/test_fusion.cc. The example model "Qwen/Qwen3-0.6B" is the tiny Qwen3
// fixture.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/cli_testing.h"
#include "hk/error.h"
#include "hk/kernelize.h"
#include "hk/models.h"
#include "hk/module.h"

namespace hk {
namespace {

namespace fs = std::filesystem;

#ifdef HK_SEEDS_CUDA
constexpr bool kCuda = true;
const char* kDevice = "cuda";
#else
constexpr bool kCuda = false;
const char* kDevice = "cpu";
#endif

const std::string kNorm = "model.layers.0.input_layernorm";
const std::string kQNorm = "model.layers.1.self_attn.q_norm";
const std::string kFinalNorm = "model.norm";
const std::string kRotary = "model.layers.0.self_attn.rotary_fn";
const std::string kMlp = "model.layers.0.mlp";
const std::string kAct = "model.layers.0.mlp.act_fn";

std::string model_dir() {
  return test::source_dir() + "/tests/fixtures/models/qwen3-tiny";
}

// The seeds-hub (owner/my-kernel) before the embedded hub: HK_HUB_DIR takes a list.
std::string hub_dirs() {
  return test::binary_dir() + "/seeds-hub:" + test::binary_dir() + "/hub";
}

class SeedExamples : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setenv("HK_HUB_DIR", hub_dirs().c_str(), 1);
    for (const char* v : {"HK_ENDPOINT", "LOCAL_KERNELS", "USE_HUB_KERNELS", "HK_TRUSTED_ORGS",
                          "HF_HUB_OFFLINE", "HK_HUB_OFFLINE"})
      unsetenv(v);
    setenv("HK_KERNELS_CACHE", scratch().c_str(), 1);
  }
  static std::string scratch() {
    static const std::string dir =
        (fs::temp_directory_path() / ("hk-seeds-" + std::to_string(getpid()))).string();
    return dir;
  }

  static LoadOptions load_options() {
    LoadOptions o;
    o.device = kDevice;
    if (kCuda) o.dtype = DType::BF16;
    return o;
  }
  // A model as the example loads it (C++ form).
  static CausalLM load(const LoadOptions& o) {
    return AutoModelForCausalLM::from_pretrained(model_dir(), o);
  }

  static std::vector<double> logits(const CausalLM& m) {
    const Tensor ids = Tensor::from_ints({1, 5, 9, 42, 7, 3}, {1, 6});
    return m.forward(ids).logits.to(Device::cpu()).to_doubles();
  }
  // Kernels hk binds compute what the built-in layers compute (f32 on cpu; bf16 on cuda).
  static void expect_same_logits(const CausalLM& kernelized) {
    static const std::vector<double> builtin = logits(load(load_options()));
    const std::vector<double> got = logits(kernelized);
    ASSERT_EQ(got.size(), builtin.size());
    const double atol = kCuda ? 3e-2 : 1e-5, rtol = kCuda ? 3e-2 : 1e-5;
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], builtin[i], atol + rtol * std::fabs(builtin[i])) << i;
  }

  static const LayerDecision& decision(const KernelizeReport& r, const std::string& path) {
    const LayerDecision* d = r.find(path);
    if (!d) throw NotFound("no decision for " + path);
    return *d;
  }

  // The --kernel-config form: `hk kernelize --report --json` with the JSON file and `flags`.
  static nlohmann::json cli_report(const std::string& config_json, const std::string& flags = "",
                                   std::vector<std::pair<std::string, std::string>> env = {}) {
    static int n = 0;
    std::string args = "kernelize --model " + test::shell_quote(model_dir()) + " --report --json";
    if (!config_json.empty()) {
      const std::string path = scratch() + "/config" + std::to_string(n++) + ".json";
      fs::create_directories(scratch());
      std::ofstream(path) << config_json;
      args += " --kernel-config " + test::shell_quote(path);
    }
    // A caller that names its own (simulated) device keeps it: --device is given once.
    if (kCuda && flags.find("--device") == std::string::npos) args += " --device cuda --dtype bf16";
    env.insert(env.begin(), {"HK_HUB_DIR", hub_dirs()});
    env.push_back({"HK_KERNELS_CACHE", scratch()});
    auto r = test::run_cli(args + " " + flags, env);
    if (r.status != 0) ADD_FAILURE() << "hk " << args << " " << flags << ": " << r.err;
    return r.status == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
  }
  // The CLI's decisions equal the C++ API's, layer by layer.
  static void expect_same_decisions(const nlohmann::json& cli, const KernelizeReport& cpp) {
    ASSERT_TRUE(cli.contains("layers")) << cli.dump();
    ASSERT_EQ(cli["layers"].size(), cpp.layers.size());
    for (const auto& l : cli["layers"]) {
      const LayerDecision& d = decision(cpp, l["path"]);
      EXPECT_EQ(l["kernel"].is_null() ? "" : l["kernel"].get<std::string>(), d.kernel) << d.path;
    }
  }
};

// ---- Kernels page: "Hub kernels"
// -----------------------------------------------------------------
//   kernel_config = KernelConfig(kernel_mapping={"RMSNorm": "kernels-community/rmsnorm"})
//   model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-0.6B", use_kernels=True,
//                                                kernel_config=kernel_config)
TEST_F(SeedExamples, K1_KernelConfigWithARepo) {
  LoadOptions o = load_options();
  o.use_kernels = true;
  o.kernel_config = KernelConfig{{{"RMSNorm", "kernels-community/rmsnorm"}}};
  CausalLM model = load(o);
  const KernelizeReport& r = *model.kernelize_report();
  for (const std::string& p : {kNorm, kQNorm, kFinalNorm}) {
    EXPECT_EQ(decision(r, p).kernel, "kernels-community/rmsnorm:RMSNorm") << decision(r, p).reason;
    EXPECT_NE(decision(r, p).variant.find(kCuda ? "-cu" : "-cpu-"), std::string::npos);
  }
  expect_same_logits(model);
  const std::string json = R"({"kernel_mapping": {"RMSNorm": "kernels-community/rmsnorm"}})";
  expect_same_decisions(cli_report(json), r);
  // hk generate with the same file: the kernels are bound and the ids are those of the built-in
  const std::string path = scratch() + "/k1.json";
  std::ofstream(path) << json;
  const std::string gen = "generate --model " + test::shell_quote(model_dir()) +
                          " --ids 1,2,3 --max-new-tokens 3 --json" +
                          (kCuda ? " --device cuda --dtype bf16" : "");
  auto with = test::run_cli(gen + " --use-kernels --kernel-config " + test::shell_quote(path),
                            {{"HK_HUB_DIR", hub_dirs()}});
  auto without = test::run_cli(gen, {{"HK_HUB_DIR", hub_dirs()}});
  ASSERT_EQ(with.status, 0) << with.err;
  ASSERT_EQ(without.status, 0) << without.err;
  const auto j = nlohmann::json::parse(with.out);
  EXPECT_EQ(j["ids"], nlohmann::json::parse(without.out)["ids"]);
  int bound = 0;
  for (const auto& l : j["kernelize"]["layers"])
    bound += l["kernel"] == "kernels-community/rmsnorm:RMSNorm";
  EXPECT_GT(bound, 0);
}

// ---- Loading guide
// -------------------------------------------------------------------------------
//   model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-0.6B", use_kernels=True,
//                                                device_map="auto")   (and device_map="cuda")
TEST_F(SeedExamples, L1_UseKernelsTakesTheDeviceAwareDefaults) {
  LoadOptions o = load_options();
  o.use_kernels = true;
  CausalLM model = load(o);
  const KernelizeReport& r = *model.kernelize_report();
  if (kCuda) {
    EXPECT_EQ(decision(r, kNorm).kernel, "kernels-community/liger-kernels:LigerRMSNorm");
    EXPECT_NE(decision(r, kNorm).reason.find("liger-kernels@v3"), std::string::npos);
    EXPECT_EQ(decision(r, kMlp).kernel, "kernels-community/liger-kernels:LigerSwiGLUMLP");
  } else {
    EXPECT_EQ(decision(r, kNorm).kernel, "kernels-community/rmsnorm:RMSNorm");
    EXPECT_TRUE(decision(r, kMlp).kernel.empty());  // no default MLP kernel on cpu
  }
  EXPECT_EQ(decision(r, kRotary).kernel, "kernels-community/rotary:apply_rotary_transformers");
  EXPECT_NE(decision(r, kRotary).reason.find("rotary@v2"), std::string::npos);
  EXPECT_EQ(decision(r, kAct).kernel, "kernels-community/activation:Silu");
  // a layer no default covers falls back to the built-in ("standard PyTorch") with the reason
  EXPECT_TRUE(decision(r, "model.embed_tokens").kernel.empty());
  EXPECT_NE(decision(r, "model.embed_tokens").reason.find("no kernel mapped"), std::string::npos);
  expect_same_logits(model);
  expect_same_decisions(cli_report(""), r);
}

// The default table per device (the guide's table; row by row in tests/unit/kernelize/
// test_default_table.cc): the devices this machine lacks through the simulated selection.
TEST_F(SeedExamples, L2_TheDefaultTablePerDevice) {
  CausalLM model = load(load_options());
  KernelizeOptions k;
  k.simulate = true;
  k.dtype = DType::BF16;
  k.simulated_cuda_runtime = 13000;
  k.device = Device{DeviceType::CUDA, 0, 90};
  const KernelizeReport cuda = kernelize(model.module(), Mode::Inference, k);
  k.device = Device{DeviceType::ROCM, 0, 94};
  const KernelizeReport rocm = kernelize(model.module(), Mode::Inference, k);
  k.device = Device{DeviceType::XPU, 0, 0};
  const KernelizeReport xpu = kernelize(model.module(), Mode::Inference, k);
  // RMSNorm: liger-kernels on cuda and rocm, rmsnorm on xpu
  EXPECT_NE(decision(cuda, kNorm).reason.find("liger-kernels"), std::string::npos);
  EXPECT_NE(decision(rocm, kNorm).reason.find("kernels-community/liger-kernels:LigerRMSNorm"),
            std::string::npos);
  EXPECT_NE(decision(rocm, kNorm).reason.find("cannot run on a rocm device"), std::string::npos);
  EXPECT_NE(decision(xpu, kNorm).reason.find("kernels-community/rmsnorm:RMSNorm"),
            std::string::npos);
  EXPECT_NE(decision(xpu, kNorm).reason.find("cannot run on a xpu device"), std::string::npos);
  // Rotary: rotary on cuda and xpu, aiter-rope on rocm
  EXPECT_NE(decision(rocm, kRotary).reason.find("kernels-community/aiter-rope"), std::string::npos);
  EXPECT_NE(decision(xpu, kRotary).reason.find("kernels-community/rotary"), std::string::npos);
  // MLP (SwiGLU) only on cuda (bound when this build has cuda variants, else the reason says so)
  EXPECT_NE((decision(cuda, kMlp).kernel + decision(cuda, kMlp).reason).find("LigerSwiGLUMLP"),
            std::string::npos);
  EXPECT_NE(decision(rocm, kMlp).reason.find("no kernel mapped"), std::string::npos);
  for (const auto* r : {&cuda, &rocm, &xpu}) EXPECT_FALSE(r->simulated_target.empty());
  // the CLI form: hk kernelize --device xpu --report (simulated: nothing loaded)
  const auto cli = cli_report("", "--device xpu");
  EXPECT_EQ(cli["simulated"], true);
}

//   model.eval(); model.generate(...)   /   model.train(); ...   (mode awareness)
TEST_F(SeedExamples, L7_TrainAndEvalReKernelize) {
  LoadOptions o = load_options();
  o.use_kernels = true;
  CausalLM model = load(o);
  EXPECT_EQ(model.kernelize_report()->mode, Mode::Inference);
  auto out = model.eval().generate(std::vector<int64_t>{1, 2, 3}, {.max_new_tokens = 3});
  EXPECT_EQ(out.sequences.at(0).size(), 3u);
  model.train();
  const KernelizeReport& t = *model.kernelize_report();
  EXPECT_EQ(t.mode, Mode::Training);
  // training binds only entries that declare training and have a backward
  for (const auto& d : t.layers)
    if (!d.kernel.empty()) EXPECT_EQ(d.reason.find("has no backward"), std::string::npos) << d.path;
  model.eval();
  EXPECT_EQ(model.kernelize_report()->mode, Mode::Inference);
}

//   kernelize(model, mode=Mode.INFERENCE) / Mode.TRAINING / Mode.TRAINING | Mode.TORCH_COMPILE
TEST_F(SeedExamples, L8_KernelizeWithAnExplicitMode) {
  CausalLM model = load(load_options());
  KernelizeOptions k;
  k.device = model.device();
  k.dtype = model.dtype();
  for (Mode mode : {Mode::Inference, Mode::Training, Mode::Training | Mode::Capture}) {
    const KernelizeReport r = kernelize(model.module(), mode, k);
    EXPECT_EQ(r.mode, mode);
    const LayerDecision& norm = decision(r, kNorm);
    if (mode == (Mode::Training | Mode::Capture) && !kCuda) {
      // hk's cpu kernels do not claim capture: the built-in stays, and the report says why
      EXPECT_TRUE(norm.kernel.empty());
      EXPECT_NE(norm.reason.find("not training|capture"), std::string::npos) << norm.reason;
    } else {
      EXPECT_FALSE(norm.kernel.empty()) << mode_name(mode) << ": " << norm.reason;
    }
    const auto cli = cli_report("", "--mode " + test::shell_quote(mode_name(mode)));
    EXPECT_EQ(cli["mode"], mode_name(mode));
    expect_same_decisions(cli, r);
  }
}

//   KernelConfig(kernel_mapping={"RMSNorm": "kernels-community/liger-kernels:LigerRMSNorm"})
//   (the guide's attn_implementation half is the attention issue's)
TEST_F(SeedExamples, L9_RepoAndEntryAtTheDefaultVersion) {
  LoadOptions o = load_options();
  o.kernel_config = KernelConfig{
      {{"RMSNorm", "kernels-community/liger-kernels:LigerRMSNorm"}}};  // implies use_kernels
  CausalLM model = load(o);
  const KernelizeReport& r = *model.kernelize_report();
  EXPECT_EQ(decision(r, kNorm).kernel, "kernels-community/liger-kernels:LigerRMSNorm")
      << decision(r, kNorm).reason;
  // no version given: version 1 (branch v1), a real 1.x build of the same sources
  EXPECT_NE(decision(r, kNorm).reason.find("liger-kernels@v1, version 1."), std::string::npos)
      << decision(r, kNorm).reason;
  expect_same_logits(model);
  expect_same_decisions(
      cli_report(
          R"({"kernel_mapping": {"RMSNorm": "kernels-community/liger-kernels:LigerRMSNorm"}})"),
      r);
}

//   KernelConfig(kernel_mapping={"RMSNorm": {"cuda":
//   "kernels-community/liger-kernels:LigerRMSNorm",
//       "rocm": "kernels-community/liger-kernels:LigerRMSNorm", "xpu":
//       "kernels-community/rmsnorm:RMSNorm"}})
TEST_F(SeedExamples, L10_APerDeviceMapping) {
  const KernelConfig config{
      {{"RMSNorm",
        KernelMappingValue::devices({{"cuda", {"kernels-community/liger-kernels:LigerRMSNorm", {}}},
                                     {"rocm", {"kernels-community/liger-kernels:LigerRMSNorm", {}}},
                                     {"xpu", {"kernels-community/rmsnorm:RMSNorm", {}}}})}}};
  LoadOptions o = load_options();
  o.kernel_config = config;
  CausalLM model = load(o);
  const KernelizeReport& r = *model.kernelize_report();
  if (kCuda) {
    EXPECT_EQ(decision(r, kNorm).kernel, "kernels-community/liger-kernels:LigerRMSNorm");
    EXPECT_NE(decision(r, kNorm).reason.find("kernel_config"), std::string::npos);
  } else {
    // the mapping names no cpu entry: the cpu default stays
    EXPECT_EQ(decision(r, kNorm).kernel, "kernels-community/rmsnorm:RMSNorm");
    EXPECT_NE(decision(r, kNorm).reason.find("default table"), std::string::npos);
  }
  expect_same_logits(model);
  const std::string json = R"({"kernel_mapping": {"RMSNorm": {
      "cuda": "kernels-community/liger-kernels:LigerRMSNorm",
      "rocm": "kernels-community/liger-kernels:LigerRMSNorm",
      "xpu": "kernels-community/rmsnorm:RMSNorm"}}})";
  expect_same_decisions(cli_report(json), r);
  // xpu and rocm, which this machine has no runtime for: the simulated selection
  KernelizeOptions k;
  k.simulate = true;
  k.config = config;
  k.dtype = DType::BF16;
  k.device = Device{DeviceType::XPU, 0, 0};
  const KernelizeReport xpu = kernelize(model.module(), Mode::Inference, k);
  EXPECT_NE(decision(xpu, kNorm)
                .reason.find("kernels-community/rmsnorm:RMSNorm unusable: no "
                             "variant"),
            std::string::npos)
      << decision(xpu, kNorm).reason;
  k.device = Device{DeviceType::ROCM, 0, 94};
  const KernelizeReport rocm = kernelize(model.module(), Mode::Inference, k);
  EXPECT_NE(decision(rocm, kNorm).reason.find("kernels-community/liger-kernels:LigerRMSNorm"),
            std::string::npos);
  const auto cli_xpu = cli_report(json, "--device xpu");
  EXPECT_EQ(cli_xpu["simulated"], true);
}

//   KernelConfig(kernel_mapping={"RMSNorm": ("kernels-community/liger-kernels:LigerRMSNorm",
//   {"version": 3})})
TEST_F(SeedExamples, L11_AVersionTuple) {
  LoadOptions o = load_options();
  o.kernel_config =
      KernelConfig{{{"RMSNorm", {"kernels-community/liger-kernels:LigerRMSNorm", {.version = 3}}}}};
  CausalLM model = load(o);
  const KernelizeReport& r = *model.kernelize_report();
  EXPECT_EQ(decision(r, kNorm).kernel, "kernels-community/liger-kernels:LigerRMSNorm");
  EXPECT_NE(decision(r, kNorm).reason.find("liger-kernels@v3, version 3."), std::string::npos)
      << decision(r, kNorm).reason;
  expect_same_logits(model);
  expect_same_decisions(cli_report(R"({"kernel_mapping": {"RMSNorm":
      ["kernels-community/liger-kernels:LigerRMSNorm", {"version": 3}]}})"),
                        r);
  // a version that does not exist is an error naming the ones that do, not a silent fallback
  LoadOptions bad = load_options();
  bad.kernel_config =
      KernelConfig{{{"RMSNorm", {"kernels-community/liger-kernels:LigerRMSNorm", {.version = 9}}}}};
  try {
    load(bad);
    ADD_FAILURE() << "version 9 was accepted";
  } catch (const NotFound& e) {
    EXPECT_NE(std::string(e.what()).find("v3"), std::string::npos) << e.what();
  }
}

//   KernelConfig(kernel_mapping={"rotary_pos_emb":
//   ("kernels-community/rotary:apply_rotary_transformers",
//                {"version": 2})}, inherit_mapping=False)
TEST_F(SeedExamples, L12_OnlyTheGivenEntriesWithoutInheritedDefaults) {
  KernelConfig config{
      {{"rotary_pos_emb", {"kernels-community/rotary:apply_rotary_transformers", {.version = 2}}}}};
  config.inherit_mapping = false;
  LoadOptions o = load_options();
  o.use_kernels = true;
  o.kernel_config = config;
  CausalLM model = load(o);
  const KernelizeReport& r = *model.kernelize_report();
  EXPECT_EQ(decision(r, kRotary).kernel, "kernels-community/rotary:apply_rotary_transformers");
  EXPECT_NE(decision(r, kRotary).reason.find("rotary@v2, version 2."), std::string::npos);
  // everything else stays built-in
  for (const auto& d : r.layers)
    if (d.layer != "rotary_pos_emb") EXPECT_TRUE(d.kernel.empty()) << d.path << ": " << d.kernel;
  EXPECT_EQ(r.num_kernels(), 2u);  // the two decoder layers' rotary functions
  expect_same_logits(model);
  expect_same_decisions(cli_report(R"({"kernel_mapping": {"rotary_pos_emb":
      ["kernels-community/rotary:apply_rotary_transformers", {"version": 2}]},
      "inherit_mapping": false})"),
                        r);
}

// ---- Loading guide: "module fusion"
//   kernel_config = KernelConfig({(("RMSNorm", "model.layers.*.post_attention_layernorm"),
//                                  ("MLP", "model.layers.*.mlp")):
//                                  "owner/fused-rmsnorm-mlp:RMSNormMLP"})
//   model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-0.6B", use_kernels=True,
//                                                kernel_config=kernel_config, device_map="auto")
// "Fusion requires the kernel repo to ship a KernelNameLayout beside KernelName": RMSNormMLPLayout
// (tests/seeds/fused-rmsnorm-mlp), declared before the checkpoint loads.
TEST_F(SeedExamples, L13_FusionOfPostAttentionLayernormAndMlp) {
  const std::string kernel = "owner/fused-rmsnorm-mlp:RMSNormMLP";
  KernelConfig config;
  FusionRule fusion;
  fusion.modules = {{"RMSNorm", "model.layers.*.post_attention_layernorm"},
                    {"MLP", "model.layers.*.mlp"}};
  fusion.kernel.spec = kernel;
  config.fusions.push_back(fusion);
  const std::string json = R"({"fusions": [{"modules": [
      ["RMSNorm", "model.layers.*.post_attention_layernorm"], ["MLP", "model.layers.*.mlp"]],
      "kernel": "owner/fused-rmsnorm-mlp:RMSNormMLP"}]})";
  {  // as written: owner is not a trusted org, so the fusion falls back, saying so
    LoadOptions o = load_options();
    o.use_kernels = true;
    o.kernel_config = config;
    testing::internal::CaptureStderr();
    CausalLM model = load(o);
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_TRUE(decision(*model.kernelize_report(), kMlp).kernel.empty());
    EXPECT_NE(err.find("not from a trusted org"), std::string::npos) << err;
  }
  setenv("HK_TRUSTED_ORGS", "owner", 1);
  LoadOptions o = load_options();
  o.use_kernels = true;
  o.kernel_config = config;
  CausalLM model = load(o);
  unsetenv("HK_TRUSTED_ORGS");
  const KernelizeReport& r = *model.kernelize_report();
  for (const std::string layer : {"0", "1"})
    for (const std::string m : {"post_attention_layernorm", "mlp"}) {
      const LayerDecision& d = decision(r, "model.layers." + layer + "." + m);
      EXPECT_EQ(d.kernel, kernel) << d.path << ": " << d.reason;
      EXPECT_NE(d.reason.find("layout RMSNormMLPLayout, declared before the checkpoint loads"),
                std::string::npos)
          << d.reason;
    }
  // the other layers keep the device's defaults (use_kernels=True)
  EXPECT_FALSE(decision(r, kNorm).kernel.empty()) << decision(r, kNorm).reason;
  bool gate_up = false;
  for (auto& [name, p] : model.named_parameters())
    gate_up = gate_up || name == "model.layers.1.mlp.gate_up_proj.weight";
  EXPECT_TRUE(gate_up);
  expect_same_logits(model);
  expect_same_decisions(cli_report(json, "", {{"HK_TRUSTED_ORGS", "owner"}}), r);
}

//   kernel_mapping = {"RMSNorm": "/path/to/liger-kernels:LigerRMSNorm"}
//   kernel_config = KernelConfig(kernel_mapping, use_local_kernel=True)
TEST_F(SeedExamples, L14_LocalKernels) {
  // a liger-kernels build tree on disk: <dir>/build/<variant>/{lib, metadata.json}
  const fs::path hub = fs::path(test::binary_dir()) / "hub" / "kernels-community" / "liger-kernels";
  std::ifstream ref(hub / "refs" / "heads" / "v1");
  std::string commit;
  ref >> commit;
  const fs::path local = fs::path(scratch()) / "path" / "to" / "liger-kernels";
  fs::remove_all(local);
  fs::create_directories(local.parent_path());
  fs::copy(hub / commit, local, fs::copy_options::recursive);
  const std::string spec = local.string() + ":LigerRMSNorm";
  KernelConfig config{{{"RMSNorm", spec}}};
  config.use_local_kernel = true;
  LoadOptions o = load_options();
  o.use_kernels = true;
  o.kernel_config = config;
  CausalLM model = load(o);
  const KernelizeReport& r = *model.kernelize_report();
  EXPECT_EQ(decision(r, kNorm).kernel, spec) << decision(r, kNorm).reason;
  expect_same_logits(model);
  expect_same_decisions(
      cli_report(nlohmann::json{{"kernel_mapping", {{"RMSNorm", spec}}}, {"use_local_kernel", true}}
                     .dump()),
      r);
  // without use_local_kernel a path is refused with the reason
  LoadOptions bad = load_options();
  bad.kernel_config = KernelConfig{{{"RMSNorm", spec}}};
  EXPECT_THROW(load(bad), InvalidArgument);
}

//   export USE_HUB_KERNELS=0  # or OFF or NO
TEST_F(SeedExamples, L15_UseHubKernelsOffDisablesHubKernels) {
  for (const char* value : {"0", "OFF", "NO"}) {
    setenv("USE_HUB_KERNELS", value, 1);
    LoadOptions o = load_options();
    o.use_kernels = true;
    CausalLM model = load(o);
    unsetenv("USE_HUB_KERNELS");
    const KernelizeReport& r = *model.kernelize_report();
    EXPECT_EQ(r.num_kernels(), 0u) << value;
    EXPECT_NE(decision(r, kNorm).reason.find("USE_HUB_KERNELS"), std::string::npos);
    const auto cli = cli_report("", "", {{"USE_HUB_KERNELS", value}});
    for (const auto& l : cli["layers"]) EXPECT_TRUE(l["kernel"].is_null()) << l.dump();
  }
}

// ---- Writing guide: a stateful kernel with its layout -------------------------------------------
//   class CustomRMSNormLayout(nn.Module): conversion_mapping = [...]; self.scale = ...;
//       self.variance_epsilon = eps
//   class CustomRMSNorm(nn.Module): def forward(self, hidden_states): ...
//   kernel_config = KernelConfig({"RMSNorm": "owner/my-kernel:CustomRMSNorm"})
// hk's form is tests/seeds/my-kernel (an rms_norm@1 entry whose layout holds `scale`, renamed
// from the checkpoint's `weight`). owner is not a trusted org: loading its kernel runs its code,
// so hk asks for trust first (HK_TRUSTED_ORGS=owner, or allow_all_kernels / trust_remote_code).
TEST_F(SeedExamples, W1_CustomRMSNormWithItsLayout) {
  const KernelConfig config{{{"RMSNorm", "owner/my-kernel:CustomRMSNorm"}}};
  const std::string json = R"({"kernel_mapping": {"RMSNorm": "owner/my-kernel:CustomRMSNorm"}})";
  {  // as written: refused, with the reason on stderr, and the model still loads
    LoadOptions o = load_options();
    o.kernel_config = config;
    testing::internal::CaptureStderr();
    CausalLM model = load(o);
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_TRUE(decision(*model.kernelize_report(), kNorm).kernel.empty());
    EXPECT_NE(err.find("not from a trusted org"), std::string::npos) << err;
  }
  for (const bool via_env : {true, false}) {
    LoadOptions o = load_options();
    o.kernel_config = config;
    if (via_env)
      setenv("HK_TRUSTED_ORGS", "owner", 1);
    else
      o.allow_all_kernels = true;
    CausalLM model = load(o);
    unsetenv("HK_TRUSTED_ORGS");
    const KernelizeReport& r = *model.kernelize_report();
    for (const std::string& p : {kNorm, kQNorm, kFinalNorm}) {
      EXPECT_EQ(decision(r, p).kernel, "owner/my-kernel:CustomRMSNorm") << decision(r, p).reason;
      EXPECT_NE(decision(r, p).reason.find("layout CustomRMSNormLayout"), std::string::npos)
          << decision(r, p).reason;
    }
    expect_same_logits(model);
    const auto cli = via_env ? cli_report(json, "", {{"HK_TRUSTED_ORGS", "owner"}})
                             : cli_report(json, "--allow-all-kernels");
    expect_same_decisions(cli, r);
  }
}

}  // namespace
}  // namespace hk
