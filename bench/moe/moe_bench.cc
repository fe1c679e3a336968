// bench/moe/moe_bench.cc — one MoE block at Qwen3-30B-A3B shapes (hidden 2048, 128 experts, top-8,
// expert intermediate 768, bf16) for 4096 and 16384 tokens: kernels-community/megablocks' cuda
// variant (loaded from the embedded hub, as kernelize loads it) forward and forward+backward, per
// call and as CUDA-graph replays; hk's built-in block forward (cuBLAS per expert, host routing)
// for reference; and cuBLAS dense bf16 GEMMs of the same FLOPs (the expert GEMMs' shapes with
// M = tokens·top-k), measured in the same run, as the rate to compare against.
//
// FLOPs are counted on routed tokens: forward 2·T·k·(2I·H + I·H), forward+backward 3× that (the
// router GEMMs, 2·T·E·H each, are not counted). Method: CUDA events around each call, warm-up
// first, median of the repeats. Inputs are random (balanced-ish routing).
//
// megablocks runs with each kernel set of its expert GEMMs side by side: "hk megablocks" (mma.sync,
// 128×128 tiles), "hk megablocks 128x256" (mma.sync, MEGABLOCKS_GEMM_TILE=128x256) and "hk
// megablocks wgmma" (Hopper wgmma, HK_MEGABLOCKS_GEMM=wgmma) and "hk megablocks tma" (the TMA
// kernels, HK_MEGABLOCKS_GEMM=tma, the default on Hopper); the Hopper rows come last, after the
// JSON of all the others is written, so a fault in the newer kernels loses nothing else. After each
// set's timings one more forward+backward runs with HK_MEGABLOCKS_TIMING=1: the library prints its
// per-stage times (each GEMM, routing, permutation, un-permutation) to stderr.
//
// Usage: hk_bench_moe [--out FILE.json] [--tokens 4096,16384] [--reps N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../cuda_check.h"
#include "hk/hub.h"
#include "hk/kernel_loader.h"
#include "hk/layer_interfaces.h"
#include "hk/moe.h"
#include "hk/ops.h"

namespace {

using nlohmann::json;
constexpr int64_t kH = 2048, kE = 128, kK = 8, kI = 768;

// A device bf16 tensor of random values (a repeated pool: GEMM timing does not depend on values).
hk::Tensor random_bf16(const hk::Shape& shape, float scale, uint32_t seed) {
  static std::vector<float> pool;
  if (pool.empty()) {
    std::mt19937 rng(7);
    std::normal_distribution<float> n(0.0f, 1.0f);
    pool.resize(size_t{1} << 22);
    for (float& v : pool) v = n(rng);
  }
  hk::Tensor t = hk::Tensor::empty(shape, hk::DType::BF16, hk::Device::cuda(0));
  const int64_t n = t.numel();
  const int64_t chunk = int64_t{1} << 20;
  std::vector<hk::bf16_t> host(static_cast<size_t>(chunk));
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t len = std::min(chunk, n - at);
    for (int64_t i = 0; i < len; ++i)
      host[i] = hk::float_to_bf16(scale * pool[(at + i + seed * 7919u) % pool.size()]);
    CK(cudaMemcpy(static_cast<hk::bf16_t*>(t.view().ptr()) + at, host.data(), len * 2,
                  cudaMemcpyHostToDevice));
  }
  return t;
}

double median_ms(const std::function<void()>& fn, cudaStream_t stream, int reps, int warm = 2) {
  for (int i = 0; i < warm; ++i) fn();
  CK(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a, stream));
    fn();
    CK(cudaEventRecord(b, stream));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// fn captured once into a CUDA graph, timed as replays.
double graph_ms(const std::function<void()>& fn, cudaStream_t stream, int reps) {
  fn();  // warm (first-call setup happens outside the capture)
  CK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  fn();
  CK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  const double ms = median_ms([&] { CK(cudaGraphLaunch(exec, stream)); }, stream, reps);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  return ms;
}

std::string gpu_name() {
  cudaDeviceProp p{};
  CK(cudaGetDeviceProperties(&p, 0));
  return p.name;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path;
  std::vector<int64_t> token_counts{4096, 16384};
  int reps = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) {
      out_path = argv[++i];
    } else if (a == "--tokens" && i + 1 < argc) {
      token_counts.clear();
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ',');) token_counts.push_back(std::stoll(t));
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      std::cerr << "usage: hk_bench_moe [--out FILE.json] [--tokens 4096,16384] [--reps N]\n";
      return 1;
    }
  }
  if (hk::cuda_device_count() == 0) {
    std::cerr << "hk_bench_moe: no CUDA device\n";
    return 1;
  }
  // The embedded hub of this build (HK_BINARY_DIR, or the directory above bin/).
  hk::hub::HubConfig hc = hk::hub::HubConfig::from_environment();
  const char* bin = std::getenv("HK_BINARY_DIR");
  hc.endpoint.clear();
  hc.hub_dir = std::string(bin ? bin : ".") + "/hub";
  hk::hub::Hub hub(hc);
  hk::KernelFunction fn;
  try {
    auto res = hub.resolve("kernels-community/megablocks:MegaBlocksMoeMLP",
                           hk::hub::Target::for_device(hk::Device::cuda(0)));
    fn = hub.load(res)->function("MegaBlocksMoeMLP");
  } catch (const std::exception& e) {
    std::cerr << "hk_bench_moe: cannot load megablocks from " << hc.hub_dir << ": " << e.what()
              << "\n";
    return 1;
  }
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  const hk::Stream s{stream};
  const hk::Device d = hk::Device::cuda(0);
  const hk::DType bf = hk::DType::BF16;

  const hk::Tensor wr = random_bf16({kE, kH}, 0.02f, 1),
                   wgu = random_bf16({kE, 2 * kI, kH}, 0.02f, 2),
                   wd = random_bf16({kE, kH, kI}, 0.02f, 3);
  json results = json::array();
  auto record = [&](const std::string& name, int64_t tokens, const std::string& pass, double ms,
                    double flops, double graph) {
    json r{{"name", name},
           {"tokens", tokens},
           {"pass", pass},
           {"ms", ms},
           {"tflops", flops / (ms * 1e-3) / 1e12}};
    if (graph > 0) {
      r["graph_ms"] = graph;
      r["graph_tflops"] = flops / (graph * 1e-3) / 1e12;
    }
    std::printf("%-22s T=%-6lld %-17s %9.3f ms %7.1f TFLOP/s%s\n", name.c_str(),
                static_cast<long long>(tokens), pass.c_str(), ms, r["tflops"].get<double>(),
                graph > 0 ? (" | graph " + std::to_string(graph) + " ms").c_str() : "");
    results.push_back(r);
  };

  // One token count: the mma kernel sets, the built-in block and the dense rate; or (`unproven`)
  // the wgmma kernel set alone. The wgmma rows run after every other row of every token count
  // (and the JSON is written before them), so a fault in the new kernels cannot lose the rest.
  auto measure = [&](int64_t T, bool unproven) {
    const int64_t N = T * kK;
    const double fwd_flops = 2.0 * N * (2 * kI * kH + kI * kH);
    const hk::Tensor x = random_bf16({T, kH}, 1.0f, 4), dy = random_bf16({T, kH}, 0.01f, 5);
    hk::Tensor y = hk::Tensor::empty({T, kH}, bf, d), logits = hk::Tensor::empty({T, kE}, bf, d);
    hk::Tensor ids = hk::Tensor::empty({T, kK}, hk::DType::I32, d),
               w = hk::Tensor::empty({T, kK}, hk::DType::F32, d),
               gu = hk::Tensor::empty({N, 2 * kI}, bf, d), dx = hk::Tensor::empty({T, kH}, bf, d);
    hk::Tensor dwr = hk::Tensor::empty({kE, kH}, bf, d),
               dgu = hk::Tensor::empty(wgu.sizes(), bf, d),
               dwd = hk::Tensor::empty(wd.sizes(), bf, d);
    hk::MoeMlpAttrs attrs;
    attrs.top_k = kK;
    attrs.norm_topk_prob = 1;
    const std::vector<hk::TensorView> in{x, wr, wgu, wd}, infer_out{y},
        train_out{y, logits, ids, w, gu};
    const std::vector<hk::TensorView> bin{dy, x, wr, wgu, wd, logits, ids, w, gu},
        bout{dx, dwr, dgu, dwd};
    const size_t ws = std::max({fn.workspace_size(false, in, infer_out, &attrs, sizeof attrs),
                                fn.workspace_size(false, in, train_out, &attrs, sizeof attrs),
                                fn.workspace_size(true, bin, bout, &attrs, sizeof attrs)});
    hk::Tensor workspace = hk::Tensor::empty({static_cast<int64_t>(ws)}, hk::DType::U8, d);
    hk::KernelCallOptions o;
    o.stream = s;
    o.workspace = workspace.view().ptr();
    o.workspace_size = ws;
    auto forward = [&] { fn.forward(in, infer_out, attrs, o); };
    auto train = [&] {
      fn.forward(in, train_out, attrs, o);
      fn.backward(bin, bout, attrs, o);
    };
    // Each kernel set of the expert GEMMs (the library reads the variables on every call).
    struct Kernels {
      const char *name, *gemm, *tile;
    };
    for (const Kernels& k : {Kernels{"hk megablocks", "mma", "128x128"},
                             Kernels{"hk megablocks 128x256", "mma", "128x256"},
                             Kernels{"hk megablocks wgmma", "wgmma", "128x128"},
                             Kernels{"hk megablocks tma", "tma", "128x128"}}) {
      if ((std::string(k.gemm) == "wgmma" || std::string(k.gemm) == "tma") != unproven) continue;
      setenv("HK_MEGABLOCKS_GEMM", k.gemm, 1);
      setenv("MEGABLOCKS_GEMM_TILE", k.tile, 1);
      try {
        record(k.name, T, "forward", median_ms(forward, stream, reps), fwd_flops,
               graph_ms(forward, stream, reps));
        record(k.name, T, "forward+backward", median_ms(train, stream, reps), 3 * fwd_flops,
               graph_ms(train, stream, reps));
        std::fflush(stdout);
        std::fprintf(stderr, "per-stage times, %s, T=%lld (one forward+backward):\n", k.name,
                     static_cast<long long>(T));
        setenv("HK_MEGABLOCKS_TIMING", "1", 1);
        train();
        CK(cudaStreamSynchronize(stream));
        unsetenv("HK_MEGABLOCKS_TIMING");
      } catch (const std::exception& e) {  // e.g. wgmma on a GPU that is not a Hopper
        unsetenv("HK_MEGABLOCKS_TIMING");
        std::fprintf(stderr, "hk_bench_moe: %s skipped: %s\n", k.name, e.what());
      }
    }
    unsetenv("HK_MEGABLOCKS_GEMM");
    unsetenv("MEGABLOCKS_GEMM_TILE");
    if (unproven) return;

    // The built-in block (reference; syncs the host for the routing).
    {
      hk::nn::MoeMLP block(hk::nn::MoeShape{kH, kE, kK, kI, true, "silu", "Qwen3Moe"});
      block.gate->slot("weight").value = wr;
      block.experts->slot("gate_up_proj").value = wgu;
      block.experts->slot("down_proj").value = wd;
      hk::Tensor yb = hk::Tensor::empty({T, kH}, bf, d);
      record("hk built-in block", T, "forward",
             median_ms([&] { block.forward(x, yb, s); }, stream, std::max(3, reps / 3), 1),
             fwd_flops, 0);
    }

    // Dense cuBLAS GEMMs with the experts' shapes at M = T·k: the rate the grouped GEMMs are
    // held to.
    {
      const hk::Tensor a = random_bf16({N, kH}, 1.0f, 6), act = random_bf16({N, kI}, 1.0f, 7),
                       g = random_bf16({N, 2 * kI}, 1.0f, 8), dyr = random_bf16({N, kH}, 1.0f, 9);
      const hk::Tensor wgu0 = wgu.select(0, 0).contiguous(s), wd0 = wd.select(0, 0).contiguous(s);
      hk::Tensor c1 = hk::Tensor::empty({N, 2 * kI}, bf, d), c2 = hk::Tensor::empty({N, kH}, bf, d),
                 c3 = hk::Tensor::empty({N, kI}, bf, d), c4 = hk::Tensor::empty({N, kH}, bf, d),
                 c5 = hk::Tensor::empty({kH, kI}, bf, d),
                 c6 = hk::Tensor::empty({2 * kI, kH}, bf, d);
      auto dense_forward = [&] {
        hk::ops::linear(a, wgu0, nullptr, c1, s);   // [N, H]·[2I, H]ᵀ
        hk::ops::linear(act, wd0, nullptr, c2, s);  // [N, I]·[H, I]ᵀ
      };
      hk::ops::MatmulOptions ta;
      ta.trans_a = true;
      auto dense_train = [&] {
        dense_forward();
        hk::ops::matmul(dyr, wd0, c3, {}, s);  // [N, H]·[H, I]
        hk::ops::matmul(g, wgu0, c4, {}, s);   // [N, 2I]·[2I, H]
        hk::ops::matmul(dyr, act, c5, ta, s);  // [N, H]ᵀ·[N, I]
        hk::ops::matmul(g, a, c6, ta, s);      // [N, 2I]ᵀ·[N, H]
      };
      record("cuBLAS dense bf16", T, "forward", median_ms(dense_forward, stream, reps), fwd_flops,
             0);
      record("cuBLAS dense bf16", T, "forward+backward", median_ms(dense_train, stream, reps),
             3 * fwd_flops, 0);
    }
  };
  auto document = [&] {
    return json{
        {"benchmark", "moe"},
        {"gpu", gpu_name()},
        {"commit", std::getenv("HK_COMMIT") ? std::getenv("HK_COMMIT") : ""},
        {"shape", {{"hidden", kH}, {"experts", kE}, {"top_k", kK}, {"intermediate", kI}}},
        {"flops", "routed tokens: forward 2*T*k*3*H*I, forward+backward 3x; router not counted"},
        {"results", results}};
  };
  for (int64_t T : token_counts) measure(T, false);
  if (!out_path.empty()) std::ofstream(out_path) << document().dump(1) << "\n";
  for (int64_t T : token_counts) measure(T, true);
  if (!out_path.empty()) {
    std::ofstream(out_path) << document().dump(1) << "\n";
  } else {
    std::cout << document().dump(1) << "\n";
  }
  CK(cudaStreamDestroy(stream));
  return 0;
}
