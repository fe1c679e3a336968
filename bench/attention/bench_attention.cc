// hk_bench_attention — device timings of hk's flash attention (hk::ops::fused_attention, the CUDA
// "sdpa") on one GPU, written as JSON for bench/attention/compare_attention.py, which puts them
// beside PyTorch SDPA's flash and cuDNN backends (bench/peers/attention_torch.py, same run).
//
//   prefill (issue 11's shapes, bf16, causal, head dim 128): B8×H16(kv8)×S2048, B2×H16×S8192,
//     B1×H32(kv8)×S16384 — forward (the dispatcher's kernel: sm90 wgmma; and the mma.sync kernel
//     for comparison), forward+backward (the default backward: the Hopper kernel, dq by TMA
//     reduce-add; the mma.sync backward; deterministic); also the training step's
//     B4×H16(kv8)×S2048 and B8×H16(kv8)×S2048 at head dim 64.
//     TFLOP/s with causal FLOPs = ½·4·B·Hq·S·T·D forward, 3.5× that for forward+backward.
//   decode (batch 1, 16 q / 8 kv heads, D 128, caches of 4096 and 32768 keys): the split-KV
//     kernel (its splits through the workspace, and beside it combined in a cluster), per call in
//     CUDA-graph replay (20 calls per graph, caches rotated so the KV bytes
//     come from HBM, not L2); GB/s of K+V bytes read, against the copy bandwidth measured here
//     (a 256 MiB device-to-device copy, bytes read + written); beside it, in the same replay form,
//     a kernel that only reads the same K/V bytes and an empty kernel (read_roofline.cu): the
//     best any decode call could do here.
// Method: random inputs in [-1, 1) (never zeros); 3 warm-up calls; then each call (or graph
// replay) between two CUDA events, repetitions sized to ~300 ms, the median reported.
//
// Usage: hk_bench_attention [--out FILE.json] [--quick] [--decode-only]
//   (--quick: fewer repetitions; --decode-only: the decode rows alone, for profilers)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "hk/device.h"
#include "hk/ops.h"
#include "hk/stream.h"
#include "hk/tensor.h"
#include "read_roofline.h"

namespace {

using hk::DType;
using hk::Tensor;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "hk_bench_attention: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

Tensor random_gpu(const hk::Shape& shape, uint32_t seed) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return Tensor::from_floats(v, shape, DType::BF16).to(hk::Device::cuda(0));
}

bool g_quick = false;

// Median ms of `fn` on `stream`, each call between two events.
double time_ms(const std::function<void()>& fn, cudaStream_t stream = nullptr) {
  for (int i = 0; i < 3; ++i) fn();
  check(cudaStreamSynchronize(stream), "warm-up");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  check(cudaEventRecord(a, stream), "record");
  fn();
  check(cudaEventRecord(b, stream), "record");
  check(cudaEventSynchronize(b), "sync");
  float first = 0;
  check(cudaEventElapsedTime(&first, a, b), "elapsed");
  const int reps = std::clamp(static_cast<int>((g_quick ? 60.0 : 300.0) / std::max(first, 0.001f)),
                              5, g_quick ? 50 : 200);
  std::vector<float> t(reps);
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(a, stream), "record");
    fn();
    check(cudaEventRecord(b, stream), "record");
    check(cudaEventSynchronize(b), "sync");
    check(cudaEventElapsedTime(&t[i], a, b), "elapsed");
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[reps / 2];
}

struct Env {  // sets an environment variable for one measurement, then restores it
  Env(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value, 1);
  }
  ~Env() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }
  const char* name_;
  bool had_ = false;
  std::string old_;
};

std::string json_num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

std::string prefill(int64_t B, int64_t Hq, int64_t Hkv, int64_t S, int64_t D) {
  const Tensor q = random_gpu({B, S, Hq, D}, 1), k = random_gpu({B, S, Hkv, D}, 2),
               v = random_gpu({B, S, Hkv, D}, 3), dout = random_gpu({B, S, Hq, D}, 4);
  const hk::Device dev = hk::Device::cuda(0);
  Tensor out = Tensor::empty(q.sizes(), DType::BF16, dev);
  Tensor lse = Tensor::empty({B, Hq, S}, DType::F32, dev);
  Tensor dq = Tensor::empty(q.sizes(), DType::BF16, dev),
         dk = Tensor::empty(k.sizes(), DType::BF16, dev),
         dv = Tensor::empty(v.sizes(), DType::BF16, dev);
  hk::ops::FusedAttentionOptions o;
  const double flops = 0.5 * 4.0 * B * Hq * S * S * D;
  auto fwd = [&] { hk::ops::fused_attention(q, k, v, out, o, &lse.view()); };
  auto fwd_bwd = [&] {
    fwd();
    hk::ops::fused_attention_backward(dout, q, k, v, out, lse, dq, dk, dv, o);
  };
  {
    Env verbose("HK_FLASH_VERBOSE", "1");  // which kernel runs, once, on stderr
    fwd();
  }
  const double t_fwd = time_ms(fwd);
  double t_fwd80 = 0;
  {
    Env e("HK_FLASH_SM90", "0");
    t_fwd80 = time_ms(fwd);
  }
  const double t_fb = time_ms(fwd_bwd);
  double t_fb80 = 0;
  {
    Env e("HK_FLASH_SM90_BWD", "0");
    t_fb80 = time_ms(fwd_bwd);
  }
  o.deterministic = true;
  const double t_fb_det = time_ms(fwd_bwd);
  o.deterministic = false;
  const double t_bwd = t_fb - t_fwd;
  auto tf = [](double f, double ms) { return f / (ms * 1e-3) / 1e12; };
  char name[128];
  std::snprintf(name, sizeof(name), "B%ldxH%ld(kv%ld)xS%ld%s", long(B), long(Hq), long(Hkv),
                long(S), D == 128 ? "" : (" D" + std::to_string(D)).c_str());
  std::printf(
      "%-26s fwd %8.3f ms %6.1f TF/s (sm80 %6.1f) | fwd+bwd %8.3f ms %6.1f TF/s "
      "(deterministic %6.1f, sm80 backward %6.1f) | bwd %6.1f TF/s\n",
      name, t_fwd, tf(flops, t_fwd), tf(flops, t_fwd80), t_fb, tf(3.5 * flops, t_fb),
      tf(3.5 * flops, t_fb_det), tf(3.5 * flops, t_fb80), tf(2.5 * flops, t_bwd));
  std::fflush(stdout);
  return std::string("{\"shape\": \"") + name + "\", \"B\": " + std::to_string(B) +
         ", \"Hq\": " + std::to_string(Hq) + ", \"Hkv\": " + std::to_string(Hkv) +
         ", \"S\": " + std::to_string(S) + ", \"D\": " + std::to_string(D) +
         ", \"fwd_ms\": " + json_num(t_fwd) + ", \"fwd_tflops\": " + json_num(tf(flops, t_fwd)) +
         ", \"fwd_sm80_ms\": " + json_num(t_fwd80) +
         ", \"fwd_sm80_tflops\": " + json_num(tf(flops, t_fwd80)) +
         ", \"fwdbwd_ms\": " + json_num(t_fb) +
         ", \"fwdbwd_tflops\": " + json_num(tf(3.5 * flops, t_fb)) +
         ", \"fwdbwd_sm80_bwd_ms\": " + json_num(t_fb80) +
         ", \"fwdbwd_sm80_bwd_tflops\": " + json_num(tf(3.5 * flops, t_fb80)) +
         ", \"fwdbwd_deterministic_ms\": " + json_num(t_fb_det) +
         ", \"fwdbwd_deterministic_tflops\": " + json_num(tf(3.5 * flops, t_fb_det)) + "}";
}

std::string decode(int64_t T, double copy_gbps) {
  const int64_t Hq = 16, Hkv = 8, D = 128;
  const double kv_bytes = 2.0 * T * Hkv * D * 2;
  // enough caches that one graph's calls read > 4× the 60 MB L2
  const int copies = std::max<int>(2, static_cast<int>(std::ceil(256e6 / kv_bytes)));
  std::vector<Tensor> ks, vs;
  for (int i = 0; i < copies; ++i) {
    ks.push_back(random_gpu({1, T, Hkv, D}, 10 + 2 * i));
    vs.push_back(random_gpu({1, T, Hkv, D}, 11 + 2 * i));
  }
  const hk::Device dev = hk::Device::cuda(0);
  const Tensor q = random_gpu({1, 1, Hq, D}, 5);
  Tensor out = Tensor::empty(q.sizes(), DType::BF16, dev);
  hk::ops::FusedAttentionOptions o;
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  const hk::Stream hs{s};
  constexpr int kCalls = 20;
  // call(i): the i-th of a graph's kCalls launches, reading cache copy i % copies
  auto replay_us = [&](const std::function<void(int)>& call) {
    for (int i = 0; i < copies; ++i) call(i);
    check(cudaStreamSynchronize(s), "warm");
    cudaGraph_t g;
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "capture");
    for (int i = 0; i < kCalls; ++i) call(i);
    check(cudaStreamEndCapture(s, &g), "end capture");
    cudaGraphExec_t e;
    check(cudaGraphInstantiate(&e, g, 0), "instantiate");
    cudaGraphDestroy(g);
    const double t = time_ms([&] { check(cudaGraphLaunch(e, s), "launch"); }, s) / kCalls;
    cudaGraphExecDestroy(e);
    return t;
  };
  auto attention = [&](int i) {
    hk::ops::fused_attention(q, ks[i % copies], vs[i % copies], out, o, nullptr, hs);
  };
  {
    Env verbose("HK_FLASH_VERBOSE", "1");
    attention(0);
  }
  const double t_split = replay_us(attention);
  double t_cluster = 0;  // the splits combined inside a cluster (callers without a workspace)
  {
    Env e("HK_FLASH_DECODE_CLUSTER", "1");
    t_cluster = replay_us(attention);
  }
  double t_one = 0;
  {
    Env e("HK_FLASH_DECODE", "0");
    t_one = replay_us(attention);
  }
  const double per_call = time_ms([&] { attention(0); }, s);
  // the bound: the same bytes read by a kernel that does nothing else, and an empty kernel
  unsigned* sink = nullptr;
  check(cudaMalloc(&sink, sizeof(unsigned)), "malloc");
  const double read_ms = replay_us([&](int i) {
    launch_read_kv(ks[i % copies].view().ptr(), vs[i % copies].view().ptr(),
                   static_cast<size_t>(kv_bytes / 2), sink, s);
  });
  const double empty_ms = replay_us([&](int) { launch_empty(s); });
  cudaFree(sink);
  cudaStreamDestroy(s);
  const double gbps = kv_bytes / (t_split * 1e-3) / 1e9;
  const double read_gbps = kv_bytes / (read_ms * 1e-3) / 1e9;
  std::printf(
      "decode B1 16/8 D128 T%-6ld split-kv %7.2f us %7.0f GB/s = %5.1f%% of copy | "
      "cluster form %7.2f us | prefill kernel %7.2f us | per call (not graphed) %7.2f us | "
      "read-only kernel %7.2f us %7.0f GB/s = %5.1f%% of copy, empty kernel %5.2f us\n",
      long(T), t_split * 1e3, gbps, 100.0 * gbps / copy_gbps, t_cluster * 1e3, t_one * 1e3,
      per_call * 1e3, read_ms * 1e3, read_gbps, 100.0 * read_gbps / copy_gbps, empty_ms * 1e3);
  std::fflush(stdout);
  return "{\"T\": " + std::to_string(T) +
         ", \"Hq\": 16, \"Hkv\": 8, \"D\": 128, \"kv_bytes\": " + json_num(kv_bytes) +
         ", \"graph_us\": " + json_num(t_split * 1e3) + ", \"gbps\": " + json_num(gbps) +
         ", \"pct_of_copy\": " + json_num(100 * gbps / copy_gbps) +
         ", \"cluster_form_graph_us\": " + json_num(t_cluster * 1e3) +
         ", \"prefill_kernel_graph_us\": " + json_num(t_one * 1e3) +
         ", \"per_call_us\": " + json_num(per_call * 1e3) +
         ", \"read_only_kernel_graph_us\": " + json_num(read_ms * 1e3) +
         ", \"read_only_kernel_pct_of_copy\": " + json_num(100 * read_gbps / copy_gbps) +
         ", \"empty_kernel_graph_us\": " + json_num(empty_ms * 1e3) + "}";
}

double copy_bandwidth() {
  const size_t bytes = size_t(256) << 20;
  void *a = nullptr, *b = nullptr;
  check(cudaMalloc(&a, bytes), "malloc");
  check(cudaMalloc(&b, bytes), "malloc");
  check(cudaMemset(a, 1, bytes), "memset");
  const double ms =
      time_ms([&] { check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice), "copy"); });
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path;
  bool decode_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) {
      out_path = argv[++i];
    } else if (a == "--quick") {
      g_quick = true;
    } else if (a == "--decode-only") {
      decode_only = true;
    } else {
      std::fprintf(stderr,
                   "usage: hk_bench_attention [--out FILE.json] [--quick] [--decode-only]\n");
      return 1;
    }
  }
  if (hk::cuda_device_count() == 0) {
    std::fprintf(stderr, "hk_bench_attention: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  const double copy = copy_bandwidth();
  std::printf("%s, copy bandwidth %.0f GB/s (read + write)\n", prop.name, copy);
  std::string json = std::string("{\"gpu\": \"") + prop.name +
                     "\", \"copy_gbps\": " + json_num(copy) + ", \"prefill\": [";
  // decode first: it does not touch the Hopper kernel, so its numbers survive a prefill failure
  const std::string d1 = decode(4096, copy), d2 = decode(32768, copy);
  if (decode_only) {
    json += "], \"decode\": [" + d1 + ", " + d2 + "]}\n";
    if (!out_path.empty()) std::ofstream(out_path) << json;
    return 0;
  }
  json += prefill(8, 16, 8, 2048, 128) + ", ";
  json += prefill(2, 16, 16, 8192, 128) + ", ";
  json += prefill(1, 32, 8, 16384, 128) + ", ";
  json += prefill(4, 16, 8, 2048, 128) + ", ";  // the training step's shape (Qwen3-0.6B, 4 x 2048)
  json += prefill(8, 16, 8, 2048, 64) + "], \"decode\": [";
  json += d1 + ", " + d2 + "]}\n";
  if (!out_path.empty()) {
    std::ofstream f(out_path);
    f << json;
  }
  return 0;
}
