// `hk train` as a user runs it (the built binary): --json lines on success, the files a run
// leaves, one sentence and exit status 1 for each bad input, and kill -9 in the middle of a
// checkpoint save (the previous checkpoint stays complete, resume `latest` picks it and
// continues with the losses of an uninterrupted run).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>

#include "hk/train_checkpoint.h"
#include "train_test_util.h"

extern char** environ;

namespace hk {
namespace {

namespace fs = std::filesystem;

std::string base_args(const std::string& model, const std::string& out) {
  return "train --model " + test::model_fixture(model) + " --data " +
         test::train_fixture("corpus.txt") + " --output-dir " + out +
         " --block-size 32 --per-device-train-batch-size 2 --learning-rate 1e-3"
         " --lr-scheduler-type constant --weight-decay 0.01 --no-shuffle --logging-steps 1";
}

std::vector<nlohmann::json> json_lines(const std::string& out) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') lines.push_back(nlohmann::json::parse(line));
  return lines;
}

std::vector<double> losses_of(const std::vector<nlohmann::json>& lines) {
  std::vector<double> out;
  for (const auto& j : lines)
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  return out;
}

TEST(CliTrain, JsonLinesAndOutputFiles) {
  test::TempDir out;
  auto r = test::run_hk(base_args("qwen3-tiny", out.str()) + " --max-steps 4 --save-steps 2 --json",
                        /*stderr_to_null=*/true);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 5u) << r.out;  // 4 logged steps + the summary
  for (size_t i = 0; i < 4; ++i) {
    for (const char* key : {"step", "epoch", "loss", "grad_norm", "learning_rate", "tokens_per_s"})
      EXPECT_TRUE(lines[i][key].is_number()) << key << " in " << lines[i].dump();
    EXPECT_EQ(lines[i]["step"], i + 1);
  }
  // Step 1 is Transformers' first loss (golden-qwen3-b2.json).
  const auto ref = test::read_json(test::train_fixture("golden-qwen3-b2.json"));
  EXPECT_NEAR(lines[0]["loss"].get<double>(), ref["losses"][0].get<double>(), 1e-4);
  const auto& summary = lines.back();
  EXPECT_EQ(summary["global_step"], 4);
  EXPECT_TRUE(summary.contains("kernelize"));
  EXPECT_EQ(summary["last_checkpoint"], out / "checkpoint-4");
  for (const char* f : {"checkpoint-2", "checkpoint-4", "model.safetensors", "config.json",
                        "tokenizer.json", "loss_curve.svg"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  EXPECT_TRUE(missing_checkpoint_files(out / "checkpoint-2").empty());
  // The final model generates with hk generate.
  auto g = test::run_hk("generate --model " + out.str() + " --ids 1,2,3 --max-new-tokens 2 --json",
                        true);
  EXPECT_EQ(g.status, 0) << g.out;
}

TEST(CliTrain, TextModeReportsLigerNotesAndSaveTotalLimitRotates) {
  test::TempDir out;
  auto r = test::run_hk(base_args("qwen3-tiny", out.str()) +
                        " --max-steps 6 --save-steps 2 --save-total-limit 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("step 6"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("done: 6 steps"), std::string::npos) << r.out;
  const auto left = list_checkpoints(out.str());
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].first, 4);
  EXPECT_EQ(left[1].first, 6);
}

TEST(CliTrain, UseKernelsAndLigerTrainOnHubKernelsAndReportIt) {
  test::TempDir out;
  for (const char* flags :
       {"--use-kernels", "--use-liger-kernel", "--use-kernels --use-liger-kernel"}) {
    auto r = test::run_hk(
        base_args("qwen3-tiny", out.str()) + " --max-steps 2 --save-strategy no --json " + flags,
        /*stderr_to_null=*/true);
    ASSERT_EQ(r.status, 0) << flags << ": " << r.out;
    const auto lines = json_lines(r.out);
    ASSERT_EQ(lines.size(), 3u) << r.out;
    const auto& report = lines.back()["kernelize"];
    ASSERT_TRUE(report.is_object()) << flags << ": " << r.out;
    EXPECT_EQ(report["mode"], "training");
    size_t on_kernels = 0, liger = 0;
    for (const auto& l : report["layers"])
      if (l["kernel"].is_string()) {
        ++on_kernels;
        liger += l["kernel"].get<std::string>().rfind("kernels-community/liger-kernels:", 0) == 0;
      }
    EXPECT_GT(on_kernels, 0u) << flags;
    if (std::string(flags).find("liger") != std::string::npos) EXPECT_GT(liger, 0u) << flags;
  }
}

struct BadCase {
  const char* name;
  std::string args;
  const char* message;  // a piece of the sentence
};

TEST(CliTrain, BadInputIsOneSentenceAndExitOne) {
  test::TempDir out;
  test::write_text(out / "empty.txt", "");
  test::write_text(out / "blank.txt", "\n\n\n");
  test::write_text(out / "short.txt", "The kernel hub.\n");
  const std::string model = test::model_fixture("qwen3-tiny");
  const std::string corpus = test::train_fixture("corpus.txt");
  auto train = [&](const std::string& data, const std::string& extra) {
    return "train --model " + model + " --data " + data + " --output-dir " + (out / "run") +
           " --max-steps 2 " + extra;
  };
  // A checkpoint of Llama to resume Qwen3 from.
  ASSERT_EQ(test::run_hk(
                base_args("llama-tiny-bf16", out / "llama") + " --max-steps 1 --save-steps 1", true)
                .status,
            0);
  const std::vector<BadCase> cases = {
      {"missing data", train(out / "nope.txt", "--block-size 32"), "does not exist"},
      {"empty data", train(out / "empty.txt", "--block-size 32"), "has no text"},
      {"blank lines only", train(out / "blank.txt", "--block-size 32"), "has no text"},
      {"shorter than a block", train(out / "short.txt", "--block-size 32"), "fewer than one block"},
      {"block above context", train(corpus, "--block-size 4096"), "max_position_embeddings"},
      {"both CE flags", train(corpus, "--block-size 32 --liger-kernel-config cross_entropy=true"),
       "cannot both be true"},
      {"unknown liger key",
       train(corpus, "--block-size 32 --use-liger-kernel --liger-kernel-config fused_rope=true"),
       "known keys are"},
      {"unknown scheduler", train(corpus, "--block-size 32 --lr-scheduler-type polynomial"),
       "polynomial"},
      {"bad batch size", train(corpus, "--block-size 32 --per-device-train-batch-size 0"),
       "--per-device-train-batch-size"},
      {"unknown data format", train(model + "/config.json", "--block-size 32"),
       "unknown extension"},
      {"checkpoint of another model",
       train(corpus, "--block-size 32 --per-device-train-batch-size 2 --resume-from-checkpoint " +
                         (out / "llama/checkpoint-1")),
       "different model"},
      {"latest without checkpoints",
       train(corpus, "--block-size 32 --resume-from-checkpoint latest"), "no complete checkpoint"},
      {"missing model",
       "train --model " + (out / "nomodel") + " --data " + corpus + " --output-dir " +
           (out / "run"),
       "does not exist"},
  };
  for (const auto& c : cases) {
    auto r = test::run_hk(c.args);
    EXPECT_EQ(r.status, 1) << c.name << ": " << r.out;
    EXPECT_NE(r.out.find("hk: error: "), std::string::npos) << c.name << ": " << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.name << ": " << r.out;
    EXPECT_EQ(r.out.find("terminate"), std::string::npos) << c.name << ": " << r.out;
  }
}

// Starts `hk <args>` with HK_TRAIN_TEST_PAUSE_IN_SAVE=<step>; stderr goes to `log`.
pid_t spawn_hk(const std::string& args, const std::string& log, int64_t pause_step) {
  const std::string cmd = "exec " + test::hk_binary() + " " + args + " >/dev/null 2>" + log;
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  env_strings.push_back("HK_TRAIN_TEST_PAUSE_IN_SAVE=" + std::to_string(pause_step));
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), envp.data()),
            0);
  return pid;
}

TEST(CliTrain, KillDashNineMidSaveKeepsThePreviousCheckpointAndResumeContinues) {
  test::TempDir out;
  const std::string args = base_args("qwen3-tiny", out / "run") + " --max-steps 6 --save-steps 2";
  const std::string log = out / "stderr.log";
  const pid_t pid = spawn_hk(args, log, /*pause in the save of step*/ 4);
  ASSERT_GT(pid, 0);
  // Wait for the pause marker (the save of checkpoint-4 is half written).
  bool paused = false;
  for (int i = 0; i < 600 && !paused; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream in(log);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    paused = text.find("pausing inside checkpoint save") != std::string::npos;
  }
  const int killed = kill(pid, SIGKILL);  // also when it never paused: no stray process
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(paused) << "hk train never reached the save of step 4";
  ASSERT_EQ(killed, 0);
  ASSERT_TRUE(WIFSIGNALED(status));

  // checkpoint-2 complete, no checkpoint-4, the half save is a hidden directory.
  const std::string run = out / "run";
  EXPECT_TRUE(missing_checkpoint_files(run + "/checkpoint-2").empty());
  EXPECT_FALSE(fs::exists(run + "/checkpoint-4"));
  bool hidden = false;
  for (auto& e : fs::directory_iterator(run))
    hidden |= e.path().filename().string().rfind(".checkpoint-4.tmp-", 0) == 0;
  EXPECT_TRUE(hidden);
  EXPECT_EQ(last_checkpoint(run), run + "/checkpoint-2");

  // Resume latest: steps 3..6, with the losses of an uninterrupted run.
  auto resumed = test::run_hk(args + " --json --resume-from-checkpoint latest", true);
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  const auto lines = json_lines(resumed.out);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back()["resumed_from"], run + "/checkpoint-2");
  const auto tail = losses_of(lines);
  auto straight =
      test::run_hk(base_args("qwen3-tiny", out / "straight") + " --max-steps 6 --json", true);
  ASSERT_EQ(straight.status, 0) << straight.out;
  const auto full = losses_of(json_lines(straight.out));
  ASSERT_EQ(full.size(), 6u);
  ASSERT_EQ(tail.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(tail[i], full[i + 2]) << "step " << i + 3;
  // The leftover of the killed save is gone, checkpoint-4 and -6 are complete.
  for (auto& e : fs::directory_iterator(run))
    EXPECT_NE(e.path().filename().string().rfind(".checkpoint-", 0), 0u) << e.path();
  EXPECT_TRUE(missing_checkpoint_files(run + "/checkpoint-4").empty());
  EXPECT_TRUE(missing_checkpoint_files(run + "/checkpoint-6").empty());
}

}  // namespace
}  // namespace hk
