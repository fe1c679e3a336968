// hk_bench_ops — times hk's built-in CUDA ops on one GPU and writes JSON.
//
// Method (docs/performance.md): inputs are random (never zeros) and larger than L2; every case is
// warmed up, then launched R times, each launch between two CUDA events on one stream; the median
// is reported. Memory-bound ops report GB/s over the bytes they must move (each input read once,
// each output written once) and that as a percentage of the device-to-device copy bandwidth
// measured in the same run (cudaMemcpyAsync D2D, read + write). Matrix ops report TFLOP/s.
// The CUDA implementations are called directly (hk::ops::cuda, the functions the public
// dispatchers call after validation), so the numbers are device time of hk's kernels.
// Not here: end-to-end model timings, CPU ops, peers (bench/peers/torch_ops.py).
//
// Usage: hk_bench_ops [--out FILE.json] [--filter SUBSTRING] [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "hk/device.h"
#include "hk/error.h"
#include "hk/ops.h"
#include "hk/stream.h"
#include "hk/tensor.h"
#include "ops/cuda_ops.h"

namespace {

using hk::DType;
using hk::Shape;
using hk::Tensor;
namespace cu = hk::ops::cuda;

struct Options {
  std::string out = "bench-hk.json";
  std::string filter;
  bool quick = false;
};

struct Case {
  std::string op, shape, dtype;
  double bytes = 0;  // bytes that must move (memory-bound ops)
  double flops = 0;  // floating-point operations (matrix ops)
  std::function<void()> run;
};

hk::Device g_device;
hk::Stream g_stream;

// Random values on the GPU: a 16 MiB random chunk copied over the whole tensor.
void fill_random(const Tensor& t, uint32_t seed) {
  const int64_t n = t.numel();
  const int64_t chunk_n = std::min<int64_t>(n, int64_t(1) << 22);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(chunk_n));
  for (auto& x : v) x = dist(rng);
  Tensor chunk = Tensor::from_floats(v, {chunk_n}, t.dtype()).to(g_device, g_stream);
  Tensor flat = t.reshape({n});
  for (int64_t off = 0; off < n; off += chunk_n) {
    const int64_t len = std::min(chunk_n, n - off);
    flat.slice(0, off, off + len).copy_from(chunk.slice(0, 0, len).view(), g_stream);
  }
}

Tensor rand_gpu(const Shape& shape, DType dt, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dt, g_device, g_stream);
  fill_random(t, seed);
  return t;
}

std::string shape_of(const Shape& s) {
  return hk::shape_str(s);
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Warm-up, then per-launch event timing; reps sized to ~300 ms of work (5..100).
double time_ms(const std::function<void()>& run, bool quick) {
  for (int i = 0; i < 3; ++i) run();
  hk::synchronize(g_device, g_stream);
  hk::Event a, b;
  a.record(g_stream);
  run();
  b.record(g_stream);
  const double first = hk::Event::elapsed_ms(a, b);
  int reps =
      static_cast<int>(std::clamp((quick ? 60.0 : 300.0) / std::max(first, 1e-3), 5.0, 100.0));
  std::vector<hk::Event> starts(static_cast<size_t>(reps)), stops(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    starts[size_t(i)].record(g_stream);
    run();
    stops[size_t(i)].record(g_stream);
  }
  std::vector<float> ms(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i)
    ms[size_t(i)] = hk::Event::elapsed_ms(starts[size_t(i)], stops[size_t(i)]);
  return median(ms);
}

std::vector<Case> make_cases(bool quick) {
  std::vector<Case> cases;
  const int64_t R = quick ? 8192 : 32768, H = 4096;  // 256 MiB per bf16 tensor (quick: 64 MiB)
  const double n = double(R) * H;

  // --- the bandwidth ceiling: device-to-device copy
  {
    auto src = std::make_shared<Tensor>(rand_gpu({R, H}, DType::BF16, 1));
    auto dst = std::make_shared<Tensor>(Tensor::empty({R, H}, DType::BF16, g_device, g_stream));
    cases.push_back({"copy", shape_of({R, H}), "bf16", 2 * n * 2, 0,
                     [=] { dst->copy_from(src->view(), g_stream); }});
  }
  // --- matmul (cuBLASLt)
  for (DType dt : {DType::BF16, DType::F16}) {
    const int64_t M = quick ? 4096 : 8192;
    auto a = std::make_shared<Tensor>(rand_gpu({M, M}, dt, 2));
    auto b = std::make_shared<Tensor>(rand_gpu({M, M}, dt, 3));
    auto c = std::make_shared<Tensor>(Tensor::empty({M, M}, dt, g_device, g_stream));
    cases.push_back({"matmul", shape_of({M, M, M}), hk::dtype_name(dt), 0, 2.0 * M * M * M,
                     [=] { cu::matmul(*a, *b, *c, {}, g_stream); }});
  }
  {  // a Linear of an 8B-class model: x[16384, 4096] · w[14336, 4096]ᵀ
    const int64_t M = quick ? 4096 : 16384, N = 14336, K = 4096;
    auto x = std::make_shared<Tensor>(rand_gpu({M, K}, DType::BF16, 4));
    auto w = std::make_shared<Tensor>(rand_gpu({N, K}, DType::BF16, 5));
    auto y = std::make_shared<Tensor>(Tensor::empty({M, N}, DType::BF16, g_device, g_stream));
    cases.push_back({"linear", shape_of({M, N, K}), "bf16", 0, 2.0 * M * N * K,
                     [=] { cu::linear(*x, *w, nullptr, *y, g_stream); }});
  }
  // --- elementwise
  for (DType dt : {DType::BF16, DType::F32}) {
    const double es = double(hk::dtype_size(dt));
    auto a = std::make_shared<Tensor>(rand_gpu({R, H}, dt, 6));
    auto b = std::make_shared<Tensor>(rand_gpu({R, H}, dt, 7));
    auto o = std::make_shared<Tensor>(Tensor::empty({R, H}, dt, g_device, g_stream));
    const std::string d = hk::dtype_name(dt);
    cases.push_back(
        {"add", shape_of({R, H}), d, 3 * n * es, 0, [=] { cu::add(*a, *b, *o, 1.0f, g_stream); }});
    cases.push_back(
        {"mul", shape_of({R, H}), d, 3 * n * es, 0, [=] { cu::mul(*a, *b, *o, g_stream); }});
    cases.push_back({"silu", shape_of({R, H}), d, 2 * n * es, 0,
                     [=] { cu::activation(hk::ops::Activation::SiLU, *a, *o, g_stream); }});
    cases.push_back({"act_mul_silu", shape_of({R, H}), d, 3 * n * es, 0,
                     [=] { cu::act_mul(hk::ops::Activation::SiLU, *a, *b, *o, g_stream); }});
  }
  {
    auto x = std::make_shared<Tensor>(rand_gpu({R, H}, DType::BF16, 8));
    auto y = std::make_shared<Tensor>(Tensor::empty({R, H}, DType::F32, g_device, g_stream));
    cases.push_back({"cast_bf16_to_f32", shape_of({R, H}), "bf16", n * 6, 0,
                     [=] { cu::cast(*x, *y, g_stream); }});
    cases.push_back({"cast_f32_to_bf16", shape_of({R, H}), "f32", n * 6, 0,
                     [=] { cu::cast(*y, *x, g_stream); }});
  }
  // --- rms_norm (Llama/Qwen hidden 4096)
  for (DType dt : {DType::BF16, DType::F32}) {
    const double es = double(hk::dtype_size(dt));
    auto x = std::make_shared<Tensor>(rand_gpu({R, H}, dt, 9));
    auto w = std::make_shared<Tensor>(rand_gpu({H}, dt, 10));
    auto y = std::make_shared<Tensor>(Tensor::empty({R, H}, dt, g_device, g_stream));
    cases.push_back({"rms_norm", shape_of({R, H}), hk::dtype_name(dt), 2 * n * es + H * es, 0,
                     [=] { cu::rms_norm(*x, *w, 1e-6f, *y, nullptr, g_stream); }});
  }
  // --- rotary: q of [B, S, 32 heads, 128]
  {
    const int64_t B = quick ? 2 : 8, S = 4096, Hh = 32, D = 128;
    auto x = std::make_shared<Tensor>(rand_gpu({B, S, Hh, D}, DType::BF16, 11));
    auto y =
        std::make_shared<Tensor>(Tensor::empty({B, S, Hh, D}, DType::BF16, g_device, g_stream));
    auto cos = std::make_shared<Tensor>(rand_gpu({1, S, D}, DType::F32, 12));
    auto sin = std::make_shared<Tensor>(rand_gpu({1, S, D}, DType::F32, 13));
    const double xb = double(B) * S * Hh * D * 2;
    cases.push_back({"rotary", shape_of({B, S, Hh, D}), "bf16", 2 * xb + 2.0 * S * D * 4, 0,
                     [=] { cu::rotary_embedding(*x, *cos, *sin, *y, g_stream); }});
  }
  // --- attention (eager: correctness first; FLOPs counted as the full 4·B·H·S·T·D)
  struct AttnShape {
    int64_t B, S, Hq, Hkv, D;
  };
  for (AttnShape s :
       {AttnShape{1, quick ? 1024 : 2048, 32, 8, 128}, AttnShape{4, 1024, 16, 16, 64}}) {
    auto q = std::make_shared<Tensor>(rand_gpu({s.B, s.S, s.Hq, s.D}, DType::BF16, 14));
    auto k = std::make_shared<Tensor>(rand_gpu({s.B, s.S, s.Hkv, s.D}, DType::BF16, 15));
    auto v = std::make_shared<Tensor>(rand_gpu({s.B, s.S, s.Hkv, s.D}, DType::BF16, 16));
    auto o = std::make_shared<Tensor>(
        Tensor::empty({s.B, s.S, s.Hq, s.D}, DType::BF16, g_device, g_stream));
    cases.push_back({"attention_causal", shape_of({s.B, s.S, s.Hq, s.Hkv, s.D}), "bf16", 0,
                     4.0 * s.B * s.Hq * s.S * s.S * s.D,
                     [=] { cu::attention(*q, *k, *v, *o, {}, nullptr, g_stream); }});
  }
  // --- cross entropy (Qwen3 vocabulary 151936; Llama-2 32000)
  struct CeShape {
    int64_t N, V;
  };
  for (CeShape s : {CeShape{quick ? 1024 : 4096, 151936}, CeShape{8192, 32000}}) {
    auto logits = std::make_shared<Tensor>(rand_gpu({s.N, s.V}, DType::BF16, 17));
    std::vector<int64_t> lv(static_cast<size_t>(s.N));
    std::mt19937 rng(18);
    for (auto& l : lv) l = std::uniform_int_distribution<int64_t>(0, s.V - 1)(rng);
    auto labels = std::make_shared<Tensor>(Tensor::from_ints(lv, {s.N}).to(g_device, g_stream));
    auto loss = std::make_shared<Tensor>(Tensor::empty({}, DType::F32, g_device, g_stream));
    auto dlogits =
        std::make_shared<Tensor>(Tensor::empty({s.N, s.V}, DType::BF16, g_device, g_stream));
    auto dloss = std::make_shared<Tensor>(
        Tensor::from_floats({1.0f}, {}, DType::F32).to(g_device, g_stream));
    const double lb = double(s.N) * s.V * 2;
    cases.push_back({"cross_entropy", shape_of({s.N, s.V}), "bf16", lb, 0,
                     [=] { cu::cross_entropy(*logits, *labels, *loss, {}, nullptr, g_stream); }});
    cases.push_back({"cross_entropy_backward", shape_of({s.N, s.V}), "bf16", 2 * lb, 0, [=] {
                       cu::cross_entropy_backward(*dloss, *logits, *labels, *dlogits, {}, nullptr,
                                                  g_stream);
                     }});
  }
  return cases;
}

int run(const Options& opt) {
  if (hk::cuda_device_count() == 0) {
    std::cerr << "hk_bench_ops: no CUDA device visible\n";
    return 1;
  }
  g_device = hk::Device::cuda(0);
  hk::OwnedStream stream(g_device);
  g_stream = stream.get();
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);

  nlohmann::json out;
  out["tool"] = "hk_bench_ops";
  out["gpu"] = prop.name;
  out["sm_count"] = prop.multiProcessorCount;
  out["l2_bytes"] = prop.l2CacheSize;
  out["method"] = "median of per-launch CUDA event times after 3 warm-ups; random inputs";
  out["results"] = nlohmann::json::array();

  std::vector<Case> cases = make_cases(opt.quick);
  hk::synchronize(g_device, g_stream);
  double copy_gbps = 0;
  std::printf("%-24s %-28s %-5s %10s %10s %10s %8s\n", "op", "shape", "dtype", "ms", "GB/s",
              "TFLOP/s", "%copy");
  for (const Case& c : cases) {
    if (!opt.filter.empty() && c.op.find(opt.filter) == std::string::npos && c.op != "copy")
      continue;
    nlohmann::json r;
    r["op"] = c.op;
    r["shape"] = c.shape;
    r["dtype"] = c.dtype;
    try {
      const double ms = time_ms(c.run, opt.quick);
      r["ms"] = ms;
      double gbps = 0, tflops = 0, pct = 0;
      if (c.bytes > 0) {
        gbps = c.bytes / (ms * 1e-3) / 1e9;
        r["bytes"] = c.bytes;
        r["gbps"] = gbps;
        if (c.op == "copy") copy_gbps = gbps;
        if (copy_gbps > 0) {
          pct = 100.0 * gbps / copy_gbps;
          r["pct_of_copy"] = pct;
        }
      }
      if (c.flops > 0) {
        tflops = c.flops / (ms * 1e-3) / 1e12;
        r["flops"] = c.flops;
        r["tflops"] = tflops;
      }
      std::printf("%-24s %-28s %-5s %10.4f %10.1f %10.1f %8.1f\n", c.op.c_str(), c.shape.c_str(),
                  c.dtype.c_str(), ms, gbps, tflops, pct);
    } catch (const std::exception& e) {
      r["error"] = e.what();
      std::printf("%-24s %-28s %-5s FAILED: %s\n", c.op.c_str(), c.shape.c_str(), c.dtype.c_str(),
                  e.what());
    }
    std::fflush(stdout);
    out["results"].push_back(r);
  }
  out["copy_gbps"] = copy_gbps;
  std::ofstream f(opt.out);
  if (!f) {
    std::cerr << "hk_bench_ops: cannot write " << opt.out << "\n";
    return 1;
  }
  f << out.dump(2) << "\n";
  std::cout << "wrote " << opt.out << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc)
      opt.out = argv[++i];
    else if (a == "--filter" && i + 1 < argc)
      opt.filter = argv[++i];
    else if (a == "--quick")
      opt.quick = true;
    else {
      std::cerr << "usage: hk_bench_ops [--out FILE.json] [--filter SUBSTRING] [--quick]\n";
      return 2;
    }
  }
  try {
    return run(opt);
  } catch (const std::exception& e) {
    std::cerr << "hk_bench_ops: " << e.what() << "\n";
    return 1;
  }
}
