// hk.lock enforced by everything that loads kernels (issue "Security and robustness", item 2):
// `hk kernelize`, `hk generate` and AutoModelForCausalLM::from_pretrained (and its train()/eval()
// re-kernelize), with the lock given by --kernels-lock, HK_KERNELS_LOCK or LoadOptions. The hub is
// a copy of the test hub's kernels-community/rmsnorm whose branch v1 is moved after locking (from
// 1.1.0 to 1.0.0): without the lock the moved branch's code runs; with it, the locked commit does.
// A lock that does not pin a repo the model would load is an error unless the user opts out.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>

#include "hk/error.h"
#include "hk/hub.h"
#include "hk/models.h"
#include "hub_test_util.h"

namespace hk::hub {
namespace {

using namespace testing;
using namespace std::chrono_literals;

const std::string kRepo = "kernels-community/rmsnorm";

class LockEnforcement : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    const fs::path source = binary_dir() / "test-hub" / kRepo;
    ASSERT_TRUE(fs::is_directory(source)) << "test hub not published";
    fs::create_directories(hub_dir() / "kernels-community");
    fs::copy(source, hub_dir() / kRepo, fs::copy_options::recursive);
    locked_ = read_file(hub_dir() / kRepo / "refs/heads/v1").substr(0, 40);    // 1.1.0
    moved_ = read_file(hub_dir() / kRepo / "refs/tags/v1.0.0").substr(0, 40);  // 1.0.0
    ASSERT_NE(locked_, moved_);
    write_file(project() / "hk-kernels.json", "{\"" + kRepo + "\": 1}");
    auto r = run_hk({"kernels", "lock", project().string()}, env());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    write_ref(hub_dir(), kRepo, "heads", "v1", moved_);  // the branch moves after locking
    write_file(config_file(), "{\"kernel_mapping\": {\"RMSNorm\": \"" + kRepo +
                                  ":RMSNorm\"}, \"inherit_mapping\": false}");
    // A lock that pins some other repo only.
    write_file(other_lock(),
               "[{\"repo\": \"kernels-community/other\", \"version\": 1, \"commit\": \"" +
                   std::string(40, 'e') + "\", \"variants\": {}}]");
  }
  static void TearDownTestSuite() { delete tmp_; }

  static fs::path hub_dir() { return tmp_->path() / "hub"; }
  static fs::path project() { return tmp_->path() / "project"; }
  static fs::path lock() { return project() / "hk.lock"; }
  static fs::path other_lock() { return tmp_->path() / "other.lock"; }
  static fs::path config_file() { return tmp_->path() / "kernel-config.json"; }
  static std::string model_path() { return model().string(); }
  static fs::path model() {
    return fs::path(std::getenv("HK_SOURCE_DIR")) / "tests/fixtures/models/qwen3-tiny";
  }
  static std::map<std::string, std::string> env(std::map<std::string, std::string> extra = {}) {
    std::map<std::string, std::string> e{{"HK_HUB_DIR", hub_dir().string()},
                                         {"HK_ENDPOINT", "<unset>"},
                                         {"HK_KERNELS_CACHE", (tmp_->path() / "cache").string()},
                                         {"HK_KERNELS_LOCK", "<unset>"},
                                         {"HK_ALLOW_UNLOCKED_KERNELS", "<unset>"},
                                         {"USE_HUB_KERNELS", "<unset>"},
                                         {"LOCAL_KERNELS", "<unset>"}};
    for (auto& [k, v] : extra) e[k] = v;
    return e;
  }
  // The commit every RMSNorm layer of a --json kernelize report was bound to ("" = built-in).
  static std::set<std::string> rmsnorm_revisions(const nlohmann::json& report) {
    std::set<std::string> out;
    for (const auto& l : report["layers"])
      if (l["layer"] == "RMSNorm")
        out.insert(l["kernel"].is_null() ? "" : l["revision"].get<std::string>());
    return out;
  }
  static std::set<std::string> rmsnorm_revisions(const KernelizeReport& report) {
    std::set<std::string> out;
    for (const auto& l : report.layers)
      if (l.layer == "RMSNorm") out.insert(l.kernel.empty() ? "" : l.revision);
    return out;
  }
  void SetUp() override {
    setenv("HK_HUB_DIR", hub_dir().c_str(), 1);
    setenv("HK_KERNELS_CACHE", (tmp_->path() / "cache").c_str(), 1);
    for (const char* v : {"HK_ENDPOINT", "HK_KERNELS_LOCK", "HK_ALLOW_UNLOCKED_KERNELS",
                          "USE_HUB_KERNELS", "LOCAL_KERNELS"})
      unsetenv(v);
  }

  static TempDir* tmp_;
  static std::string locked_, moved_;
};
TempDir* LockEnforcement::tmp_ = nullptr;
std::string LockEnforcement::locked_, LockEnforcement::moved_;

TEST_F(LockEnforcement, KernelizeCommand) {
  const std::vector<std::string> base{
      "kernelize", "--model", model().string(), "--kernel-config", config_file().string(),
      "--report",  "--json"};
  auto run = [&](std::vector<std::string> extra, std::map<std::string, std::string> e = {}) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return run_hk(args, env(e), 60s);
  };
  auto unlocked = run({});
  ASSERT_EQ(unlocked.exit_code, 0) << unlocked.err;
  EXPECT_EQ(rmsnorm_revisions(nlohmann::json::parse(unlocked.out)), std::set{moved_})
      << "without a lock the moved branch's code runs";
  auto flag = run({"--kernels-lock", lock().string()});
  ASSERT_EQ(flag.exit_code, 0) << flag.err;
  EXPECT_EQ(rmsnorm_revisions(nlohmann::json::parse(flag.out)), std::set{locked_});
  auto by_env = run({}, {{"HK_KERNELS_LOCK", lock().string()}});
  ASSERT_EQ(by_env.exit_code, 0) << by_env.err;
  EXPECT_EQ(rmsnorm_revisions(nlohmann::json::parse(by_env.out)), std::set{locked_});
  // A lock that does not pin the repo: an error naming it, unless the user opts out.
  auto uncovered = run({"--kernels-lock", other_lock().string()});
  EXPECT_EQ(uncovered.exit_code, 1);
  EXPECT_NE(uncovered.err.find("does not pin kernel repo " + kRepo), std::string::npos)
      << uncovered.err;
  auto opted_out = run({"--kernels-lock", other_lock().string(), "--allow-unlocked-kernels"});
  ASSERT_EQ(opted_out.exit_code, 0) << opted_out.err;
  EXPECT_EQ(rmsnorm_revisions(nlohmann::json::parse(opted_out.out)), std::set{moved_});
  // The default mapping loads more repos than this lock pins: that is an error too.
  auto defaults = run_hk(
      {"kernelize", "--model", model().string(), "--report", "--kernels-lock", lock().string()},
      env(), 60s);
  EXPECT_EQ(defaults.exit_code, 1);
  EXPECT_NE(defaults.err.find("does not pin kernel repo kernels-community/"), std::string::npos)
      << defaults.err;
}

TEST_F(LockEnforcement, ADuplicateKeyInAKernelConfigIsRefused) {
  const fs::path dup = tmp_->path() / "dup.json";
  write_file(dup, "{\"kernel_mapping\": {\"RMSNorm\": \"" + kRepo +
                      ":RMSNorm\", \"RMSNorm\": \"someone-else/rmsnorm:RMSNorm\"}}");
  for (const char* command : {"kernelize", "generate"}) {
    std::vector<std::string> args{command, "--model", model().string(), "--kernel-config",
                                  dup.string()};
    if (std::string(command) == "kernelize")
      args.push_back("--report");
    else
      args.insert(args.end(), {"--ids", "1,2"});
    auto r = run_hk(args, env(), 60s);
    EXPECT_EQ(r.exit_code, 1) << command;
    EXPECT_NE(r.err.find("has the key \"RMSNorm\" twice"), std::string::npos) << r.err;
  }
}

TEST_F(LockEnforcement, GenerateCommand) {
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{
        "generate", "--model",         model().string(),       "--ids", "1,2,3", "--max-new-tokens",
        "2",        "--kernel-config", config_file().string(), "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_hk(args, env(), 60s);
  };
  auto unlocked = run({});
  ASSERT_EQ(unlocked.exit_code, 0) << unlocked.err;
  EXPECT_EQ(rmsnorm_revisions(nlohmann::json::parse(unlocked.out)["kernelize"]), std::set{moved_});
  auto locked = run({"--kernels-lock", lock().string()});
  ASSERT_EQ(locked.exit_code, 0) << locked.err;
  EXPECT_EQ(rmsnorm_revisions(nlohmann::json::parse(locked.out)["kernelize"]), std::set{locked_});
  auto uncovered = run({"--kernels-lock", other_lock().string()});
  EXPECT_EQ(uncovered.exit_code, 1);
  EXPECT_NE(uncovered.err.find("does not pin kernel repo " + kRepo), std::string::npos)
      << uncovered.err;
}

TEST_F(LockEnforcement, FromPretrainedAndTrainEval) {
  LoadOptions options;
  options.kernel_config_file = config_file().string();
  options.kernels_lock = lock().string();
  CausalLM lm = AutoModelForCausalLM::from_pretrained(model_path(), options);
  ASSERT_NE(lm.kernelize_report(), nullptr);
  EXPECT_EQ(rmsnorm_revisions(*lm.kernelize_report()), std::set{locked_});
  lm.train();  // re-kernelized for training with the same lock
  EXPECT_EQ(rmsnorm_revisions(*lm.kernelize_report()), std::set{locked_});
  lm.eval();
  EXPECT_EQ(rmsnorm_revisions(*lm.kernelize_report()), std::set{locked_});

  // HK_KERNELS_LOCK applies when LoadOptions names no lock.
  setenv("HK_KERNELS_LOCK", lock().c_str(), 1);
  LoadOptions by_env;
  by_env.kernel_config_file = config_file().string();
  CausalLM m2 = AutoModelForCausalLM::from_pretrained(model_path(), by_env);
  EXPECT_EQ(rmsnorm_revisions(*m2.kernelize_report()), std::set{locked_});
  m2.train();
  EXPECT_EQ(rmsnorm_revisions(*m2.kernelize_report()), std::set{locked_});
  unsetenv("HK_KERNELS_LOCK");

  LoadOptions uncovered = options;
  uncovered.kernels_lock = other_lock().string();
  try {
    AutoModelForCausalLM::from_pretrained(model_path(), uncovered);
    FAIL() << "a kernel outside the lock was loaded";
  } catch (const IntegrityError& e) {
    EXPECT_NE(std::string(e.what()).find("does not pin kernel repo " + kRepo), std::string::npos)
        << e.what();
  }
  uncovered.allow_unlocked_kernels = true;
  CausalLM m3 = AutoModelForCausalLM::from_pretrained(model_path(), uncovered);
  EXPECT_EQ(rmsnorm_revisions(*m3.kernelize_report()), std::set{moved_});
}

TEST_F(LockEnforcement, ALockWithOtherDigestsKeepsTheKernelOut) {
  Lockfile tampered = load_lockfile(lock());
  for (auto& [variant, files] : tampered.repos.at(0).variants)
    for (auto& [file, sha] : files) sha = std::string(64, '0');
  const fs::path path = tmp_->path() / "tampered.lock";
  save_lockfile(path, tampered);
  LoadOptions options;
  options.kernel_config_file = config_file().string();
  options.kernels_lock = path.string();
  CausalLM lm = AutoModelForCausalLM::from_pretrained(model_path(), options);
  for (const auto& l : lm.kernelize_report()->layers) {
    if (l.layer != "RMSNorm") continue;
    EXPECT_TRUE(l.kernel.empty()) << l.path << " bound " << l.kernel;
    EXPECT_NE(l.reason.find("hk.lock pins " + std::string(64, '0')), std::string::npos) << l.reason;
  }
}

}  // namespace
}  // namespace hk::hub
