// Data-parallel building blocks on CPU, over real sockets on the loopback interface: the rank
// environment of torchrun / MPI / Slurm (and its rejections), torch's DistributedSampler index for
// index (tests/fixtures/train/distributed_sampler.json, written by torch), the launcher's rank
// environment, the TCP process group's collectives between threads (one rank each), the
// rendezvous' refusals, and peers that die or hang (forked processes): the others fail with a
// sentence naming the peer, within the timeout, instead of waiting forever.
//
// The Trainer over several ranks (DDP, ZeRO-1, resume on another world size) is tested through
// `hk train` in test_distributed_cli.cc.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "hk/device.h"
#include "hk/distributed.h"
#include "hk/error.h"
#include "hk/train_data.h"
#include "train/distributed/launcher.h"
#include "train/distributed/tcp_socket.h"
#include "train_test_util.h"

namespace hk {
namespace {

using dist::RankEnvironment;
using Vars = std::map<std::string, std::string>;

RankEnvironment parse(const Vars& vars) {
  return RankEnvironment::from_variables([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// The message of the InvalidArgument that parsing `vars` throws ("" when it does not throw).
std::string parse_error(const Vars& vars) {
  try {
    parse(vars);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(RankEnvironment, PlainProcessIsNotLaunched) {
  const RankEnvironment e = parse({{"PATH", "/bin"}});
  EXPECT_FALSE(e.launched());
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
}

TEST(RankEnvironment, Torchrun) {
  const RankEnvironment e = parse({{"RANK", "5"},
                                   {"WORLD_SIZE", "8"},
                                   {"LOCAL_RANK", "1"},
                                   {"LOCAL_WORLD_SIZE", "4"},
                                   {"GROUP_RANK", "1"},
                                   {"MASTER_ADDR", "node0"},
                                   {"MASTER_PORT", "1234"}});
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_TRUE(e.launched());
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 1234);
}

TEST(RankEnvironment, TorchrunDefaultsToOneNode) {
  const RankEnvironment e = parse({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.node_rank, 0);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(RankEnvironment, OpenMpiAndMpich) {
  const RankEnvironment o = parse({{"OMPI_COMM_WORLD_RANK", "3"},
                                   {"OMPI_COMM_WORLD_SIZE", "4"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                   {"MASTER_ADDR", "10.0.0.1"}});
  EXPECT_EQ(o.launcher, "mpi");
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.world_size, 4);
  EXPECT_EQ(o.local_rank, 1);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  const RankEnvironment p = parse({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}});
  EXPECT_EQ(p.launcher, "mpi");
  EXPECT_EQ(p.rank, 2);
  EXPECT_EQ(p.world_size, 3);
  EXPECT_EQ(p.local_world_size, 3);
}

TEST(RankEnvironment, SlurmInsideAStepOnly) {
  const Vars step = {{"SLURM_PROCID", "5"},   {"SLURM_NTASKS", "7"},
                     {"SLURM_LOCALID", "1"},  {"SLURM_NODEID", "1"},
                     {"SLURM_STEP_ID", "0"},  {"SLURM_TASKS_PER_NODE", "4(x1),3"},
                     {"MASTER_ADDR", "node0"}};
  const RankEnvironment e = parse(step);
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 7);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.local_world_size, 3);  // the second node's count in "4(x1),3"
  Vars batch = step;                 // a batch script's own environment: not a rank
  batch.erase("SLURM_STEP_ID");
  EXPECT_FALSE(parse(batch).launched());
  Vars per_node = step;
  per_node["SLURM_NTASKS_PER_NODE"] = "4";
  EXPECT_EQ(parse(per_node).local_world_size, 4);
  Vars bad = step;
  bad["SLURM_TASKS_PER_NODE"] = "four";
  EXPECT_NE(parse_error(bad).find("SLURM_TASKS_PER_NODE"), std::string::npos);
}

TEST(RankEnvironment, TorchrunTakesPrecedence) {
  const RankEnvironment e = parse({{"RANK", "0"},
                                   {"WORLD_SIZE", "2"},
                                   {"OMPI_COMM_WORLD_RANK", "1"},
                                   {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 0);
}

TEST(RankEnvironment, BadValuesNameTheVariable) {
  struct Case {
    Vars vars;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{{"RANK", "two"}, {"WORLD_SIZE", "2"}}, "RANK='two' is not an integer"},
      {{{"RANK", "1x"}, {"WORLD_SIZE", "2"}}, "RANK='1x'"},
      {{{"RANK", "-1"}, {"WORLD_SIZE", "2"}}, "RANK='-1' is not an integer >= 0"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE='0' is not an integer >= 1"},
      {{{"WORLD_SIZE", "2"}}, "RANK is not set"},
      {{{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK=2 is outside the world of WORLD_SIZE=2"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "4"}},
       "LOCAL_WORLD_SIZE=4 is larger than WORLD_SIZE=2"},
      {{{"RANK", "0"},
        {"WORLD_SIZE", "4"},
        {"LOCAL_RANK", "2"},
        {"LOCAL_WORLD_SIZE", "2"},
        {"MASTER_ADDR", "h"}},
       "LOCAL_RANK=2 is outside the 2 ranks of this node"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}}, "MASTER_ADDR is not set"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}},
       "MASTER_PORT=70000 is not a TCP port"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "http"}}, "MASTER_PORT='http'"},
      {{{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}},
       "OMPI_COMM_WORLD_RANK=4 is outside"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}},
       "cannot tell how many tasks run on this node"},
  };
  for (const Case& c : cases) {
    const std::string message = parse_error(c.vars);
    EXPECT_NE(message.find(c.expect), std::string::npos)
        << "expected '" << c.expect << "', got '" << message << "'";
  }
}

// ---- DistributedSampler ------------------------------------------------------------------------

TEST(DistributedSampler, MatchesTorchIndexForIndex) {
  const nlohmann::json fx = test::read_json(test::train_fixture("distributed_sampler.json"));
  int checked = 0;
  for (const auto& c : fx["sampler"]) {
    dist::DistributedSamplerOptions o;
    o.num_replicas = c["world"].get<int>();
    o.shuffle = c["shuffle"].get<bool>();
    o.seed = c["seed"].get<uint64_t>();
    o.drop_last = c["drop_last"].get<bool>();
    const int64_t n = c["n"].get<int64_t>();
    for (int r = 0; r < o.num_replicas; ++r) {
      o.rank = r;
      const auto expected = c["ranks"][static_cast<size_t>(r)].get<std::vector<int64_t>>();
      EXPECT_EQ(dist::distributed_sampler_indices(n, o, c["epoch"].get<int64_t>()), expected)
          << c.dump();
      EXPECT_EQ(dist::shard_length(n, o.num_replicas, o.drop_last),
                static_cast<int64_t>(expected.size()))
          << c.dump();
      ++checked;
    }
  }
  EXPECT_GT(checked, 300);
  for (const auto& p : fx["randperm"])
    EXPECT_EQ(dist::torch_randperm(p["n"].get<int64_t>(), p["seed"].get<uint64_t>()),
              p["perm"].get<std::vector<int64_t>>())
        << p.dump();
}

TEST(DistributedSampler, RanksTogetherHoldTheGlobalBatch) {
  // Micro-batch k of every rank (batch B) = positions [k·B·W, (k+1)·B·W) of the epoch order:
  // what one process with batch B·W trains on at step k.
  const std::vector<int64_t> order = epoch_order(24, 7, 1, true);
  const int world = 3, batch = 2;
  std::vector<std::vector<int64_t>> shards;
  for (int r = 0; r < world; ++r) shards.push_back(dist::shard_order(order, r, world));
  for (int k = 0; k < 4; ++k) {
    std::multiset<int64_t> ranks, global;
    for (int r = 0; r < world; ++r)
      for (int i = 0; i < batch; ++i) ranks.insert(shards[r][k * batch + i]);
    for (int i = k * batch * world; i < (k + 1) * batch * world; ++i) global.insert(order[i]);
    EXPECT_EQ(ranks, global) << "micro-batch " << k;
  }
}

TEST(DistributedSampler, RejectsBadRanksAndEmptyData) {
  EXPECT_THROW(dist::shard_order({0, 1}, 2, 2), InvalidArgument);
  EXPECT_THROW(dist::shard_order({0, 1}, -1, 2), InvalidArgument);
  EXPECT_THROW(dist::shard_order({}, 0, 2), InvalidArgument);
}

// ---- launcher ----------------------------------------------------------------------------------

std::map<std::string, std::string> as_map(const std::vector<std::string>& env) {
  std::map<std::string, std::string> m;
  for (const auto& e : env) {
    const size_t eq = e.find('=');
    m[e.substr(0, eq)] = e.substr(eq + 1);
  }
  return m;
}

TEST(Launcher, RankEnvironmentIsTorchruns) {
  dist::LaunchOptions o;
  o.nproc_per_node = 4;
  o.nnodes = 2;
  o.node_rank = 1;
  o.master_addr = "node0";
  o.master_port = 29511;
  const auto env = as_map(dist::rank_environment(o, 2, {"KEEP=1", "OMP_NUM_THREADS=3"}));
  EXPECT_EQ(env.at("RANK"), "6");
  EXPECT_EQ(env.at("LOCAL_RANK"), "2");
  EXPECT_EQ(env.at("WORLD_SIZE"), "8");
  EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), "4");
  EXPECT_EQ(env.at("GROUP_RANK"), "1");
  EXPECT_EQ(env.at("MASTER_ADDR"), "node0");
  EXPECT_EQ(env.at("MASTER_PORT"), "29511");
  EXPECT_EQ(env.at("KEEP"), "1");
  EXPECT_EQ(env.at("OMP_NUM_THREADS"), "3");  // the user's value stays
  EXPECT_EQ(env.at("NCCL_NVLS_ENABLE"), "0");
  // What the launcher sets is what a rank reads back.
  const RankEnvironment back = parse(env);
  EXPECT_EQ(back.rank, 6);
  EXPECT_EQ(back.world_size, 8);
  EXPECT_EQ(back.local_rank, 2);
  EXPECT_EQ(back.node_rank, 1);
}

TEST(Launcher, ValidateNamesTheFlag) {
  auto message = [](dist::LaunchOptions o) {
    try {
      dist::validate(o);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  dist::LaunchOptions o;
  o.nproc_per_node = 0;
  EXPECT_NE(message(o).find("--nproc-per-node must be >= 1"), std::string::npos);
  o = {};
  o.nnodes = 2;
  o.node_rank = 2;
  EXPECT_NE(message(o).find("--node-rank 2 is outside"), std::string::npos);
  o.node_rank = 1;
  EXPECT_NE(message(o).find("cannot reach a loopback address"), std::string::npos);
  o = {};
  o.master_port = 0;
  EXPECT_NE(message(o).find("--master-port 0"), std::string::npos);
}

// ---- the TCP process group ---------------------------------------------------------------------

RankEnvironment local_rank_env(int rank, int world, int port) {
  RankEnvironment e;
  e.rank = rank;
  e.world_size = world;
  e.local_rank = rank;
  e.local_world_size = world;
  e.master_port = port;
  e.launcher = "torchrun";
  return e;
}

dist::ProcessGroupOptions short_timeout(int ms = 5000) {
  dist::ProcessGroupOptions o;
  o.timeout = std::chrono::milliseconds(ms);
  return o;
}

// Runs `body(rank, group)` on `world` threads, each one rank of a TCP group on a fresh port.
// Returns each rank's error message ("" when it finished).
std::vector<std::string> run_ranks(int world,
                                   const std::function<void(int, dist::ProcessGroup&)>& body,
                                   dist::ProcessGroupOptions options = short_timeout()) {
  const int port = dist::tcp::free_port();
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        auto group =
            dist::init_process_group(Device::cpu(), local_rank_env(r, world, port), options);
        body(r, *group);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(TcpProcessGroup, AllReduceSumAvgMax) {
  const int world = 3;
  std::vector<std::vector<double>> sum(world), avg(world), mx(world), ints(world), halves(world);
  expect_no_errors(run_ranks(world, [&](int r, dist::ProcessGroup& g) {
    EXPECT_EQ(g.rank(), r);
    EXPECT_EQ(g.size(), world);
    EXPECT_EQ(g.backend(), "tcp");
    // Odd length, and more than one 4 MiB chunk for the sum.
    const int64_t n = (int64_t{1} << 20) + 3;
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(r + 1) * (i % 7);
    Tensor a = Tensor::from_floats(v, {n});
    g.all_reduce(a, dist::ReduceOp::Sum);
    const auto d = a.to_doubles();
    sum[r] = {d[0], d[1], d[6], d[static_cast<size_t>(n - 1)]};
    Tensor b = Tensor::from_floats({1.0f * r, 2.0f, -3.0f * r}, {3});
    g.all_reduce(b, dist::ReduceOp::Avg);
    avg[r] = b.to_doubles();
    Tensor c = Tensor::from_floats({1.0f * r, -1.0f * r}, {2});
    g.all_reduce(c, dist::ReduceOp::Max);
    mx[r] = c.to_doubles();
    Tensor i64 = Tensor::from_ints({int64_t{1} << 40, r}, {2});
    g.all_reduce(i64, dist::ReduceOp::Sum);
    ints[r] = i64.to_doubles();
    Tensor h = Tensor::from_floats({0.5f, 1.0f * r}, {2}, DType::BF16);
    g.all_reduce(h, dist::ReduceOp::Sum);
    halves[r] = h.to_doubles();
    g.barrier();
  }));
  for (int r = 0; r < world; ++r) {
    // Σ (r+1)·(i mod 7) over r = 0..2 = 6·(i mod 7).
    EXPECT_EQ(sum[r], (std::vector<double>{0, 6, 36, 6.0 * (((1 << 20) + 2) % 7)})) << r;
    EXPECT_EQ(avg[r], (std::vector<double>{1, 2, -3})) << r;
    EXPECT_EQ(mx[r], (std::vector<double>{2, 0})) << r;
    EXPECT_EQ(ints[r], (std::vector<double>{3.0 * (int64_t{1} << 40), 3})) << r;
    EXPECT_EQ(halves[r], (std::vector<double>{1.5, 3})) << r;
  }
}

TEST(TcpProcessGroup, BroadcastAllGatherReduceScatter) {
  const int world = 3;
  std::vector<std::vector<double>> bcast(world), gathered(world), gathered_in_place(world),
      scattered(world), scattered_in_place(world);
  expect_no_errors(run_ranks(world, [&](int r, dist::ProcessGroup& g) {
    Tensor b = Tensor::from_floats({10.0f * r, 1.0f + r}, {2});
    g.broadcast(b, 1);  // a root other than rank 0 goes through rank 0
    bcast[r] = b.to_doubles();

    Tensor mine = Tensor::from_floats({1.0f * r, 100.0f + r}, {2});
    Tensor all = Tensor::zeros({2 * world}, DType::F32);
    g.all_gather(mine, all);
    gathered[r] = all.to_doubles();
    Tensor all2 = Tensor::zeros({2 * world}, DType::F32);
    all2.slice(0, 2 * r, 2 * r + 2).copy_from(mine.view());
    g.all_gather(all2.slice(0, 2 * r, 2 * r + 2), all2);  // input = own chunk
    gathered_in_place[r] = all2.to_doubles();

    std::vector<float> v;
    for (int i = 0; i < 2 * world; ++i) v.push_back(static_cast<float>(i * (r + 1)));
    Tensor in = Tensor::from_floats(v, {2 * world});
    Tensor out = Tensor::zeros({2}, DType::F32);
    g.reduce_scatter(in, out, dist::ReduceOp::Sum);
    scattered[r] = out.to_doubles();
    g.reduce_scatter(in, in.slice(0, 2 * r, 2 * r + 2), dist::ReduceOp::Avg);  // in place
    scattered_in_place[r] = in.slice(0, 2 * r, 2 * r + 2).contiguous().to_doubles();
  }));
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(bcast[r], (std::vector<double>{10, 2})) << r;
    EXPECT_EQ(gathered[r], (std::vector<double>{0, 100, 1, 101, 2, 102})) << r;
    EXPECT_EQ(gathered_in_place[r], gathered[r]) << r;
    // Σ_r i·(r+1) = 6i for element i; rank r holds i = 2r, 2r+1.
    EXPECT_EQ(scattered[r], (std::vector<double>{12.0 * r, 12.0 * r + 6})) << r;
    EXPECT_EQ(scattered_in_place[r], (std::vector<double>{4.0 * r, 4.0 * r + 2})) << r;
  }
}

TEST(TcpProcessGroup, WorldOfOneNeedsNoPeers) {
  expect_no_errors(run_ranks(1, [](int, dist::ProcessGroup& g) {
    Tensor t = Tensor::from_floats({1, 2}, {2});
    g.all_reduce(t, dist::ReduceOp::Sum);
    EXPECT_EQ(t.to_doubles(), (std::vector<double>{1, 2}));
    g.barrier();
  }));
}

TEST(TcpProcessGroup, ShapeMismatchAndBadTensorsAreClearErrors) {
  const auto errors = run_ranks(2, [](int, dist::ProcessGroup& g) {
    Tensor in = Tensor::zeros({5}, DType::F32);
    Tensor out = Tensor::zeros({2}, DType::F32);
    g.reduce_scatter(in, out, dist::ReduceOp::Sum);
  });
  for (const auto& e : errors)
    EXPECT_NE(e.find("world size (2) chunks of the output's size"), std::string::npos) << e;
  const auto strided = run_ranks(1, [](int, dist::ProcessGroup& g) {
    Tensor t = Tensor::zeros({4, 4}, DType::F32);
    g.all_reduce(t.transpose(0, 1), dist::ReduceOp::Sum);
  });
  EXPECT_NE(strided[0].find("needs contiguous CPU tensors"), std::string::npos) << strided[0];
}

TEST(ProcessGroup, CudaWithoutNcclOrWithoutGpuIsAClearError) {
  RankEnvironment e = local_rank_env(0, 1, dist::tcp::free_port());
  std::string message;
  try {
    dist::init_process_group(Device::cuda(0), e, short_timeout());
  } catch (const Unsupported& ex) {
    message = ex.what();
  }
  if (message.find("built without CUDA") != std::string::npos) {
    // A CPU-only build (-DHK_CUDA=OFF, e.g. scripts/sanitize-test): the fix is named.
    EXPECT_NE(message.find("-DHK_CUDA=ON"), std::string::npos) << message;
  } else if (!dist::nccl_available()) {
    // Built without NCCL (configure said "NCCL backend OFF"): the fix is named.
    EXPECT_NE(message.find("needs NCCL, and this hk was built without it"), std::string::npos)
        << message;
    EXPECT_NE(message.find("scripts/install-deps"), std::string::npos) << message;
  } else if (cuda_device_count() == 0) {
    EXPECT_NE(message.find("CUDA device 0 is not available"), std::string::npos) << message;
  } else {
    GTEST_SKIP() << "NCCL and a GPU are here: tests/gpu/test_distributed_gpu.cc covers cuda";
  }
}

// ---- rendezvous refusals -----------------------------------------------------------------------

TEST(Rendezvous, WorldSizeMismatchIsRefusedOnBothSides) {
  const int port = dist::tcp::free_port();
  std::string e0, e1;
  std::thread t0([&] {
    try {
      dist::init_process_group(Device::cpu(), local_rank_env(0, 2, port), short_timeout());
    } catch (const Error& e) {
      e0 = e.what();
    }
  });
  std::thread t1([&] {
    try {
      dist::init_process_group(Device::cpu(), local_rank_env(1, 3, port), short_timeout());
    } catch (const Error& e) {
      e1 = e.what();
    }
  });
  t0.join();
  t1.join();
  EXPECT_NE(e0.find("rank 1 was started with WORLD_SIZE=3, rank 0 with 2"), std::string::npos)
      << e0;
  EXPECT_NE(e1.find("rank 0 stopped the rendezvous"), std::string::npos) << e1;
}

TEST(Rendezvous, MissingRankTimesOutNamingIt) {
  const auto start = std::chrono::steady_clock::now();
  std::string e0;
  const int port = dist::tcp::free_port();
  std::thread t0([&] {
    try {
      dist::init_process_group(Device::cpu(), local_rank_env(0, 3, port), short_timeout(800));
    } catch (const Error& e) {
      e0 = e.what();
    }
  });
  std::string e1;
  std::thread t1([&] {
    try {
      dist::init_process_group(Device::cpu(), local_rank_env(1, 3, port), short_timeout(800));
    } catch (const Error& e) {
      e1 = e.what();
    }
  });
  t0.join();
  t1.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_NE(e0.find("2 of 3 ranks joined (missing: 2)"), std::string::npos) << e0;
  EXPECT_FALSE(e1.empty());  // refused by rank 0, or its own timeout
}

TEST(Rendezvous, NoRankZeroIsATimeoutNotAHang) {
  RankEnvironment e = local_rank_env(1, 2, dist::tcp::free_port());
  try {
    dist::init_process_group(Device::cpu(), e, short_timeout(500));
    ADD_FAILURE() << "joined a rendezvous nobody served";
  } catch (const RuntimeFailure& ex) {
    EXPECT_NE(std::string(ex.what()).find("could not connect to rank 0"), std::string::npos)
        << ex.what();
  }
}

// ---- peers that die or hang (real processes) ---------------------------------------------------

// Forks `world` processes, each one rank on a fresh port running `body`; a rank exits 0 when
// body returns, 1 with its message on the pipe when it throws. Returns each rank's (status,
// message) and how long the slowest took.
struct RankResult {
  int status = -1;
  std::string message;
};

std::vector<RankResult> fork_ranks(int world, int timeout_ms,
                                   const std::function<void(int, dist::ProcessGroup&)>& body,
                                   std::chrono::steady_clock::duration* took) {
  const int port = dist::tcp::free_port();
  const auto start = std::chrono::steady_clock::now();
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  for (int r = 0; r < world; ++r) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      int code = 0;
      std::string message;
      try {
        auto g = dist::init_process_group(Device::cpu(), local_rank_env(r, world, port),
                                          short_timeout(timeout_ms));
        body(r, *g);
      } catch (const std::exception& e) {
        message = e.what();
        code = 1;
      }
      (void)!::write(fds[1], message.data(), message.size());
      ::_exit(code);
    }
    ::close(fds[1]);
    pids.push_back(pid);
    pipes.push_back(fds[0]);
  }
  std::vector<RankResult> results(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(pipes[r], buf, sizeof buf)) > 0) results[r].message.append(buf, n);
    ::close(pipes[r]);
    int status = 0;
    ::waitpid(pids[r], &status, 0);
    results[r].status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  *took = std::chrono::steady_clock::now() - start;
  return results;
}

TEST(DeadPeer, RankThatExitsMakesTheOthersFailNamingIt) {
  std::chrono::steady_clock::duration took;
  // A generous timeout: the failure must come from the closed connection, at once.
  const auto results = fork_ranks(
      3, 60000,
      [](int r, dist::ProcessGroup& g) {
        Tensor t = Tensor::from_floats({1, 2, 3}, {3});
        g.all_reduce(t, dist::ReduceOp::Sum);  // one collective that works
        if (r == 2) ::_exit(3);                // then rank 2 dies (no exception, no goodbye)
        for (int i = 0; i < 3; ++i) g.all_reduce(t, dist::ReduceOp::Sum);
      },
      &took);
  EXPECT_LT(took, std::chrono::seconds(20));
  EXPECT_EQ(results[2].status, 3);
  EXPECT_EQ(results[0].status, 1);
  EXPECT_NE(results[0].message.find("rank 2"), std::string::npos) << results[0].message;
  EXPECT_NE(results[0].message.find("closed the connection"), std::string::npos)
      << results[0].message;
  // Rank 1 learns it from rank 0, which broke every connection when it failed.
  EXPECT_EQ(results[1].status, 1);
  EXPECT_NE(results[1].message.find("rank 0"), std::string::npos) << results[1].message;
}

TEST(DeadPeer, RankThatHangsIsATimeout) {
  std::chrono::steady_clock::duration took;
  const auto results = fork_ranks(
      2, 500,
      [](int r, dist::ProcessGroup& g) {
        if (r == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(2));  // stuck, connection open
          return;
        }
        Tensor t = Tensor::from_floats({1}, {1});
        g.all_reduce(t, dist::ReduceOp::Sum);
      },
      &took);
  EXPECT_LT(took, std::chrono::seconds(15));
  EXPECT_EQ(results[0].status, 1);
  EXPECT_NE(results[0].message.find("timed out waiting for rank 1"), std::string::npos)
      << results[0].message;
}

TEST(DeadPeer, BrokenGroupRefusesLaterCollectives) {
  std::chrono::steady_clock::duration took;
  const auto results = fork_ranks(
      2, 30000,
      [](int r, dist::ProcessGroup& g) {
        if (r == 1) ::_exit(0);
        Tensor t = Tensor::from_floats({1}, {1});
        try {
          g.all_reduce(t, dist::ReduceOp::Sum);
        } catch (const Error&) {
        }
        g.barrier();  // must not wait: the group is broken
      },
      &took);
  EXPECT_EQ(results[0].status, 1);
  EXPECT_NE(results[0].message.find("failed earlier"), std::string::npos) << results[0].message;
}

}  // namespace
}  // namespace hk
