// from_pretrained: sharded and single checkpoints, and the bad-input errors (missing directory or
// file, unknown model_type, missing tensors, corrupt file, wrong shapes) each naming the problem.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "hk/checkpoint.h"
#include "hk/error.h"
#include "hk/models.h"
#include "hk/safetensors.h"

namespace hk {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) {
  return std::string(HK_TEST_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

// A scratch copy of a fixture that a test may break.
class BrokenModel : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("hk_models_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::copy(fixture("qwen3-tiny"), dir_, fs::copy_options::recursive);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string error() {
    try {
      AutoModelForCausalLM::from_pretrained(dir_.string());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  void rewrite(const std::string& file, const std::string& from, const std::string& to) {
    std::ifstream in(dir_ / file);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto pos = text.find(from);
    ASSERT_NE(pos, std::string::npos) << from;
    text.replace(pos, from.size(), to);
    std::ofstream(dir_ / file, std::ios::trunc) << text;
  }
  // Rewrites model.safetensors without `drop` (and with `add` when given).
  void resave(const std::string& drop, const std::string& add = "") {
    auto file = SafetensorsFile::open((dir_ / "model.safetensors").string());
    std::vector<Tensor> keep;
    std::vector<std::pair<std::string, TensorView>> tensors;
    for (const auto& info : file.tensors()) {
      if (info.name == drop) continue;
      keep.push_back(file.load(info.name));
      tensors.emplace_back(info.name, keep.back().view());
    }
    Tensor extra = Tensor::zeros({3}, DType::F32);
    if (!add.empty()) tensors.emplace_back(add, extra.view());
    save_safetensors((dir_ / "model.safetensors").string(), tensors);
  }
  fs::path dir_;
};

TEST(Loading, ShardedAndSingleCheckpointsLoad) {
  CausalLM sharded = AutoModelForCausalLM::from_pretrained(fixture("qwen3-tiny-bf16"));
  EXPECT_TRUE(Checkpoint::open(fixture("qwen3-tiny-bf16")).sharded());
  EXPECT_EQ(sharded.dtype(), DType::BF16);
  EXPECT_TRUE(sharded.module().find_module("lm_head")->slot("weight").tied_to.empty());
  CausalLM single = AutoModelForCausalLM::from_pretrained(fixture("qwen3-tiny"));
  EXPECT_EQ(single.module().find_module("lm_head")->slot("weight").tied_to,
            "model.embed_tokens.weight");
  EXPECT_EQ(single.generation_config().eos_token_ids, (std::vector<int64_t>{3000}));
  CausalLM llama = AutoModelForCausalLM::from_pretrained(fixture("llama-tiny-bf16"));
  EXPECT_EQ(llama.config().rope.rope_type, "llama3");
  EXPECT_EQ(llama.module().type_name(), "LlamaForCausalLM");
}

TEST(Loading, MissingDirectoryAndFiles) {
  EXPECT_THROW(AutoModelForCausalLM::from_pretrained("/nonexistent/model"), NotFound);
  fs::path empty = fs::temp_directory_path() / ("hk_models_empty_" + std::to_string(::getpid()));
  fs::create_directories(empty);
  try {
    AutoModelForCausalLM::from_pretrained(empty.string());
    FAIL();
  } catch (const NotFound& e) {
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
  }
  fs::remove_all(empty);
}

TEST_F(BrokenModel, MissingWeightsFile) {
  fs::remove(dir_ / "model.safetensors");
  EXPECT_NE(error(), "");
}

TEST_F(BrokenModel, UnknownModelType) {
  rewrite("config.json", "\"model_type\": \"qwen3\"", "\"model_type\": \"mamba9\"");
  std::string msg = error();
  EXPECT_NE(msg.find("model_type 'mamba9' is not supported"), std::string::npos) << msg;
  EXPECT_NE(msg.find("llama, qwen3"), std::string::npos) << msg;
}

TEST_F(BrokenModel, MissingTensorIsNamed) {
  resave("model.layers.1.mlp.up_proj.weight");
  std::string msg = error();
  EXPECT_NE(msg.find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

TEST_F(BrokenModel, UnexpectedTensorIsNamed) {
  resave("", "model.layers.0.mlp.extra.weight");
  std::string msg = error();
  EXPECT_NE(msg.find("model.layers.0.mlp.extra.weight"), std::string::npos) << msg;
}

TEST_F(BrokenModel, CorruptFileIsReported) {
  auto size = fs::file_size(dir_ / "model.safetensors");
  fs::resize_file(dir_ / "model.safetensors", size / 2);
  std::string msg = error();
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
}

TEST_F(BrokenModel, WrongShapesNameBothShapes) {
  rewrite("config.json", "\"intermediate_size\": 128", "\"intermediate_size\": 96");
  std::string msg = error();
  // The first mismatch in name order: down_proj [hidden, intermediate].
  EXPECT_NE(msg.find("model.layers.0.mlp.down_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has shape [64, 128] but the model expects [64, 96]"), std::string::npos)
      << msg;
}

}  // namespace
}  // namespace hk

namespace hk {
namespace {

TEST(Loading, UseKernelsKernelizesAndTrainEvalReKernelize) {
  CausalLM plain = AutoModelForCausalLM::from_pretrained(fixture("qwen3-tiny"));
  EXPECT_EQ(plain.kernelize_report(), nullptr);
  CausalLM lm = AutoModelForCausalLM::from_pretrained(fixture("qwen3-tiny"), {.use_kernels = true});
  const KernelizeReport* report = lm.kernelize_report();
  ASSERT_NE(report, nullptr);
  EXPECT_EQ(report->mode, Mode::Inference);
  ASSERT_NE(report->find("model.layers.0.input_layernorm"), nullptr);
  // Whatever got bound, the numbers stay those of the built-in path.
  Tensor ids = Tensor::from_ints({5, 17, 42, 7}, {1, 4});
  auto a = lm.forward(ids, ForwardOptions{.logits_to_keep = 1}).logits.to_doubles();
  auto b = plain.forward(ids, ForwardOptions{.logits_to_keep = 1}).logits.to_doubles();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4);
  lm.train();
  EXPECT_EQ(lm.kernelize_report()->mode, Mode::Training);
  lm.eval();
  EXPECT_EQ(lm.kernelize_report()->mode, Mode::Inference);
}

}  // namespace
}  // namespace hk
