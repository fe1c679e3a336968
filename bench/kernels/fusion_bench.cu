// bench/kernels/fusion_bench.cu — the fused RMSNorm → SwiGLU MLP (LigerRMSNormSwiGLUMLP,
// liger::cuda::rms_norm_mlp_fwd/bwd) against the unfused pair the model runs without the fusion
// (LigerRMSNorm then LigerSwiGLUMLP: rms_norm_fwd + mlp_fwd), at Qwen3-0.6B's shapes (bf16, hidden
// 1024, intermediate 3072) from one decode row to a training batch, and writes one JSON document.
// bench/peers/fusion_torch.py times PyTorch (eager and torch.compile) at the same shapes;
// bench/kernels/fusion_table.py merges the two (scripts/gpu-test --fusion).
//
// Method (bench_cuda.cuh, as liger_bench): CUDA events around each call, warm-up first, median of
// the repeats; inputs and weights rotated among buffer sets larger than L2 so repeats do not
// measure it; and the same calls as replays of a CUDA graph holding several of them (launch gaps
// removed). Backward at the training row counts only, both sides reading what their training
// forward keeps (the pair: the norm's output and the MLP's gate / up; the fused kernel: gu [rows,
// 2I]). GEMM FLOPs are 2·rows·H·3I forward (+2× backward); the reported TFLOP/s are those over the
// time.
//
// Usage: fusion_bench [--out FILE.json] [--quick]   (--quick: fewer rows and repeats)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_cuda.cuh"
#include "cuda/gemm.h"
#include "liger/cuda_ops.h"

namespace {

using liger::Dt;
using liger::Rows;
using Call = std::function<void(int, cudaStream_t)>;

void* device_random(size_t elems, uint32_t seed, float scale) {
  void* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(elems, 1) * 2));
  bench::fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), static_cast<int64_t>(elems),
                                  scale / 2, 0.0f, seed);
  CK(cudaGetLastError());
  return p;
}

Rows rows(void* p, int64_t r, int64_t c) {
  return Rows{p, r, c, c, Dt::BF16};
}

struct Sets {  // one buffer set per rotation slot
  std::vector<void*> x, norm_w, gate_up, down, y, dy, dx, dnorm, dgu, ddown;
};

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc)
      out = argv[++i];
    else if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else {
      std::fprintf(stderr, "usage: fusion_bench [--out FILE.json] [--quick]\n");
      return 2;
    }
  }
  const int64_t H = 1024, I = 3072;
  const std::vector<int64_t> row_counts =
      quick ? std::vector<int64_t>{1, 128, 2048}
            : std::vector<int64_t>{1, 8, 64, 512, 2048, 8192, 16384};
  const int reps = quick ? 10 : 30;
  const int kSets = 4;  // 4 × (gate_up + down) bf16 = 75 MB of weights, beyond the H200's L2
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const int64_t max_rows = row_counts.back();

  Sets b;
  for (int k = 0; k < kSets; ++k) {
    const uint32_t seed = 100 * k;
    b.x.push_back(device_random(max_rows * H, seed + 1, 4.0f));
    b.norm_w.push_back(device_random(H, seed + 2, 0.5f));
    b.gate_up.push_back(device_random(2 * I * H, seed + 3, 0.1f));
    b.down.push_back(device_random(H * I, seed + 4, 0.1f));
    b.y.push_back(device_random(max_rows * H, seed + 5, 0));
    b.dy.push_back(device_random(max_rows * H, seed + 6, 1.0f));
    b.dx.push_back(device_random(max_rows * H, seed + 7, 0));
    b.dnorm.push_back(device_random(H, seed + 8, 0));
    b.dgu.push_back(device_random(2 * I * H, seed + 9, 0));
    b.ddown.push_back(device_random(H * I, seed + 10, 0));
  }
  // The unfused pair's normalised rows and its dn (what the model's norm writes and reads back).
  void* normed = device_random(max_rows * H, 11, 0);
  void* dnormed = device_random(max_rows * H, 12, 0);
  // ... and the gate / up pre-activations its training forward keeps (LigerSwiGLUMLP's backward
  // then runs 6 GEMMs, not 8)
  void* kept_gate = device_random(max_rows * I, 13, 1.0f);
  void* kept_up = device_random(max_rows * I, 14, 1.0f);
  void* kept_gate_up = device_random(max_rows * 2 * I, 15, 1.0f);  // the fused forward's, likewise
  auto fused_args = [&](int k, int64_t r) {
    liger::RmsNormMlpArgs a;
    a.act = liger::Act::SiLU;
    a.eps = 1e-6f;
    a.x = rows(b.x[k], r, H);
    a.norm_w = liger::Vec{b.norm_w[k], Dt::BF16};
    a.gate_up_w = rows(b.gate_up[k], 2 * I, H);
    a.down_w = rows(b.down[k], H, I);
    a.y = rows(b.y[k], r, H);
    a.dy = rows(b.dy[k], r, H);
    a.dx = rows(b.dx[k], r, H);
    a.dnorm_w = liger::Vec{b.dnorm[k], Dt::BF16};
    a.dgate_up_w = rows(b.dgu[k], 2 * I, H);
    a.ddown_w = rows(b.ddown[k], H, I);
    return a;
  };
  size_t ws_bytes = 0;
  for (bool bwd : {false, true}) {
    ws_bytes = std::max(ws_bytes,
                        liger::cuda::rms_norm_mlp_workspace_bytes(max_rows, H, I, Dt::BF16, bwd));
    ws_bytes = std::max(ws_bytes, liger::cuda::mlp_workspace_bytes(max_rows, I, Dt::BF16, bwd));
  }
  ws_bytes = std::max(ws_bytes, liger::cuda::rms_norm_bwd_workspace_bytes(max_rows, H));
  void* ws = nullptr;
  CK(cudaMalloc(&ws, ws_bytes));

  auto fused_fwd = [&](int64_t r) {
    return [&, r](int i, cudaStream_t s) {
      liger::RmsNormMlpArgs a = fused_args(i % kSets, r);
      a.workspace = ws;
      LK(liger::cuda::rms_norm_mlp_fwd(a, s));
    };
  };
  auto unfused_fwd = [&](int64_t r) {
    return [&, r](int i, cudaStream_t s) {
      const liger::RmsNormMlpArgs a = fused_args(i % kSets, r);
      LK(liger::cuda::rms_norm_fwd(liger::norm_of(a, rows(normed, r, H), nullptr), s));
      liger::MlpArgs m = liger::mlp_on_normed(a, rows(normed, r, H));
      m.workspace = ws;
      LK(liger::cuda::mlp_fwd(m, s));
    };
  };
  auto fused_bwd = [&](int64_t r) {
    return [&, r](int i, cudaStream_t s) {
      liger::RmsNormMlpArgs a = fused_args(i % kSets, r);
      a.gate_up = rows(kept_gate_up, r, 2 * I);
      a.workspace = ws;
      LK(liger::cuda::rms_norm_mlp_bwd(a, s));
    };
  };
  // The unfused backward as the model runs it: the norm's output and the MLP's gate / up were kept
  // by the training forward; the MLP backward on them, then the norm backward.
  auto unfused_bwd = [&](int64_t r) {
    return [&, r](int i, cudaStream_t s) {
      const liger::RmsNormMlpArgs a = fused_args(i % kSets, r);
      const Rows n = rows(normed, r, H), dn = rows(dnormed, r, H);
      liger::MlpArgs m = liger::mlp_on_normed(a, n);
      m.dx = dn;
      m.gate = rows(kept_gate, r, I), m.up = rows(kept_up, r, I);
      m.workspace = ws;
      LK(liger::cuda::mlp_bwd(m, s));
      LK(liger::cuda::rms_norm_bwd(liger::norm_backward_of(a, dn, nullptr, ws), s));
    };
  };

  std::string json = "{\n \"bench\": \"fusion\",\n \"kernel\": \"LigerRMSNormSwiGLUMLP\",\n";
  json += " \"gpu\": \"" + std::string(prop.name) + "\",\n";
  const char* commit = std::getenv("HK_COMMIT");
  json += " \"commit\": \"" + std::string(commit ? commit : "unknown") + "\",\n";
  json += " \"hidden\": 1024, \"intermediate\": 3072, \"dtype\": \"bf16\",\n \"cases\": [\n";
  std::printf("%-8s %-9s %-6s %10s %10s %8s %8s\n", "rows", "pass", "mode", "fused ms", "pair ms",
              "speedup", "TFLOP/s");
  bool first = true;
  for (int64_t r : row_counts)
    for (bool bwd : {false, true}) {
      if (bwd && r < 512) continue;  // training row counts only
      for (bool graph : {false, true}) {
        const Call fc = bwd ? Call(fused_bwd(r)) : Call(fused_fwd(r));
        const Call uc = bwd ? Call(unfused_bwd(r)) : Call(unfused_fwd(r));
        auto timed = [&](const Call& c) {
          return graph ? bench::graph_ms(c, 10, reps)
                       : bench::time_ms([&](int i) { c(i, nullptr); }, 3, reps);
        };
        const double f = timed(fc), u = timed(uc);
        const double flops = 2.0 * r * H * 3 * I * (bwd ? 2 : 1);
        std::printf("%-8lld %-9s %-6s %10.4f %10.4f %8.3f %8.1f\n", static_cast<long long>(r),
                    bwd ? "backward" : "forward", graph ? "graph" : "call", f, u, u / f,
                    flops / f / 1e9);
        char line[512];
        std::snprintf(
            line, sizeof line,
            "%s  {\"rows\": %lld, \"pass\": \"%s\", \"mode\": \"%s\", \"fused_ms\": %.5f, "
            "\"unfused_pair_ms\": %.5f, \"speedup\": %.4f, \"fused_tflops\": %.2f}",
            first ? "" : ",\n", static_cast<long long>(r), bwd ? "backward" : "forward",
            graph ? "graph" : "call", f, u, u / f, flops / f / 1e9);
        json += line;
        first = false;
      }
    }
  json += "\n ]\n}\n";
  return bench::write_json(json, out) ? 0 : 1;
}
