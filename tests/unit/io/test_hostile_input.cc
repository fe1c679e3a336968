// Hostile files and arguments for the io layer (issue "Security and robustness"): each case either
// crashed, hung or corrupted memory before. Every one must now end in an hk::Error with a sentence
// (exit status 1 from the CLI), within a bounded time:
//   - a 500k-tensor safetensors header parses in under 1 s (it was quadratic);
//   - a FIFO named model.safetensors / config.json is refused instead of blocking forever;
//   - config.json nested 40,000 deep, and hk generate on it, end in a sentence;
//   - a huge max_position_embeddings plus a huge --max-new-tokens cannot wrap the KV cache size;
//   - values a model cannot run with (rope factors of 0, a negative rms_norm_eps) are refused;
//   - the one temporary-file primitive never writes through a planted name or symlink.
// The 500k header bound is on the parsing thread's CPU time (about 0.4 s in a Release build on
// the 2-core development machine), so other jobs on a loaded CI machine cannot make it flaky;
// sanitizer builds get 10x. The other cases are bounded by generous deadlines (10-60 s) that only
// a hang reaches.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <time.h>

#include <chrono>
#include <future>
#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "hk/checkpoint.h"
#include "hk/error.h"
#include "hk/generation.h"
#include "hk/model_config.h"
#include "hk/safetensors.h"
#include "hk/tensor.h"
#include "hub/hub_test_util.h"
#include "io_test_util.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
constexpr double kSlowdown = 10;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
constexpr double kSlowdown = 10;
#else
constexpr double kSlowdown = 1;
#endif
#else
constexpr double kSlowdown = 1;
#endif

namespace hk {
namespace {

namespace fs = std::filesystem;
using hub::testing::message_of;
using hub::testing::run_hk;
using namespace std::chrono_literals;

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

fs::path fixture() {
  return fs::path(std::getenv("HK_SOURCE_DIR")) / "tests/fixtures/models/qwen3-tiny";
}

// A copy of the tiny Qwen3 fixture whose config.json is replaced by `config`.
fs::path model_with_config(const fs::path& dir, const std::string& config) {
  fs::create_directories(dir);
  for (const char* f : {"model.safetensors", "generation_config.json", "tokenizer.json"})
    fs::copy_file(fixture() / f, dir / f);
  std::ofstream(dir / "config.json") << config;
  return dir;
}

std::string fixture_config() {
  std::ifstream in(fixture() / "config.json");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(HostileSafetensors, FiveHundredThousandTensorHeaderParsesInUnderOneSecond) {
  constexpr int kTensors = 500000;
  std::string header = "{";
  header.reserve(size_t{kTensors} * 60);
  for (int i = 0; i < kTensors; ++i) {
    char entry[96];
    std::snprintf(entry, sizeof entry,
                  "%s\"t%07d\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
                  i ? "," : "", i, i, i + 1);
    header += entry;
  }
  header += "}";
  const std::string bytes = test::safetensors_bytes(header, std::string(kTensors, '\x01'));
  // CPU time of this thread, not wall time: other jobs on a loaded CI machine do not inflate it,
  // while a quadratic parser (23 s for 40k tensors before) still blows through it.
  const double cpu0 = thread_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  const SafetensorsFile file = SafetensorsFile::from_bytes(bytes.data(), bytes.size());
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double seconds = thread_cpu_seconds() - cpu0;
  ASSERT_EQ(file.tensors().size(), size_t{kTensors});
  EXPECT_EQ(file.tensors().front().name, "t0000000");
  EXPECT_EQ(file.info("t0499999").data_begin, 499999u);
  std::printf("500k-tensor header (%zu MB) parsed in %.3f s CPU (%.3f s wall)\n",
              header.size() >> 20, seconds, wall);
  EXPECT_LT(seconds, 1.0 * kSlowdown) << "the header reader is no longer linear";
}

TEST(HostileSafetensors, DuplicateAndDeepHeadersAreRefused) {
  const std::string a = R"("a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  EXPECT_NE(message_of([&] {
              auto b = test::safetensors_bytes("{" + a + "," + a + "}", "x");
              SafetensorsFile::from_bytes(b.data(), b.size());
            }).find("twice"),
            std::string::npos);
  const std::string dup_field =
      R"({"a":{"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]}})";
  EXPECT_NE(message_of([&] {
              auto b = test::safetensors_bytes(dup_field, "x");
              SafetensorsFile::from_bytes(b.data(), b.size());
            }).find("twice"),
            std::string::npos);
  const std::string deep =
      "{\"a\":{\"shape\":" + std::string(40000, '[') + std::string(40000, ']') + "}}";
  EXPECT_NE(message_of([&] {
              auto b = test::safetensors_bytes(deep, "");
              SafetensorsFile::from_bytes(b.data(), b.size());
            }).find("nests deeper"),
            std::string::npos);
}

// Runs `open_fifo` (which opens the FIFO `fifo` through some reader) on a thread and expects it
// to be refused as "not a regular file"; fails, instead of hanging the suite, when it blocks.
template <class Fn>
void refused_without_blocking(const fs::path& fifo, Fn open_fifo) {
  auto done = std::async(std::launch::async, [&] {
    std::string m = message_of(open_fifo);
    EXPECT_NE(m.find("not a regular file"), std::string::npos) << m;
  });
  if (done.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    // Unblock the reader so the thread can end, then fail.
    int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
    ADD_FAILURE() << "blocked on the FIFO " << fifo;
  }
  done.get();
}

TEST(HostileFiles, FifoNamedLikeACheckpointIsRefusedWithoutBlocking) {
  test::ScratchDir dir;
  const fs::path fifo = dir.path() / "model.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  refused_without_blocking(fifo, [&] { SafetensorsFile::open(fifo.string()); });
  // The CLI: hk inspect on the FIFO, hk generate on a directory holding it.
  std::ofstream(dir.path() / "config.json") << fixture_config();
  auto inspect = run_hk({"inspect", fifo.string()}, {}, 20s);
  EXPECT_FALSE(inspect.timed_out);
  EXPECT_EQ(inspect.exit_code, 1) << inspect.err;
  EXPECT_NE(inspect.err.find("not a regular file"), std::string::npos) << inspect.err;
  auto generate = run_hk({"generate", "--model", dir.path().string(), "--ids", "1,2"}, {}, 20s);
  EXPECT_FALSE(generate.timed_out);
  EXPECT_EQ(generate.exit_code, 1) << generate.err;
  EXPECT_NE(generate.err.find("not a regular file"), std::string::npos) << generate.err;
}

TEST(HostileFiles, FifoNamedConfigJsonIsRefusedWithoutBlocking) {
  test::ScratchDir dir;
  const fs::path fifo = dir.path() / "config.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  refused_without_blocking(fifo, [&] { ModelConfig::from_file(dir.path().string()); });
}

TEST(HostileFiles, CheckpointIndexFifoAndDeepNesting) {
  test::ScratchDir dir;
  const fs::path fifo = dir.path() / "model.safetensors.index.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  refused_without_blocking(fifo, [&] { Checkpoint::open(dir.path().string()); });
  fs::remove(fifo);
  // A weight_map value nested 1,000,000 deep: its error message used to dump() it recursively.
  std::ofstream(fifo) << "{\"weight_map\": {\"a\": " << std::string(1000000, '[')
                      << std::string(1000000, ']') << "}}";
  std::string m = message_of([&] { Checkpoint::open(dir.path().string()); });
  EXPECT_NE(m.find("nests deeper"), std::string::npos) << m;
}

TEST(HostileConfig, DeepNestingIsASentenceNotACrash) {
  // 1,000,000 levels (2 MB): deep enough that the recursive code behind nlohmann's parser
  // (dump() for the error message) overflowed the 8 MB stack and hk generate died of SIGSEGV.
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  std::string m = message_of([&] {
    ModelConfig::from_json("{\"model_type\": \"qwen3\", \"vocab_size\": " + deep + "}", "cfg");
  });
  EXPECT_NE(m.find("nests deeper than 64 levels"), std::string::npos) << m;
  m = message_of([&] { GenerationConfig::from_json("{\"temperature\": " + deep + "}", "gen"); });
  EXPECT_NE(m.find("nests deeper"), std::string::npos) << m;
  // Through the CLI: exit 1 with the sentence.
  hub::testing::TempDir tmp;
  fs::path model = model_with_config(tmp.path() / "m",
                                     "{\"model_type\": \"qwen3\", \"vocab_size\": " + deep + "}");
  auto r = run_hk({"generate", "--model", model.string(), "--ids", "1,2"}, {}, 30s);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("nests deeper"), std::string::npos) << r.err;
}

TEST(HostileConfig, ValuesAModelCannotRunWithAreRefused) {
  auto with = [](const std::string& extra) {
    return message_of([&] {
      ModelConfig::from_json(
          R"({"model_type": "llama", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
              "num_hidden_layers": 1, "num_attention_heads": 2)" +
              extra + "}",
          "cfg");
    });
  };
  EXPECT_NE(with(R"(, "rms_norm_eps": -1e-6)").find("rms_norm_eps"), std::string::npos);
  EXPECT_NE(with(R"(, "rms_norm_eps": 0)").find("greater than 0"), std::string::npos);
  for (const char* factor : {"factor", "low_freq_factor", "high_freq_factor"}) {
    std::string m =
        with(R"(, "rope_scaling": {"rope_type": "llama3", ")" + std::string(factor) + R"(": 0})");
    EXPECT_NE(m.find(factor), std::string::npos) << m;
  }
  EXPECT_NE(with(R"(, "rope_scaling": {"rope_type": "llama3", "low_freq_factor": 4,
                    "high_freq_factor": 4})")
                .find("high_freq_factor > low_freq_factor"),
            std::string::npos);
  EXPECT_NE(with(R"(, "rope_theta": 0)").find("rope_theta"), std::string::npos);
  EXPECT_EQ(with(R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8,
                    "low_freq_factor": 1, "high_freq_factor": 4})"),
            "(no exception)");
}

TEST(CheckedSizes, OverflowingShapesAndLengthsAreErrors) {
  const int64_t big = int64_t{1} << 62;
  EXPECT_THROW(checked_add(big, big, "x"), InvalidArgument);
  EXPECT_THROW(checked_mul(big, 4, "x"), InvalidArgument);
  EXPECT_EQ(checked_mul(big, 1, "x"), big);
  EXPECT_THROW(checked_numel(Shape{big, 4}), InvalidArgument);
  EXPECT_EQ(checked_numel(Shape{big, 0, 4}), 0);
  EXPECT_THROW(checked_numel(Shape{0, big, big}.data(), 3, /*empty_as_one=*/true), InvalidArgument);
  TensorView v(nullptr, Device::cpu(), DType::F32, {1, 2});
  v.shape[0] = big;  // a view whose fields were set by hand
  v.shape[1] = 4;
  EXPECT_THROW(v.numel(), InvalidArgument);
  v.shape[1] = 1;
  EXPECT_THROW(v.nbytes(), InvalidArgument);  // 2^62 f32 elements: 2^64 bytes
  std::string m = message_of([&] { Tensor::empty({1, big, 8, 64}, DType::BF16); });
  EXPECT_NE(m.find("too large"), std::string::npos) << m;
  EXPECT_THROW(TensorView(nullptr, Device::cpu(), DType::F32, {big, 4, 0}), InvalidArgument);
  EXPECT_THROW(KVCache(2, 1, big, 8, 64, DType::BF16, Device::cpu()), InvalidArgument);
}

TEST(CheckedSizes, HugeContextAndMaxNewTokensEndInASentence) {
  // max_position_embeddings and --max-new-tokens near 2^62: the KV cache size wrapped before, and
  // attention wrote past a tiny buffer.
  hub::testing::TempDir tmp;
  auto config = nlohmann::json::parse(fixture_config());
  config["max_position_embeddings"] = int64_t{1} << 62;
  fs::path model = model_with_config(tmp.path() / "m", config.dump());
  for (const char* max_new : {"4611686018427387900", "9223372036854775806"}) {
    auto r = run_hk(
        {"generate", "--model", model.string(), "--ids", "1,2,3", "--max-new-tokens", max_new}, {},
        60s);
    EXPECT_EQ(r.exit_code, 1) << max_new << ": " << r.err;
    EXPECT_NE(r.err.find("too large"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one sentence: " << r.err;
  }
  for (const char* t : {"nan", "inf", "-1"}) {
    auto r = run_hk({"generate", "--model", fixture().string(), "--ids", "1,2", "--temperature", t},
                    {}, 60s);
    EXPECT_EQ(r.exit_code, 1) << t << ": " << r.err;
    EXPECT_NE(r.err.find("--temperature"), std::string::npos) << r.err;
  }
}

TEST(TempFiles, NeverWriteThroughAPlantedNameOrSymlink) {
  test::ScratchDir dir;
  const fs::path victim = dir.path() / "victim";
  std::ofstream(victim) << "precious";
  // A symlink at the final name is replaced, not written through.
  const fs::path target = dir.path() / "hk.lock";
  fs::create_symlink(victim, target);
  files::write_file_atomically(target, "new lock\n");
  EXPECT_FALSE(fs::is_symlink(target));
  EXPECT_EQ(hub::testing::read_file(target), "new lock\n");
  EXPECT_EQ(hub::testing::read_file(victim), "precious");
  // A target name of 250 characters (legal) still gets a short temporary name.
  const fs::path long_name = dir.path() / std::string(250, 'n');
  files::write_file_atomically(long_name, "ok");
  EXPECT_EQ(hub::testing::read_file(long_name), "ok");
  {
    files::TempFile tmp(dir.path(), ".part");
    EXPECT_LT(tmp.path().filename().string().size(), 32u);
    EXPECT_EQ(tmp.path().parent_path(), dir.path());
    struct stat st {};
    ASSERT_EQ(::lstat(tmp.path().c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
  }  // not committed: removed
  size_t left = 0;
  for (const auto& e : fs::directory_iterator(dir.path()))
    left += e.path().filename().string().starts_with(".hk-");
  EXPECT_EQ(left, 0u);
  // The safetensors writer goes through the same primitive.
  const fs::path st_target = dir.path() / "out.safetensors";
  fs::create_symlink(victim, st_target);
  save_safetensors(st_target.string(), {{"x", Tensor::from_floats({1, 2}, {2})}});
  EXPECT_FALSE(fs::is_symlink(st_target));
  EXPECT_EQ(hub::testing::read_file(victim), "precious");
  EXPECT_EQ(SafetensorsFile::open(st_target.string()).tensors().size(), 1u);
}

}  // namespace
}  // namespace hk
