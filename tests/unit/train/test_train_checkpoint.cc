// Checkpoint directories: atomic commit, what resume may pick, rotation, stale leftovers, and
// trainer_state.json in Transformers' shape.
#include <gtest/gtest.h>

#include <filesystem>

#include "hk/error.h"
#include "hk/train_checkpoint.h"
#include "train_test_util.h"

namespace hk {
namespace {

namespace fs = std::filesystem;

const char* const kRequired[] = {"model.safetensors",     "config.json",     "trainer_state.json",
                                 "optimizer.safetensors", "optimizer.json",  "scheduler.json",
                                 "rng_state.json",        "data_state.json", "hk_checkpoint.json"};

std::string write_complete(const std::string& out, int64_t step) {
  CheckpointWriter w(out, step);
  for (const char* f : kRequired) w.write_text(f, "{}");
  return w.commit();
}

TEST(TrainCheckpoint, WriterStagesHiddenAndCommitsByRename) {
  test::TempDir out;
  std::string staging;
  {
    CheckpointWriter w(out.str(), 5);
    staging = w.staging_dir();
    EXPECT_EQ(fs::path(staging).filename().string().rfind(".checkpoint-5.tmp-", 0), 0u);
    w.write_text("a.json", "{}");
    EXPECT_TRUE(list_checkpoints(out.str()).empty());  // nothing visible before commit
  }                                                    // not committed: cleaned up
  EXPECT_FALSE(fs::exists(staging));
  EXPECT_TRUE(list_checkpoints(out.str()).empty());
  const std::string dir = write_complete(out.str(), 5);
  EXPECT_EQ(dir, out / "checkpoint-5");
  EXPECT_TRUE(missing_checkpoint_files(dir).empty());
  // Re-saving the same step replaces it.
  write_complete(out.str(), 5);
  EXPECT_EQ(list_checkpoints(out.str()).size(), 1u);
}

TEST(TrainCheckpoint, LatestSkipsIncompleteAndForeignDirectories) {
  test::TempDir out;
  write_complete(out.str(), 10);
  write_complete(out.str(), 20);
  fs::create_directories(out / "checkpoint-30");  // e.g. copied by hand, half there
  test::write_text(out / "checkpoint-30/model.safetensors", "x");
  fs::create_directories(out / "checkpoint-x");
  fs::create_directories(out / ".checkpoint-40.tmp-123");
  EXPECT_EQ(last_checkpoint(out.str()), out / "checkpoint-20");
  EXPECT_EQ(list_checkpoints(out.str()).size(), 3u);  // 10, 20, 30 (by name)
  EXPECT_FALSE(last_checkpoint(out / "nonexistent").has_value());
  remove_stale_checkpoint_dirs(out.str());
  EXPECT_FALSE(fs::exists(out / ".checkpoint-40.tmp-123"));
}

TEST(TrainCheckpoint, RotationKeepsTheNewestAndTheProtectedOne) {
  test::TempDir out;
  for (int s : {2, 4, 6, 8}) write_complete(out.str(), s);
  rotate_checkpoints(out.str(), 2);
  auto left = list_checkpoints(out.str());
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].first, 6);
  EXPECT_EQ(left[1].first, 8);
  rotate_checkpoints(out.str(), 1, out / "checkpoint-6");
  left = list_checkpoints(out.str());
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].first, 6);
  // Steps sort numerically, not by name.
  write_complete(out.str(), 10);
  rotate_checkpoints(out.str(), 1);
  EXPECT_EQ(list_checkpoints(out.str())[0].first, 10);
}

TEST(TrainCheckpoint, TrainerStateJsonRoundTripsInTransformersShape) {
  TrainerState s;
  s.epoch = 0.5;
  s.global_step = 12;
  s.max_steps = 24;
  s.logging_steps = 1;
  s.train_batch_size = 2;
  s.num_train_epochs = 1;
  s.log_history = {{1, 0.05, 9.5, 3.25, 1e-3}, {2, 0.1, 9.25, std::nullopt, 1e-3}};
  const std::string text = s.to_json();
  const auto j = nlohmann::json::parse(text);
  for (const char* key : {"best_global_step",
                          "best_metric",
                          "best_model_checkpoint",
                          "epoch",
                          "eval_steps",
                          "global_step",
                          "is_hyper_param_search",
                          "is_local_process_zero",
                          "is_world_process_zero",
                          "log_history",
                          "logging_steps",
                          "max_steps",
                          "num_input_tokens_seen",
                          "num_train_epochs",
                          "save_steps",
                          "stateful_callbacks",
                          "total_flos",
                          "train_batch_size",
                          "trial_name",
                          "trial_params"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["log_history"][0]["grad_norm"], 3.25);
  EXPECT_FALSE(j["log_history"][1].contains("grad_norm"));
  TrainerState back = TrainerState::from_json(text, "t.json");
  EXPECT_EQ(back.global_step, 12);
  ASSERT_EQ(back.log_history.size(), 2u);
  EXPECT_EQ(back.log_history[0].loss, 9.5);
  EXPECT_THROW(TrainerState::from_json("[1]", "t.json"), InvalidArgument);
  EXPECT_THROW(TrainerState::from_json("{\"epoch\": \"x\"}", "t.json"), InvalidArgument);
}

TEST(TrainCheckpoint, AtomicFileWrite) {
  test::TempDir dir;
  write_file_atomically(dir / "f.txt", "one");
  write_file_atomically(dir / "f.txt", "two");
  std::ifstream in(dir / "f.txt");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "two");
  size_t n = 0;
  for (auto& e : fs::directory_iterator(dir.str())) (void)e, ++n;
  EXPECT_EQ(n, 1u);  // no temporary left behind
}

}  // namespace
}  // namespace hk
