// `hk inspect` end to end: runs the built binary ($HK_BINARY_DIR/bin/hk) on the PyTorch fixture,
// a sharded directory and malformed files; checks exit status 0/1, the listing, the documented
// --json shape, and that a failure is one "hk: error: ..." sentence on stderr (never a crash).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "hk/safetensors.h"
#include "io_test_util.h"

namespace hk {
namespace {

struct CliRun {
  int status = -1;  // exit status; -1 when killed by a signal
  std::string out, err;
};

CliRun run_hk(const std::string& args, const test::ScratchDir& dir) {
  const char* bin = std::getenv("HK_BINARY_DIR");
  const std::string hk = std::string(bin ? bin : ".") + "/bin/hk";
  const std::string out = dir.file("stdout.txt"), err = dir.file("stderr.txt");
  const std::string cmd = "'" + hk + "' " + args + " >'" + out + "' 2>'" + err + "'";
  const int raw = std::system(cmd.c_str());
  CliRun r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = test::read_file(out);
  r.err = test::read_file(err);
  return r;
}

TEST(InspectCli, ListsPyTorchFixture) {
  test::ScratchDir dir;
  const CliRun r = run_hk("inspect '" + test::torch_fixture() + "'", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  EXPECT_NE(r.out.find("embed.weight"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("BF16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[3, 4]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("6 tensors, 34 elements, 136 bytes"), std::string::npos) << r.out;
}

TEST(InspectCli, JsonOutputHasTheDocumentedShape) {
  test::ScratchDir dir;
  const CliRun r = run_hk("inspect --json '" + test::torch_fixture() + "'", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["path"], test::torch_fixture());
  EXPECT_EQ(j["metadata"]["format"], "pt");
  EXPECT_EQ(j["total_bytes"], 136);
  ASSERT_EQ(j["tensors"].size(), 6u);
  const auto& first = j["tensors"][0];
  EXPECT_EQ(first["name"], "embed.weight");
  EXPECT_EQ(first["dtype"], "F32");
  EXPECT_EQ(first["hk_dtype"], "f32");
  EXPECT_EQ(first["shape"], nlohmann::json({3, 4}));
  EXPECT_EQ(first["bytes"], 48);
  // The offset points at the tensor's bytes in the file: 0.0, 0.25, ... as f32.
  const std::string raw = test::read_file(test::torch_fixture());
  float second = 0;
  std::memcpy(&second, raw.data() + first["offset"].get<size_t>() + 4, 4);
  EXPECT_EQ(second, 0.25f);
}

TEST(InspectCli, ShardedDirectory) {
  test::ScratchDir dir;
  const Tensor a = Tensor::from_floats({1, 2}, {2});
  save_safetensors(dir.file("s1.safetensors"), {{"a", a.view()}});
  save_safetensors(dir.file("s2.safetensors"), {{"b", a.view()}});
  test::write_file(dir.file("model.safetensors.index.json"),
                   R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  const CliRun r = run_hk("inspect --json '" + dir.path().string() + "'", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["files"].size(), 2u);
  EXPECT_EQ(j["tensors"].size(), 2u);
  EXPECT_EQ(j["total_bytes"], 16);
}

TEST(InspectCli, MalformedFilesExitOneWithASentence) {
  test::ScratchDir dir;
  const std::string good = test::read_file(test::torch_fixture());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"truncated", good.substr(0, good.size() - 10)},
      {"tiny", "abc"},
      {"absurd_header", test::le64(1ULL << 50) + good.substr(8)},
      {"not_json", test::safetensors_bytes("{{{{", "")},
      {"unknown_dtype",
       test::safetensors_bytes(R"({"x":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}})", "z")},
      {"overlap",
       test::safetensors_bytes(
           R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"y":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
           "abc")},
  };
  for (const auto& [name, bytes] : cases) {
    SCOPED_TRACE(name);
    const std::string path = dir.file(name + ".safetensors");
    test::write_file(path, bytes);
    const CliRun r = run_hk("inspect '" + path + "'", dir);
    EXPECT_EQ(r.status, 1);
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_EQ(r.err.rfind("hk: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
    const CliRun j = run_hk("inspect --json '" + path + "'", dir);
    EXPECT_EQ(j.status, 1);
  }
  const CliRun missing = run_hk("inspect /nonexistent/file.safetensors", dir);
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("/nonexistent/file.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace hk
