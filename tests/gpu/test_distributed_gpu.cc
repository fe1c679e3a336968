// Data parallel on 2 GPUs over NCCL (ctest label gpu; `scripts/gpu-test --dist`): the NCCL process
// group's collectives (f32, bf16, i64; sum, avg, max; in place), a peer that exits making the
// survivor fail within the timeout instead of hanging, and `hk train --nproc-per-node 2 --device
// cuda` for 20 steps against one GPU with the same global batch (f32 within 1e-5, bf16 within the
// bf16 tolerance of the training tests), ZeRO-1 against ZeRO-0, and a 2-rank ZeRO-1 checkpoint
// resumed on one GPU.
//
// Needs 2 visible GPUs and an hk built with NCCL. With fewer GPUs every test skips saying so,
// unless HK_REQUIRE_MULTI_GPU=1 (gpu-test --dist sets it): then they fail. Ranks are separate
// processes: this executable re-run (posix_spawn, so no CUDA state is inherited) with
// HK_DIST_GPU_CHILD naming the child test and torchrun's variables.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "hk/device.h"
#include "hk/distributed.h"
#include "hk/error.h"
#include "hk/stream.h"
#include "hk/tensor.h"
#include "train/distributed/tcp_socket.h"
#include "unit/train/train_test_util.h"

namespace hk {
namespace {

namespace fs = std::filesystem;

// Harness self-check without GPUs (HK_GPU_TESTS_ON_CPU=1, as the other GPU tests): the same
// processes, collectives and runs on CPU ranks over TCP. It checks the spawning and the
// expectations, nothing about NCCL.
bool on_cpu() {
  const char* v = std::getenv("HK_GPU_TESTS_ON_CPU");
  return v && std::string(v) == "1";
}
std::string device_flag() {
  return on_cpu() ? "cpu" : "cuda";
}
std::string backend() {
  return on_cpu() ? "tcp" : "nccl";
}

bool multi_gpu_required() {
  const char* v = std::getenv("HK_REQUIRE_MULTI_GPU");
  return v && std::string(v) == "1";
}

#define HK_REQUIRE_TWO_GPUS()                                                       \
  do {                                                                              \
    const int gpus = ::hk::cuda_device_count();                                     \
    std::string why;                                                                \
    if (on_cpu())                                                                   \
      ;                                                                             \
    else if (gpus < 2)                                                              \
      why = "needs 2 GPUs, " + std::to_string(gpus) +                               \
            " visible (run on a multi-GPU machine: "                                \
            "scripts/gpu-test --dist)";                                             \
    else if (!::hk::dist::nccl_available())                                         \
      why = "this hk was built without NCCL (configure said \"NCCL backend OFF\")"; \
    if (!why.empty()) {                                                             \
      if (multi_gpu_required()) FAIL() << why;                                      \
      GTEST_SKIP() << why;                                                          \
    }                                                                               \
  } while (0)

const char* child_mode() {
  return std::getenv("HK_DIST_GPU_CHILD");
}

struct Child {
  pid_t pid = -1;
  std::string log;
};

// Re-runs this executable as rank `rank` of `world` for the child test `test`.
Child spawn_rank(const std::string& test, int rank, int world, int port, const std::string& log,
                 const std::vector<std::string>& extra) {
  std::vector<std::string> env = {"HK_DIST_GPU_CHILD=" + test,
                                  "RANK=" + std::to_string(rank),
                                  "WORLD_SIZE=" + std::to_string(world),
                                  "LOCAL_RANK=" + std::to_string(rank),
                                  "LOCAL_WORLD_SIZE=" + std::to_string(world),
                                  "MASTER_ADDR=127.0.0.1",
                                  "MASTER_PORT=" + std::to_string(port)};
  env.insert(env.end(), extra.begin(), extra.end());
  Child c;
  c.log = log;
  c.pid = test::spawn_shell("/proc/" + std::to_string(::getpid()) +
                                "/exe --gtest_filter=DistributedGpuChild." + test + " >" + log +
                                " 2>&1",
                            env);
  EXPECT_GT(c.pid, 0);
  return c;
}

int wait_for(const Child& c, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    int status = 0;
    if (::waitpid(c.pid, &status, WNOHANG) == c.pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(c.pid, SIGKILL);
      ::waitpid(c.pid, &status, 0);
      ADD_FAILURE() << "rank still ran after " << limit.count() << " s (hung):\n"
                    << test::read_text(c.log);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Runs the child test `test` as ranks 0 and 1 (rank 1 is waited for first: it ends first in
// PeerExits) and returns each rank's exit status; the logs stay in `tmp`.
std::vector<int> run_two_ranks(const std::string& test, const test::TempDir& tmp,
                               const std::vector<std::string>& extra = {}) {
  const int port = dist::tcp::free_port();
  std::vector<Child> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(spawn_rank(test, r, 2, port, tmp / ("rank" + std::to_string(r)), extra));
  std::vector<int> status(2);
  for (int r = 1; r >= 0; --r) {
    status[r] = wait_for(ranks[r], std::chrono::seconds(120));
    if (status[r] != 0) std::cout << "rank " << r << ":\n" << test::read_text(ranks[r].log);
  }
  return status;
}

// ---- children (run only inside a spawned rank) -------------------------------------------------

std::shared_ptr<dist::ProcessGroup> child_group() {
  const dist::RankEnvironment env = dist::RankEnvironment::from_environment();
  return dist::init_process_group(on_cpu() ? Device::cpu() : Device::cuda(env.local_rank), env);
}

std::vector<double> on_host(const Tensor& t) {
  return t.to(Device::cpu()).to_doubles();
}

TEST(DistributedGpuChild, Collectives) {
  if (!child_mode()) GTEST_SKIP() << "runs inside a spawned rank only";
  auto g = child_group();
  const int r = g->rank(), w = g->size();
  ASSERT_EQ(g->backend(), backend());
  const Device dev = g->device();
  OwnedStream stream(dev);
  const Stream s = stream.get();
  // Sum over a size that is not a multiple of anything NCCL likes.
  const int64_t n = (int64_t{1} << 20) + 3;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>((r + 1) * (i % 7));
  Tensor a = Tensor::from_floats(v, {n}).to(dev, s);
  g->all_reduce(a, dist::ReduceOp::Sum, s);
  Tensor avg = Tensor::from_floats({1.0f * r, 2.0f}, {2}).to(dev, s);
  g->all_reduce(avg, dist::ReduceOp::Avg, s);
  Tensor mx = Tensor::from_floats({1.0f * r, -1.0f * r}, {2}).to(dev, s);
  g->all_reduce(mx, dist::ReduceOp::Max, s);
  Tensor bf = Tensor::from_floats({0.5f, 1.0f * r}, {2}, DType::BF16).to(dev, s);
  g->all_reduce(bf, dist::ReduceOp::Sum, s);
  Tensor i64 = Tensor::from_ints({int64_t{1} << 40, r}, {2}).to(dev, s);
  g->all_reduce(i64, dist::ReduceOp::Sum, s);
  Tensor b = Tensor::from_floats({10.0f * r, 1.0f + r}, {2}).to(dev, s);
  g->broadcast(b, 1, s);
  Tensor all = Tensor::zeros({2 * w}, DType::F32, dev, s);
  all.slice(0, 2 * r, 2 * r + 2)
      .copy_from(Tensor::from_floats({1.0f * r, 100.0f + r}, {2}).view(), s);
  g->all_gather(all.slice(0, 2 * r, 2 * r + 2), all, s);  // in place
  std::vector<float> in;
  for (int i = 0; i < 2 * w; ++i) in.push_back(static_cast<float>(i * (r + 1)));
  Tensor rs_in = Tensor::from_floats(in, {2 * w}).to(dev, s);
  Tensor rs_out = Tensor::zeros({2}, DType::F32, dev, s);
  g->reduce_scatter(rs_in, rs_out, dist::ReduceOp::Sum, s);
  g->synchronize(s);
  g->barrier();
  const double tri = w * (w + 1) / 2.0;  // Σ (r+1)
  const auto sum = on_host(a);
  EXPECT_EQ(sum[1], tri);
  EXPECT_EQ(sum[6], 6 * tri);
  EXPECT_EQ(sum[static_cast<size_t>(n - 1)], tri * (((1 << 20) + 2) % 7));
  EXPECT_EQ(on_host(avg), (std::vector<double>{(w - 1) / 2.0, 2}));
  EXPECT_EQ(on_host(mx), (std::vector<double>{w - 1.0, 0}));
  EXPECT_EQ(on_host(bf), (std::vector<double>{0.5 * w, tri - w}));
  EXPECT_EQ(on_host(i64), (std::vector<double>{w * std::ldexp(1.0, 40), tri - w}));
  EXPECT_EQ(on_host(b), (std::vector<double>{10, 2}));
  std::vector<double> gathered;
  for (int k = 0; k < w; ++k) gathered.insert(gathered.end(), {1.0 * k, 100.0 + k});
  EXPECT_EQ(on_host(all), gathered);
  EXPECT_EQ(on_host(rs_out), (std::vector<double>{2 * r * tri, (2 * r + 1) * tri}));
}

TEST(DistributedGpuChild, PeerExits) {
  if (!child_mode()) GTEST_SKIP() << "runs inside a spawned rank only";
  auto g = child_group();
  OwnedStream stream(g->device());
  Tensor t = Tensor::from_floats({1, 2, 3}, {3}).to(g->device(), stream.get());
  g->all_reduce(t, dist::ReduceOp::Sum, stream.get());
  g->synchronize(stream.get());
  if (g->rank() == 1) ::_exit(0);  // gone, without a word
  const auto start = std::chrono::steady_clock::now();
  try {
    for (int i = 0; i < 5; ++i) g->all_reduce(t, dist::ReduceOp::Sum, stream.get());
    g->synchronize(stream.get());
    ADD_FAILURE() << "collectives with a dead peer finished";
  } catch (const RuntimeFailure& e) {
    std::cout << "survivor's error after "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
              << " s: " << e.what() << "\n";
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
  }
  std::cout.flush();
  ::_exit(::testing::Test::HasFailure() ? 1 : 0);  // skip the aborted communicator's teardown
}

// ---- the parent tests --------------------------------------------------------------------------

TEST(DistributedGpu, NcclCollectivesOnTwoGpus) {
  if (child_mode()) GTEST_SKIP();
  HK_REQUIRE_TWO_GPUS();
  test::TempDir tmp;
  EXPECT_EQ(run_two_ranks("Collectives", tmp), (std::vector<int>{0, 0}));
}

TEST(DistributedGpu, PeerThatExitsIsAnErrorNotAHang) {
  if (child_mode()) GTEST_SKIP();
  HK_REQUIRE_TWO_GPUS();
  test::TempDir tmp;
  EXPECT_EQ(run_two_ranks("PeerExits", tmp, {"HK_DIST_TIMEOUT_S=15"}), (std::vector<int>{0, 0}));
  std::cout << test::read_text(tmp / "rank0");
}

// ---- hk train on 2 GPUs against 1 --------------------------------------------------------------

std::string train_args(const std::string& model, const std::string& out, int batch) {
  return "train --model " + test::model_fixture(model) + " --data " +
         test::train_fixture("corpus.txt") + " --output-dir " + out +
         " --block-size 32 --per-device-train-batch-size " + std::to_string(batch) +
         " --learning-rate 1e-3 --lr-scheduler-type constant --weight-decay 0.01"
         " --logging-steps 1 --json --device " +
         device_flag();
}

struct Curve {
  std::vector<double> losses;
  nlohmann::json summary;
};

Curve train(const std::string& args) {
  const auto r = test::run_hk(args, /*stderr_to_null=*/false);
  EXPECT_EQ(r.status, 0) << args << "\n" << r.out;
  Curve c;
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '{') continue;
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss"))
      c.losses.push_back(j["loss"].get<double>());
    else if (j.contains("global_step"))
      c.summary = j;
  }
  return c;
}

double worst(const Curve& a, const Curve& b, size_t offset = 0) {
  EXPECT_EQ(a.losses.size(), b.losses.size() + offset);
  double w = 0;
  for (size_t i = 0; i < b.losses.size() && i + offset < a.losses.size(); ++i)
    w = std::max(w, std::fabs(a.losses[i + offset] - b.losses[i]));
  return w;
}

TEST(DistributedGpu, TwoGpusEqualOneGpuWithTheGlobalBatch) {
  if (child_mode()) GTEST_SKIP();
  HK_REQUIRE_TWO_GPUS();
  test::TempDir tmp;
  const std::string steps = " --max-steps 20 --save-strategy no";
  struct Case {
    std::string model;
    double tol;
  };
  // bf16 (bf16 parameters, gradients, moments): the loss agrees to bf16's resolution
  // (kBf16LossTolerance of the training tests).
  for (const Case& c : {Case{"qwen3-tiny", 1e-5}, Case{"qwen3-tiny-bf16", 2.5e-2}}) {
    const Curve one = train(train_args(c.model, tmp / (c.model + "-1"), 4) + steps);
    const Curve two =
        train(train_args(c.model, tmp / (c.model + "-2"), 2) + steps + " --nproc-per-node 2");
    const Curve zero = train(train_args(c.model, tmp / (c.model + "-z"), 2) + steps +
                             " --nproc-per-node 2 --zero-stage 1");
    ASSERT_EQ(one.losses.size(), 20u) << c.model;
    EXPECT_EQ(two.summary["backend"], backend());
    const double d2 = worst(one, two), dz = worst(two, zero);
    std::cout << c.model << ": worst |loss 2 GPUs - 1 GPU| over 20 steps = " << d2
              << ", |ZeRO-1 - ZeRO-0| = " << dz << "; peak bytes per rank ZeRO-0 "
              << two.summary["peak_memory_per_rank"].dump() << ", ZeRO-1 "
              << zero.summary["peak_memory_per_rank"].dump() << "\n";
    EXPECT_LE(d2, c.tol) << c.model;
    EXPECT_LE(dz, c.tol) << c.model;
  }
}

TEST(DistributedGpu, ZeroCheckpointOfTwoGpusResumesOnOne) {
  if (child_mode()) GTEST_SKIP();
  HK_REQUIRE_TWO_GPUS();
  test::TempDir tmp;
  const Curve two = train(train_args("qwen3-tiny", tmp / "two", 2) +
                          " --max-steps 8 --save-steps 4 --nproc-per-node 2 --zero-stage 1");
  ASSERT_EQ(two.losses.size(), 8u);
  const Curve one =
      train(train_args("qwen3-tiny", tmp / "one", 4) +
            " --max-steps 8 --save-steps 4 --resume-from-checkpoint " + (tmp / "two/checkpoint-4"));
  const double d = worst(two, one, 4);
  std::cout << "resumed on 1 GPU: worst |loss - 2-GPU run| over steps 5..8 = " << d << "\n";
  EXPECT_LE(d, 1e-5);
}

}  // namespace
}  // namespace hk
