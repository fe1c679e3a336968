// Checkpoint: single files, directories, and sharded checkpoints with their failure modes (missing
// shard, tensor not in its shard, shard path escaping the directory, broken index).
#include <gtest/gtest.h>

#include "hk/checkpoint.h"
#include "hk/error.h"
#include "io_test_util.h"

namespace hk {
namespace {

using test::ScratchDir;

// Two shards: shard 1 holds a and b, shard 2 holds c.
void write_sharded(const ScratchDir& dir, const std::string& index_json) {
  const Tensor a = Tensor::from_floats({1, 2}, {2});
  const Tensor b = Tensor::from_floats({3, 4, 5}, {3}, DType::BF16);
  const Tensor c = Tensor::from_ints({7, 8}, {2, 1}, DType::I64);
  save_safetensors(dir.file("model-00001-of-00002.safetensors"), {{"a", a.view()}, {"b", b.view()}},
                   {{"format", "pt"}});
  save_safetensors(dir.file("model-00002-of-00002.safetensors"), {{"c", c.view()}});
  test::write_file(dir.file("model.safetensors.index.json"), index_json);
}

const std::string kIndex = R"({"metadata": {"total_size": 30}, "weight_map": {
  "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
  "c": "model-00002-of-00002.safetensors"}})";

template <class E>
std::string error_of(const std::string& path) {
  try {
    (void)Checkpoint::open(path);
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no exception";
}

TEST(Checkpoint, ShardedDirectory) {
  ScratchDir dir;
  write_sharded(dir, kIndex);
  for (const std::string& path : {dir.path().string(), dir.file("model.safetensors.index.json")}) {
    const Checkpoint ckpt = Checkpoint::open(path);
    EXPECT_TRUE(ckpt.sharded());
    EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_EQ(ckpt.files().size(), 2u);
    EXPECT_EQ(ckpt.load("a").to_doubles(), (std::vector<double>{1, 2}));
    EXPECT_EQ(ckpt.load("b", Device::cpu(), DType::F32).to_doubles(),
              (std::vector<double>{3, 4, 5}));
    EXPECT_EQ(ckpt.load("c").to_int64s(), (std::vector<int64_t>{7, 8}));
    EXPECT_EQ(ckpt.info("c").shape, (Shape{2, 1}));
    EXPECT_NE(ckpt.file_of("c").path().find("model-00002-of-00002"), std::string::npos);
    EXPECT_EQ(ckpt.metadata().at("format"), "pt");
    EXPECT_TRUE(ckpt.contains("b"));
    EXPECT_FALSE(ckpt.contains("d"));
    EXPECT_THROW((void)ckpt.info("d"), NotFound);
  }
}

TEST(Checkpoint, MissingShardIsNamed) {
  ScratchDir dir;
  write_sharded(dir, kIndex);
  std::filesystem::remove(dir.file("model-00002-of-00002.safetensors"));
  const std::string msg = error_of<NotFound>(dir.path().string());
  EXPECT_NE(msg.find("model-00002-of-00002.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
}

TEST(Checkpoint, TensorMissingFromItsShardIsNamed) {
  ScratchDir dir;
  write_sharded(dir, R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                        "zz": "model-00002-of-00002.safetensors"}})");
  const std::string msg = error_of<InvalidArgument>(dir.path().string());
  EXPECT_NE(msg.find("'zz'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model-00002-of-00002.safetensors"), std::string::npos) << msg;
}

TEST(Checkpoint, ShardOutsideTheDirectoryIsRejected) {
  ScratchDir dir;
  write_sharded(dir, R"({"weight_map": {"a": "../model-00001-of-00002.safetensors"}})");
  EXPECT_NE(error_of<InvalidArgument>(dir.path().string()).find("not a file inside"),
            std::string::npos);
  write_sharded(dir, R"({"weight_map": {"a": "/etc/passwd"}})");
  EXPECT_NE(error_of<InvalidArgument>(dir.path().string()).find("not a file inside"),
            std::string::npos);
}

TEST(Checkpoint, BrokenIndexIsRejected) {
  ScratchDir dir;
  write_sharded(dir, "{not json");
  EXPECT_NE(error_of<InvalidArgument>(dir.path().string()).find("not valid JSON"),
            std::string::npos);
  write_sharded(dir, R"({"weights": {}})");
  EXPECT_NE(error_of<InvalidArgument>(dir.path().string()).find("weight_map"), std::string::npos);
  write_sharded(dir, R"({"weight_map": {"a": 3}})");
  EXPECT_NE(error_of<InvalidArgument>(dir.path().string()).find("'a'"), std::string::npos);
}

TEST(Checkpoint, MalformedShardNamesTheShard) {
  ScratchDir dir;
  write_sharded(dir, kIndex);
  test::write_file(dir.file("model-00002-of-00002.safetensors"), "garbage!garbage!");
  const std::string msg = error_of<InvalidArgument>(dir.path().string());
  EXPECT_NE(msg.find("model-00002-of-00002.safetensors"), std::string::npos) << msg;
}

TEST(Checkpoint, SingleFileAndDirectoryWithModelSafetensors) {
  ScratchDir dir;
  const Tensor w = Tensor::from_floats({1, 2, 3, 4}, {2, 2});
  save_safetensors(dir.file("model.safetensors"), {{"w", w.view()}});
  for (const std::string& path : {dir.path().string(), dir.file("model.safetensors")}) {
    const Checkpoint ckpt = Checkpoint::open(path);
    EXPECT_FALSE(ckpt.sharded());
    EXPECT_EQ(ckpt.names(), std::vector<std::string>{"w"});
    EXPECT_EQ(ckpt.load("w").to_doubles(), (std::vector<double>{1, 2, 3, 4}));
  }
}

TEST(Checkpoint, EmptyDirectoryIsNotFound) {
  ScratchDir dir;
  const std::string msg = error_of<NotFound>(dir.path().string());
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
}

}  // namespace
}  // namespace hk
