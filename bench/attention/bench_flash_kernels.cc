// hk_bench_flash_kernels — device timings of each flash kernel called directly (flash.h, no libhk):
// the forward (dispatcher's choice, and each Hopper layout forced: HK_FLASH_SM90_FWD=v1 with a
// producer warpgroup, v2 with two warpgroups, v3 = v2 with two query tiles a block, v4 = v2
// streaming query tiles, a block an SM, v5 = v1 streaming them) and every
// backward variant (mma.sync; Hopper with dq
// by TMA reduce-add, by atomics; deterministic), so a kernel change is measured without building
// libhk. fwd+bwd is timed with the dispatcher's forward and with v2's. The columns marked * time
// the Hopper backward's dq forms (HK_FLASH_BWD_DQ=tma, warp, wg) in a mirrored order.
//
//   shapes (bf16, causal): issue 11's B8×H16(kv8)×S2048, B2×H16×S8192, B1×H32(kv8)×S16384 at head
//   dim 128, the training step's B4×H16(kv8)×S2048 at 128, and B8×H16(kv8)×S2048 at head dim 64.
//   TFLOP/s with causal FLOPs = ½·4·B·Hq·S·T·D forward, 2.5× that backward, 3.5× forward+backward.
// Method: random inputs in [-1, 1); at each shape the dispatcher's forward and forward+backward
// are timed first (the peer's order), then the layouts (v1-v5 in a mirrored order, pairs
// averaged) and backward kernels one by one; 2 warm-up
// calls; each call between two CUDA events, repeated to ~150 ms (at least 5), the median reported.
// The SM clock is probed right after the forward, the forward+backward and the Hopper backward
// timings (clock_probe.h; a line a shape on stderr and three JSON keys): at the power cap a figure
// follows the clock.
//
// Usage: hk_bench_flash_kernels [--out FILE.json] [--quick] [--shape N]
//   --shape N: only the N-th shape of the list (0-based), e.g. to profile one under ncu
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "clock_probe.h"
#include "gpu_attention/flash_kernel_harness.h"

namespace {

using namespace flash_harness;

bool g_quick = false;

double time_ms(const std::function<void()>& fn) {
  for (int i = 0; i < 2; ++i) fn();
  check(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  auto once = [&] {
    check(cudaEventRecord(a), "record");
    fn();
    check(cudaEventRecord(b), "record");
    check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    return ms;
  };
  const float first = once();
  const int reps = std::clamp(static_cast<int>((g_quick ? 40.0 : 150.0) / std::max(first, 0.001f)),
                              5, g_quick ? 20 : 100);
  std::vector<float> t(reps);
  for (auto& x : t) x = once();
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

struct Shape {
  const char* name;
  int b, hq, hkv, s, d;
};

// A non-negative decimal index, the whole string.
bool parse_index(const char* s, int* out) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < 0 || v > 1000) return false;
  *out = static_cast<int>(v);
  return true;
}

#ifdef HK_FLASH_TRACE
// A trace build (cmake -DCMAKE_CUDA_FLAGS=-DHK_FLASH_TRACE=1 -DCMAKE_CXX_FLAGS=-DHK_FLASH_TRACE=1
// in a build directory of its own): one call with the Hopper kernel's phase stamps on; prints each
// phase's mean length per warpgroup (cycles, over every block and every tile of a block's stream
// but its first and last), in the kernel's order. Returns the stamps ([block][warpgroup][tile]
// [phases]).
std::vector<unsigned long long> print_trace(const char* what, int blocks, int phases,
                                            const char* const* names,
                                            const std::function<void(unsigned long long*)>& call) {
  constexpr int kTiles = hk_flash::kTraceTiles;
  const size_t n = static_cast<size_t>(blocks) * 2 * kTiles * phases;
  unsigned long long* dev = nullptr;
  check(cudaMalloc(&dev, n * 8), "trace buffer");
  check(cudaMemset(dev, 0, n * 8), "trace clear");
  call(dev);
  check(cudaDeviceSynchronize(), "traced call");
  std::vector<unsigned long long> h(n);
  check(cudaMemcpy(h.data(), dev, n * 8, cudaMemcpyDeviceToHost), "trace copy");
  check(cudaFree(dev), "trace free");
  for (int wg = 0; wg < 2; ++wg) {
    std::vector<double> sum(phases, 0.0);
    double period = 0;
    long count = 0;
    for (int blk = 0; blk < blocks; ++blk)
      for (int it = 1; it + 1 < kTiles; ++it) {
        const unsigned long long* t =
            &h[((static_cast<size_t>(blk) * 2 + wg) * kTiles + it) * phases];
        const unsigned long long next = t[phases];  // the next tile's first stamp
        if (t[0] == 0 || t[phases - 1] == 0 || next == 0) continue;
        for (int ph = 0; ph + 1 < phases; ++ph) sum[ph] += static_cast<double>(t[ph + 1] - t[ph]);
        sum[phases - 1] += static_cast<double>(next - t[phases - 1]);
        period += static_cast<double>(next - t[0]);
        ++count;
      }
    std::printf("trace %s warpgroup %d (%ld tiles): period %.0f cycles;", what, wg, count,
                count ? period / count : 0.0);
    for (int ph = 0; ph + 1 < phases; ++ph)
      std::printf(" %s %.0f;", names[ph], count ? sum[ph] / count : 0.0);
    std::printf(" loop back %.0f\n", count ? sum[phases - 1] / count : 0.0);
  }
  return h;
}

// A kernel's block lives (tile slot 0 of each warpgroup's row, trace_block): a block's start
// (its first stamp) to its first S issue, its last epilogue, per SM the idle cycles between
// one block's end (the later warpgroup's) and the next block's start, and the balance: each SM's
// span (its first block's start to its last block's end; clock64 counts per SM, so spans compare
// across SMs only as lengths) against the longest.
void print_block_lives(const char* what, const std::vector<unsigned long long>& h, int blocks,
                       int phases) {
  struct Life {
    unsigned long long sm, start, first_s, epilogue, end;
  };
  std::vector<Life> lives;
  const size_t row = static_cast<size_t>(hk_flash::kTraceTiles) * phases;
  for (int blk = 0; blk < blocks; ++blk) {
    const unsigned long long* w0 = &h[(static_cast<size_t>(blk) * 2) * row];
    const unsigned long long* w1 = w0 + row;
    if (w0[1] == 0 || w0[2] == 0 || w0[4] == 0) continue;  // a block with no keys
    lives.push_back({w0[0], w0[1], w0[2], w0[3], std::max(w0[4], w1[4])});
  }
  std::sort(lives.begin(), lives.end(), [](const Life& a, const Life& b) {
    return a.sm != b.sm ? a.sm < b.sm : a.start < b.start;
  });
  double to_first_s = 0, epilogue = 0, busy = 0, gaps = 0;
  long n_gaps = 0;
  for (size_t i = 0; i < lives.size(); ++i) {
    const Life& l = lives[i];
    to_first_s += static_cast<double>(l.first_s - l.start);
    epilogue += static_cast<double>(l.end - l.epilogue);
    busy += static_cast<double>(l.end - l.start);
    if (i > 0 && lives[i - 1].sm == l.sm && l.start > lives[i - 1].end) {
      gaps += static_cast<double>(l.start - lives[i - 1].end);
      ++n_gaps;
    }
  }
  // per SM: span from its first start to its last end (lives are sorted by SM, then start)
  std::vector<double> spans;
  for (size_t i = 0; i < lives.size();) {
    size_t j = i;
    unsigned long long last_end = 0;
    for (; j < lives.size() && lives[j].sm == lives[i].sm; ++j)
      last_end = std::max(last_end, lives[j].end);
    spans.push_back(static_cast<double>(last_end - lives[i].start));
    i = j;
  }
  double span_sum = 0, span_max = 0;
  for (double v : spans) {
    span_sum += v;
    span_max = std::max(span_max, v);
  }
  const double n = std::max<size_t>(lives.size(), 1);
  if (!spans.empty())
    std::printf("SMs %s (%zu): span mean %.0f cycles, longest %.0f (mean / longest %.3f)\n", what,
                spans.size(), span_sum / spans.size(), span_max,
                span_max > 0 ? span_sum / spans.size() / span_max : 0.0);
  std::printf(
      "blocks %s (%zu): start to first S %.0f cycles, last epilogue to end %.0f, life %.0f; "
      "between blocks on an SM %.0f cycles (%ld gaps, %.1f %% of the lives' cycles)\n",
      what, lives.size(), to_first_s / n, epilogue / n, busy / n, n_gaps ? gaps / n_gaps : 0.0,
      n_gaps, busy > 0 ? 100.0 * gaps / busy : 0.0);
}

// the default dq form's and the dQ warpgroup form's (whose main warpgroups stamp no dQ phases)
void print_backward_trace(const Problem& p, Buffers& bf) {
  static const char* const names[hk_flash::kBwdTracePhases - 1] = {
      "rows (+ late refill)", "dP issue, wait S", "P",        "dV issue, wait dP", "dS",
      "dK, barrier",          "dQ issue",         "wait all", "release, next S",   "dQ stores",
      "fence, barrier",       "reduce issue"};
  const int blocks = p.b * p.hkv * ((p.t + 127) / 128);
  for (Bwd form : {Bwd::Sm90Tma, Bwd::Sm90DqWarpgroup}) {
    const char* what = form == Bwd::Sm90Tma ? "bwd" : "bwd wg";
    const std::vector<unsigned long long> h =
        print_trace(what, blocks, hk_flash::kBwdTracePhases, names, [&](unsigned long long* dev) {
          BwdScope scope(form);
          hk_flash::BackwardParams bp = backward_params(p, bf, false);
          bp.trace = dev;
          hk_flash::backward(bp, nullptr);
        });
    print_block_lives(what, h, blocks, hk_flash::kBwdTracePhases);
  }
}

// The forward's layouts (a block's stream index over its key tiles).
void print_forward_trace(const Problem& p, Buffers& bf) {
  static const char* const names[hk_flash::kFwdTracePhases - 1] = {
      "wait K",    "take turn", "S issue", "wait V",    "PV issue, pass", "wait S",
      "release K", "softmax",   "wait PV", "release V", "rescale, P"};
  const int m_blocks = (p.s + 127) / 128;
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  for (const char* layout : {"v1", "v2", "v3", "v4", "v5"}) {
    int blocks = (layout[1] == '3' ? (m_blocks + 1) / 2 : m_blocks) * p.hq * p.b;
    if (layout[1] == '4' || layout[1] == '5') blocks = std::min(blocks, sms);  // a block an SM
    const std::vector<unsigned long long> h =
        print_trace(layout, blocks, hk_flash::kFwdTracePhases, names, [&](unsigned long long* dev) {
          EnvScope scope("HK_FLASH_SM90_FWD", layout);
          hk_flash::Params fp = forward_params(p, bf);
          fp.trace = dev;
          hk_flash::forward(fp, nullptr);
        });
    print_block_lives(layout, h, blocks, hk_flash::kFwdTracePhases);
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  std::string out_path;
  int only_shape = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc)
      out_path = argv[++i];
    else if (a == "--quick")
      g_quick = true;
    else if (a == "--shape" && i + 1 < argc && parse_index(argv[i + 1], &only_shape))
      ++i;
    else {
      std::fprintf(stderr,
                   "usage: hk_bench_flash_kernels [--out FILE.json] [--quick] [--shape N]\n");
      return 1;
    }
  }
  try {
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "device");
    const std::vector<Shape> shapes = {
        {"B4xH16(kv8)xS2048 D128 (training step)", 4, 16, 8, 2048, 128},
        {"B8xH16(kv8)xS2048", 8, 16, 8, 2048, 128},
        {"B2xH16(kv16)xS8192", 2, 16, 16, 8192, 128},
        {"B1xH32(kv8)xS16384", 1, 32, 8, 16384, 128},
        {"B8xH16(kv8)xS2048 D64", 8, 16, 8, 2048, 64},
    };
    std::string json = "{\"gpu\": \"" + std::string(prop.name) + "\", \"shapes\": [";
    std::string table =
        "shape                                   | fwd   | fwd v1 | fwd v2 | fwd v3 | fwd v4 | fwd "
        "v5 | "
        "v2/v1 | "
        "v3/v1 | "
        "bwd sm80 | "
        "bwd sm90 tma | bwd sm90 atomic | bwd sm90 det | fwd+bwd (default) | fwd+bwd (v2) | "
        "sm90/sm80 bwd | dq tma* | dq warp* | dq wg*\n";
    if (only_shape >= static_cast<int>(shapes.size()))
      throw std::runtime_error("--shape " + std::to_string(only_shape) + ": there are " +
                               std::to_string(shapes.size()) + " shapes (0-based)");
    for (size_t si = 0; si < shapes.size(); ++si) {
      if (only_shape >= 0 && static_cast<int>(si) != only_shape) continue;
      const Shape& sh = shapes[si];
      Problem p{sh.b, sh.s, sh.s, sh.hq, sh.hkv, sh.d};
      Buffers bf(p);
      const size_t nq = static_cast<size_t>(p.b) * p.s * p.hq * p.d;
      const size_t nk = static_cast<size_t>(p.b) * p.t * p.hkv * p.d;
      bf.q.upload(random_values(nq, p.dt, 1).bits);
      bf.k.upload(random_values(nk, p.dt, 2).bits);
      bf.v.upload(random_values(nk, p.dt, 3).bits);
      bf.dout.upload(random_values(nq, p.dt, 4).bits);
      const hk_flash::Params fp = forward_params(p, bf);
      const double fwd_flops = 0.5 * 4.0 * p.b * p.hq * double(p.s) * p.t * p.d;
      auto tf = [](double flops, double ms) { return flops / (ms * 1e-3) / 1e12; };
      // the dispatcher's forward and forward+backward first and back to back, the order
      // bench/peers/attention_torch.py times each backend in: the GPU slows as a shape's run warms
      // (6-8 %), so a ratio against the peer needs both sides timed in the same position; the SM
      // clock right after each headline timing (at the power cap a figure follows the clock)
      const hk_flash::BackwardParams bp = backward_params(p, bf, false);
      const double t_fwd = time_ms([&] { hk_flash::forward(fp, nullptr); });
      const double mhz_fwd = sm_clock_mhz();
      const double t_fb = time_ms([&] {
        hk_flash::forward(fp, nullptr);
        hk_flash::backward(bp, nullptr);
      });
      const double mhz_fb = sm_clock_mhz();
      auto fwd_layout_time = [&](const char* layout) {
        EnvScope scope("HK_FLASH_SM90_FWD", layout);
        const std::string kernel = hk_flash::forward_kernel_name(fp);
        if (kernel.rfind("sm90 wgmma", 0) != 0)
          throw std::runtime_error(std::string("HK_FLASH_SM90_FWD=") + layout + " ran " + kernel);
        return time_ms([&] { hk_flash::forward(fp, nullptr); });
      };
      // the layouts timed in the order v1 v2 v3 v4 v5 v5 v4 v3 v2 v1 and each pair averaged: the
      // GPU runs slower as a run warms up (the dispatcher's kernel, timed first, measured 6-8%
      // above the same kernel timed third, and 665-678 against 605-628 TF/s at S16384), which a
      // one-pass order would credit to the earlier layout
      const char* const layouts[5] = {"v1", "v2", "v3", "v4", "v5"};
      double t_layout[5] = {};
      for (int i = 0; i < 5; ++i) t_layout[i] = fwd_layout_time(layouts[i]);
      for (int i = 4; i >= 0; --i) t_layout[i] = 0.5 * (t_layout[i] + fwd_layout_time(layouts[i]));
      const double t_v1 = t_layout[0], t_v2 = t_layout[1], t_v3 = t_layout[2], t_v4 = t_layout[3],
                   t_v5 = t_layout[4];
      auto bwd_time = [&](Bwd k, bool det) {
        BwdScope scope(k);
        const hk_flash::BackwardParams bp = backward_params(p, bf, det);
        return time_ms([&] { hk_flash::backward(bp, nullptr); });
      };
      const double t80 = bwd_time(Bwd::Sm80, false);
      const double t90 = bwd_time(Bwd::Sm90Tma, false);
      const double mhz_bwd = sm_clock_mhz();
      const double t90a = bwd_time(Bwd::Sm90Atomic, false);
      // how dq leaves the Hopper kernel (HK_FLASH_BWD_DQ tma / warp / wg), mirrored as the
      // layouts are: tma warp wg wg warp tma, each pair averaged
      const Bwd dq_forms[3] = {Bwd::Sm90Tma, Bwd::Sm90TmaWarp, Bwd::Sm90DqWarpgroup};
      double t_dq[3] = {};
      for (int i = 0; i < 3; ++i) t_dq[i] = bwd_time(dq_forms[i], false);
      for (int i = 2; i >= 0; --i) t_dq[i] = 0.5 * (t_dq[i] + bwd_time(dq_forms[i], false));
      const double t90d = bwd_time(Bwd::Sm90Tma, true);
      double t_fb2 = 0;
      {
        EnvScope scope("HK_FLASH_SM90_FWD", "v2");
        t_fb2 = time_ms([&] {
          hk_flash::forward(fp, nullptr);
          hk_flash::backward(bp, nullptr);
        });
      }
#ifdef HK_FLASH_TRACE
      print_forward_trace(p, bf);
      print_backward_trace(p, bf);
#endif
      char row[512];
      std::snprintf(
          row, sizeof row,
          "%-40s| %5.0f | %6.0f | %6.0f | %6.0f | %6.0f | %6.0f | %5.2f | %5.2f | %8.0f | %12.0f | "
          "%15.0f | %12.0f | %17.0f | %12.0f | %13.2f | %7.0f | %8.0f | %6.0f\n",
          sh.name, tf(fwd_flops, t_fwd), tf(fwd_flops, t_v1), tf(fwd_flops, t_v2),
          tf(fwd_flops, t_v3), tf(fwd_flops, t_v4), tf(fwd_flops, t_v5), t_v1 / t_v2, t_v1 / t_v3,
          tf(2.5 * fwd_flops, t80), tf(2.5 * fwd_flops, t90), tf(2.5 * fwd_flops, t90a),
          tf(2.5 * fwd_flops, t90d), tf(3.5 * fwd_flops, t_fb), tf(3.5 * fwd_flops, t_fb2),
          t80 / t90, tf(2.5 * fwd_flops, t_dq[0]), tf(2.5 * fwd_flops, t_dq[1]),
          tf(2.5 * fwd_flops, t_dq[2]));
      table += row;
      std::fprintf(stderr, "%s", row);
      std::fprintf(stderr,
                   "%s: SM clock after fwd %.0f MHz, after fwd+bwd %.0f, after bwd sm90 %.0f\n",
                   sh.name, mhz_fwd, mhz_fb, mhz_bwd);
      char js[4096];
      std::snprintf(
          js, sizeof js,
          "%s{\"shape\": \"%s\", \"B\": %d, \"Hq\": %d, \"Hkv\": %d, \"S\": %d, \"D\": %d, "
          "\"fwd_ms\": %.5f, \"fwd_sm90_v1_ms\": %.5f, \"fwd_sm90_v2_ms\": %.5f, "
          "\"fwd_sm90_v1_tflops\": %.2f, \"fwd_sm90_v2_tflops\": %.2f, \"fwd_sm90_v3_ms\": %.5f, "
          "\"fwd_sm90_v3_tflops\": %.2f, \"fwd_sm90_v4_ms\": %.5f, \"fwd_sm90_v4_tflops\": %.2f, "
          "\"fwd_sm90_v5_ms\": %.5f, \"fwd_sm90_v5_tflops\": %.2f, "
          "\"fwdbwd_v2_ms\": %.5f, "
          "\"fwdbwd_v2_tflops\": %.2f, \"bwd_sm80_ms\": %.5f, \"bwd_sm90_tma_ms\": %.5f, "
          "\"bwd_sm90_atomic_ms\": %.5f, \"bwd_sm90_deterministic_ms\": %.5f, "
          "\"fwdbwd_ms\": %.5f, \"fwd_tflops\": %.2f, \"bwd_sm80_tflops\": %.2f, "
          "\"bwd_sm90_tma_tflops\": %.2f, \"bwd_sm90_atomic_tflops\": %.2f, "
          "\"bwd_sm90_deterministic_tflops\": %.2f, \"fwdbwd_tflops\": %.2f, "
          "\"sm_clock_mhz_after_fwd\": %.0f, \"sm_clock_mhz_after_fwdbwd\": %.0f, "
          "\"sm_clock_mhz_after_bwd_sm90\": %.0f, \"bwd_sm90_dq_tma_mirrored_ms\": %.5f, "
          "\"bwd_sm90_dq_warp_mirrored_ms\": %.5f, \"bwd_sm90_dq_wg_mirrored_ms\": %.5f, "
          "\"bwd_sm90_dq_tma_mirrored_tflops\": %.2f, \"bwd_sm90_dq_warp_mirrored_tflops\": %.2f, "
          "\"bwd_sm90_dq_wg_mirrored_tflops\": %.2f}",
          json.back() == '[' ? "" : ", ", sh.name, sh.b, sh.hq, sh.hkv, sh.s, sh.d, t_fwd, t_v1,
          t_v2, tf(fwd_flops, t_v1), tf(fwd_flops, t_v2), t_v3, tf(fwd_flops, t_v3), t_v4,
          tf(fwd_flops, t_v4), t_v5, tf(fwd_flops, t_v5), t_fb2, tf(3.5 * fwd_flops, t_fb2), t80,
          t90, t90a, t90d, t_fb, tf(fwd_flops, t_fwd), tf(2.5 * fwd_flops, t80),
          tf(2.5 * fwd_flops, t90), tf(2.5 * fwd_flops, t90a), tf(2.5 * fwd_flops, t90d),
          tf(3.5 * fwd_flops, t_fb), mhz_fwd, mhz_fb, mhz_bwd, t_dq[0], t_dq[1], t_dq[2],
          tf(2.5 * fwd_flops, t_dq[0]), tf(2.5 * fwd_flops, t_dq[1]), tf(2.5 * fwd_flops, t_dq[2]));
      json += js;
    }
    json += "]}\n";
    std::printf("\nflash kernels, TFLOP/s (%s)\n%s", prop.name, table.c_str());
    if (!out_path.empty()) {
      FILE* f = std::fopen(out_path.c_str(), "w");
      if (!f) throw std::runtime_error("cannot write " + out_path);
      std::fputs(json.c_str(), f);
      std::fclose(f);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hk_bench_flash_kernels: %s\n", e.what());
    return 1;
  }
  return 0;
}
