// Verify-and-load races (issue "Security and robustness", item 1): a thread keeps replacing a
// kernel library on disk — by rename, and by rewriting the file in place — while another thread
// verifies and loads it, thousands of times. Every load must either be refused (IntegrityError)
// or run exactly the verified bytes: the loaded library's own table must say version 1.0.0 (the
// expected digest's), never 2.0.0 (the intruder). Before the fix the hub hashed the path and then
// dlopen'ed the path again, and 35 of 550 loads ran a library whose digest was never checked.
//
// Both the loader primitive (load_verified_kernel_library: a new private image per call) and
// Hub::load (memoised by digest, still re-hashing on every call) are raced.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "hk/error.h"
#include "hk/hub.h"
#include "hk/kernel_loader.h"
#include "hub_fixture.h"

namespace hk {
namespace {

namespace fs = std::filesystem;

constexpr int kLoads = 2000;

struct Libraries {
  fs::path good, intruder;  // rmsnorm 1.0.0 and 2.0.0 from the test hub
  std::string good_sha;
};

Libraries libraries() {
  const std::string repo = "kernels-community/rmsnorm";
  Libraries l;
  l.good = test::library_path(test::test_hub(), repo, "tags/v1.0.0", "-cpu-", "librmsnorm.so");
  l.intruder = test::library_path(test::test_hub(), repo, "tags/v2.0.0", "-cpu-", "librmsnorm.so");
  if (!l.good.empty()) l.good_sha = hub::sha256_file(l.good);
  return l;
}

// Replaces `target` with `a` and `b` alternately until `stop`, in one of two ways.
class Swapper {
 public:
  enum class Mode { Rename, RewriteInPlace };
  Swapper(const fs::path& a, const fs::path& b, const fs::path& target, Mode mode)
      : a_(test::read_text(a)), b_(test::read_text(b)), target_(target), mode_(mode) {
    fs::copy_file(a, target, fs::copy_options::overwrite_existing);
    thread_ = std::thread([this] { run(); });
  }
  ~Swapper() {
    stop_ = true;
    thread_.join();
  }
  long swaps() const { return swaps_.load(); }

 private:
  void put(const std::string& bytes) {
    if (mode_ == Mode::Rename) {
      const fs::path tmp = target_.string() + ".swap";
      {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << bytes;
      }
      fs::rename(tmp, target_);
    } else {
      int fd = ::open(target_.c_str(), O_WRONLY);
      if (fd < 0) return;
      size_t done = 0;
      while (done < bytes.size()) {
        ssize_t n = ::pwrite(fd, bytes.data() + done, bytes.size() - done, done);
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
      ::ftruncate(fd, static_cast<off_t>(bytes.size()));
      ::close(fd);
    }
    ++swaps_;
  }
  void run() {
    while (!stop_) {
      put(b_);
      put(a_);
    }
  }
  std::string a_, b_;
  fs::path target_;
  Mode mode_;
  std::atomic<bool> stop_{false};
  std::atomic<long> swaps_{0};
  std::thread thread_;
};

struct Tally {
  int loaded = 0, refused = 0, unverified = 0;
};

void expect_no_unverified(const Tally& t, long swaps, const char* what) {
  std::printf("%s: %d loads of the verified bytes, %d refused, %d unverified (%ld swaps)\n", what,
              t.loaded, t.refused, t.unverified, swaps);
  EXPECT_EQ(t.unverified, 0) << what << ": code whose digest was never checked ran";
  EXPECT_EQ(t.loaded + t.refused, kLoads);
  // A loader that refused everything would pass the line above: the verified bytes must load.
  EXPECT_GT(t.loaded, 0) << what << ": the verified library never loaded";
  EXPECT_GT(swaps, 0) << "the swapper never ran: the race was not exercised";
}

class VerifiedLoadRace : public ::testing::TestWithParam<Swapper::Mode> {};

TEST_P(VerifiedLoadRace, LoaderPrimitiveNeverRunsUnverifiedBytes) {
  Libraries libs = libraries();
  ASSERT_FALSE(libs.good.empty() || libs.intruder.empty()) << "test hub not published";
  const fs::path dir = fs::temp_directory_path() / ("hk-race-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path target = dir / "librmsnorm.so";
  Tally t;
  long swaps = 0;
  {
    Swapper swapper(libs.good, libs.intruder, target, GetParam());
    for (int i = 0; i < kLoads; ++i) {
      try {
        auto lib = load_verified_kernel_library(target, libs.good_sha, "race");
        (lib->version() == "1.0.0" ? t.loaded : t.unverified)++;
      } catch (const IntegrityError&) {
        ++t.refused;
      } catch (const Error& e) {
        // A torn in-place write can be caught half-way by another check; it still did not run.
        ++t.refused;
      }
    }
    swaps = swapper.swaps();
  }
  fs::remove_all(dir);
  expect_no_unverified(t, swaps, GetParam() == Swapper::Mode::Rename ? "rename" : "rewrite");
}

TEST_P(VerifiedLoadRace, HubLoadNeverRunsUnverifiedBytes) {
  Libraries libs = libraries();
  ASSERT_FALSE(libs.good.empty()) << "test hub not published";
  // A local variant directory (metadata.json naming the good digest) whose library is swapped.
  const fs::path dir = fs::temp_directory_path() / ("hk-race-hub-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(libs.good.parent_path(), dir, fs::copy_options::recursive);
  hub::HubConfig config;
  config.hub_dir = "/nonexistent";
  config.cache_dir = dir / "cache";
  hub::Hub hub(config);
  hub::Resolution res = hub.resolve(dir.string(), hub::Target::for_device(Device::cpu()));
  Tally t;
  long swaps = 0;
  {
    Swapper swapper(libs.good, libs.intruder, dir / "librmsnorm.so", GetParam());
    for (int i = 0; i < kLoads; ++i) {
      try {
        auto lib = hub.load(res);
        (lib->version() == "1.0.0" ? t.loaded : t.unverified)++;
      } catch (const Error&) {
        ++t.refused;
      }
    }
    swaps = swapper.swaps();
  }
  fs::remove_all(dir);
  expect_no_unverified(t, swaps, "Hub::load");
}

INSTANTIATE_TEST_SUITE_P(Modes, VerifiedLoadRace,
                         ::testing::Values(Swapper::Mode::Rename, Swapper::Mode::RewriteInPlace),
                         [](const auto& info) {
                           return info.param == Swapper::Mode::Rename ? "Rename" : "RewriteInPlace";
                         });

TEST(VerifiedLoad, ImagesAreReleasedAndTwoVersionsCoexist) {
  Libraries libs = libraries();
  ASSERT_FALSE(libs.good.empty() || libs.intruder.empty()) << "test hub not published";
  auto count_fds = [] {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
    return n;
  };
  const size_t before = count_fds();
  for (int i = 0; i < 200; ++i) load_verified_kernel_library(libs.good, libs.good_sha, "loop");
  EXPECT_LE(count_fds(), before + 2) << "private images leak descriptors";
  auto a = load_verified_kernel_library(libs.good, libs.good_sha);
  auto b = load_verified_kernel_library(libs.intruder, hub::sha256_file(libs.intruder));
  EXPECT_EQ(a->version(), "1.0.0");
  EXPECT_EQ(b->version(), "2.0.0");
  EXPECT_EQ(a->path(), libs.good);  // messages and reports name the real file
  try {
    load_verified_kernel_library(libs.intruder, libs.good_sha, "kernels-community/rmsnorm");
    FAIL() << "a library with another digest was loaded";
  } catch (const IntegrityError& e) {
    EXPECT_NE(std::string(e.what()).find(libs.good_sha), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hk
