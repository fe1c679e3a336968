// The command line's small promises, as a user meets them: an unknown command names itself, a
// missing --model directory says so, every text-mode output ends with a newline, `hk kernels
// info REPO` without a version lists every release, `hk kernelize --device cuda --capability 90
// --cuda-runtime 13.0 --report` shows the selection for a GPU this machine does not have
// (nothing loaded, and it says so), an explicitly requested kernel that falls back warns on stderr
// (also in `hk generate`), and hk-kernel-dump takes --help and a relative path.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/cli_testing.h"

namespace hk {
namespace {

using test::run_cli;
using test::shell_quote;

const std::vector<std::pair<std::string, std::string>> kCleanEnv = {
    {"HK_HUB_DIR", ""}, {"HK_ENDPOINT", ""}, {"LOCAL_KERNELS", ""}, {"USE_HUB_KERNELS", ""}};

std::string model() {
  return shell_quote(test::source_dir() + "/tests/fixtures/models/qwen3-tiny");
}

TEST(CliUx, AnUnknownCommandNamesItself) {
  auto r = run_cli("frobnicate --json", kCleanEnv);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("unknown command 'frobnicate'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("generate"), std::string::npos) << r.err;
  // known commands still parse
  EXPECT_EQ(run_cli("kernels list", kCleanEnv).status, 0);
}

TEST(CliUx, AMissingModelDirectorySaysSo) {
  for (const char* cmd :
       {"generate --model /nonexistent/m --prompt hi", "generate --model /nonexistent/m --ids 1",
        "kernelize --model "
        "/nonexistent/m --report"}) {
    auto r = run_cli(cmd, kCleanEnv);
    EXPECT_EQ(r.status, 1) << cmd;
    EXPECT_NE(r.err.find("/nonexistent/m does not exist"), std::string::npos)
        << cmd << ": " << r.err;
  }
}

TEST(CliUx, TextOutputEndsWithANewline) {
  const std::string m = model();
  for (const std::string& cmd :
       {std::string("kernels list"), std::string("kernels info kernels-community/rotary"),
        std::string("kernels versions kernels-community/rotary"),
        std::string("kernels explain kernels-community/rotary"),
        std::string("kernels verify kernels-community/rotary"), "inspect " + m,
        "tokenize --model " + m + " --text hi", "tokenize --model " + m + " --ids 71,72",
        "kernelize --model " + m + " --report",
        "kernelize --model " + m + " --device cuda --capability 90 --report",
        "generate --model " + m + " --ids 1,2 --max-new-tokens 2",
        "generate --model " + m + " --prompt hi --max-new-tokens 0", std::string("--version")}) {
    auto r = run_cli(cmd, kCleanEnv);
    EXPECT_EQ(r.status, 0) << cmd << ": " << r.err;
    ASSERT_FALSE(r.out.empty()) << cmd;
    EXPECT_EQ(r.out.back(), '\n') << cmd << " printed " << r.out;
  }
}

TEST(CliUx, KernelsInfoWithoutAVersionListsEveryRelease) {
  // liger-kernels has branches v1 and v3; no version used to mean "v1 or fail".
  auto r = run_cli("kernels info kernels-community/liger-kernels --json", kCleanEnv);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  std::vector<std::string> versions = j["versions"];
  EXPECT_NE(std::find(versions.begin(), versions.end(), "1.0.0"), versions.end()) << r.out;
  EXPECT_NE(std::find(versions.begin(), versions.end(), "3.1.0"), versions.end()) << r.out;
  ASSERT_GE(j["releases"].size(), 2u);
  for (const auto& release : j["releases"]) {
    EXPECT_EQ(release["commit"].get<std::string>().size(), 40u);
    EXPECT_FALSE(release["variants"].empty()) << release.dump();
    // each build says what it is
    EXPECT_NE(release["description"].get<std::string>().find("same sources"), std::string::npos);
  }
  EXPECT_EQ(j["ref"], "v1");  // what a config without a version gets
  EXPECT_FALSE(j["variants"].empty());
  auto text = run_cli("kernels info kernels-community/liger-kernels", kCleanEnv);
  EXPECT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("3.1.0"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("branch v3"), std::string::npos) << text.out;
  // with a version it is one release, as before
  auto v3 = run_cli("kernels info kernels-community/liger-kernels@v3 --json", kCleanEnv);
  ASSERT_EQ(v3.status, 0) << v3.err;
  EXPECT_EQ(nlohmann::json::parse(v3.out)["ref"], "v3");
}

TEST(CliUx, KernelizeShowsTheSelectionForADeviceThisMachineLacks) {
  auto r = run_cli("kernelize --model " + model() +
                       " --device cuda --capability 90 --cuda-runtime 13.0 --dtype bf16 --report "
                       "--json",
                   kCleanEnv);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["simulated"], true);
  EXPECT_NE(j["target"].get<std::string>().find("cuda sm_90, CUDA 13.0"), std::string::npos);
  bool saw_norm = false;
  for (const auto& layer : j["layers"]) {
    if (layer["path"] != "model.layers.0.input_layernorm") continue;
    saw_norm = true;
    if (layer["kernel"].is_null()) {  // a build without CUDA: no cuda variant, and it says why
      EXPECT_NE(layer["reason"].get<std::string>().find("cuda"), std::string::npos);
    } else {
      EXPECT_EQ(layer["kernel"], "kernels-community/liger-kernels:LigerRMSNorm");
      EXPECT_NE(layer["reason"].get<std::string>().find("nothing loaded"), std::string::npos);
    }
  }
  EXPECT_TRUE(saw_norm) << r.out;
  auto text = run_cli("kernelize --model " + model() + " --device xpu --report", kCleanEnv);
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("simulated selection for xpu"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("nothing was fetched or loaded"), std::string::npos) << text.out;
  // an impossible flag combination is a sentence
  auto bad =
      run_cli("kernelize --model " + model() + " --device cpu --capability 90 --report", kCleanEnv);
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("--capability"), std::string::npos) << bad.err;
}

TEST(CliUx, GenerateWarnsWhenAnExplicitKernelFallsBack) {
  const std::string dir = ::testing::TempDir() + "/hk_cli_ux_config";
  std::filesystem::create_directories(dir);
  const std::string config = dir + "/kernel_config.json";
  std::ofstream(config)
      << R"({"kernel_mapping": {"RMSNorm": "kernels-community/rmsnorm:Missing"}})";
  auto r = run_cli("generate --model " + model() +
                       " --ids 1,2 --max-new-tokens 2 --kernel-config " + shell_quote(config),
                   kCleanEnv);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("hk: warning: an explicitly requested kernel falls back"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("has no entry Missing"), std::string::npos) << r.err;
  // without a config (defaults only) nothing is warned
  auto quiet = run_cli(
      "generate --model " + model() + " --ids 1,2 --max-new-tokens 2 --use-kernels", kCleanEnv);
  ASSERT_EQ(quiet.status, 0);
  EXPECT_EQ(quiet.err.find("warning"), std::string::npos) << quiet.err;
}

TEST(CliUx, KernelDumpTakesHelpAndARelativePath) {
  const std::string dump =
      std::filesystem::absolute(test::binary_dir() + "/bin/hk-kernel-dump").string();
  auto help = run_cli("--help", {}, dump);
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.out.find("usage: hk-kernel-dump"), std::string::npos) << help.out;
  // a file name in the current directory (dlopen alone would search the library path)
  namespace fs = std::filesystem;
  fs::path lib;
  for (const auto& e : fs::recursive_directory_iterator(test::binary_dir() + "/hub"))
    if (e.path().filename() == "librmsnorm.so" &&
        e.path().parent_path().filename().string().find("-cpu-") != std::string::npos)
      lib = e.path();
  ASSERT_FALSE(lib.empty());
  auto rel = run_cli("librmsnorm.so", {}, dump, lib.parent_path().string());
  EXPECT_EQ(rel.status, 0) << rel.err;
  EXPECT_NE(rel.out.find("\"RMSNorm\""), std::string::npos) << rel.out;
  EXPECT_EQ(run_cli("", {}, dump).status, 1);
}

}  // namespace
}  // namespace hk
