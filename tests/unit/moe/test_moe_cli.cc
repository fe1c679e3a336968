// The `hk` command line on the Qwen3-MoE fixtures, as a user runs it: `hk generate` gives
// Transformers' greedy ids (built-in block and megablocks' cpu variant), `hk kernelize --report
// --json` lists the MoE blocks with their decisions, and `hk train` trains a MoE model (router
// aux loss from the config) into a checkpoint that hk loads back.
#include <gtest/gtest.h>

#include "unit/train/train_test_util.h"

namespace hk {
namespace {

using test::run_hk;

std::string ids_arg(const nlohmann::json& ids) {
  std::string out;
  for (auto& id : ids) out += (out.empty() ? "" : ",") + std::to_string(id.get<int64_t>());
  return out;
}

class MoeCli : public ::testing::Test {
 protected:
  void SetUp() override { setenv("HK_KERNELS_CACHE", (dir_ / "cache").c_str(), 1); }
  void TearDown() override { unsetenv("HK_KERNELS_CACHE"); }
  test::TempDir dir_;
};

TEST_F(MoeCli, GenerateGivesTransformersGreedyIds) {
  const std::string model = test::model_fixture("qwen3-moe-tiny");
  const auto expected = test::read_json(model + "/expected.json");
  test::write_text(dir_ / "megablocks.json",
                   R"({"kernel_mapping": {"MoeMLP": "kernels-community/megablocks"}})");
  for (const std::string& extra :
       {std::string(), " --kernel-config " + (dir_ / "megablocks.json")}) {
    for (size_t i = 0; i < expected["prompts"].size(); ++i) {
      test::CliRun r =
          run_hk("generate --model " + model + " --ids " + ids_arg(expected["prompts"][i]["ids"]) +
                     " --max-new-tokens 8 --json" + extra,
                 /*stderr_to_null=*/true);
      ASSERT_EQ(r.status, 0) << r.out;
      auto j = nlohmann::json::parse(r.out);
      EXPECT_EQ(j["ids"], expected["greedy"][i]) << "prompt " << i << extra;
      if (!extra.empty())
        for (auto& layer : j["kernelize"]["layers"])
          if (layer["layer"] == "MoeMLP")
            EXPECT_EQ(layer["kernel"], "kernels-community/megablocks:MegaBlocksMoeMLP") << layer;
    }
  }
}

TEST_F(MoeCli, KernelizeReportListsTheMoeBlocks) {
  test::write_text(dir_ / "megablocks.json",
                   R"({"kernel_mapping": {"MoeMLP": "kernels-community/megablocks"}})");
  test::CliRun r = run_hk("kernelize --model " + test::model_fixture("qwen3-moe-tiny") +
                              " --mode training --kernel-config " + (dir_ / "megablocks.json") +
                              " --report --json",
                          true);
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  std::vector<std::string> moe;
  for (auto& layer : j["layers"])
    if (layer["layer"] == "MoeMLP") {
      moe.push_back(layer["path"]);
      EXPECT_EQ(layer["kernel"], "kernels-community/megablocks:MegaBlocksMoeMLP") << layer;
      EXPECT_EQ(layer["variant"], "hk1-cpu-x86_64-linux");
    }
  EXPECT_EQ(moe, (std::vector<std::string>{"model.layers.0.mlp", "model.layers.2.mlp"}));
  EXPECT_EQ(j["mode"], "training");
}

TEST_F(MoeCli, TrainWritesACheckpointThatLoadsBack) {
  const std::string out = dir_ / "run";
  test::CliRun r = run_hk("train --model " + test::model_fixture("qwen3-moe-tiny") + " --data " +
                              test::train_fixture("corpus.txt") + " --output-dir " + out +
                              " --block-size 32 --per-device-train-batch-size 2 --max-steps 3" +
                              " --logging-steps 1 --save-steps 3 --learning-rate 1e-3 --json",
                          true);
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string last = r.out.substr(r.out.rfind('{'));
  auto summary = nlohmann::json::parse(last);
  EXPECT_EQ(summary["global_step"], 3);
  EXPECT_TRUE(std::isfinite(summary["train_loss"].get<double>()));
  // The trained model (stacked expert tensors, as Transformers 5.x holds them) generates.
  test::CliRun g =
      run_hk("generate --model " + out + " --ids 39,476,320 --max-new-tokens 3 --json", true);
  ASSERT_EQ(g.status, 0) << g.out;
  EXPECT_EQ(nlohmann::json::parse(g.out)["ids"].size(), 3u);
}

}  // namespace
}  // namespace hk
