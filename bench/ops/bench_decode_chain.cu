// hk_bench_decode_chain — what one launch of the decode step's products costs at small batch when
// launched back to back (the way the decode step runs them: a CUDA graph of PDL launches), per
// 16-bit gemv kernel (mma.sync, shared-memory staged) at the Qwen3-0.6B shapes, and past 16 rows
// beside the layers' own products (cuBLASLt through ops::linear, ops::act_mul), which the step
// runs from 17 rows on.
//
// Method: 28 layers of distinct random bf16 weights (870 MB, far beyond L2), captured as one
// CUDA graph per sequence and replayed (one eager pass first, 2 warm-up replays, then the median
// of --reps timed between events). Sequences: each product alone 28 times (qkv — with the
// RMSNorm prologue up to 16 rows —, o_proj, gate/up with SwiGLU, down), the four in layer order 28
// times (past 16 rows with the step's two add+RMSNorm kernels), each gemv 28 times over one
// layer's weights (L2-resident), lm_head 4 times, the q/k norm +
// rotary + cache kernel and the step's decode attention (81 keys of a 256-row cache, as at 16+128
// tokens: hk's own kernel unsplit, as the step runs it over a short cache, or --attention's) 28
// times each, the whole layer 28 times, and a chain of empty PDL kernels (wait, trigger, exit) as
// the floor a dependent launch costs here. Reports µs a launch and the weight bytes a launch
// streams over that time (GB/s). Not here: embedding, final norm and the greedy pick
// (hk_bench_generate times the whole step); it checks no numbers (hk_gpu_decode_test does).
//
// Usage: hk_bench_decode_chain [--out FILE.json] [--reps N] [--rows 1,8,64] [--trace]
//                              [--attention auto|hk|flash] [--attention-splits N]
// (--attention picks the layers' attention kernel instead of the step's choice; --attention-splits
// the key splits of hk's: 1 as the step runs it over this short cache, 0 = attention_splits().
// --trace first times the phases of the staged gemv's launches inside chains — each block's
// %globaltimer as it starts, has issued its copies, returns from the PDL wait, has x, has its
// weights, has its products, has stored — per product (over 28 layers, and over one layer's
// L2-resident weights) and over the layers' four products.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../cuda_check.h"
#include "../pdl_launch.h"
#include "flash_attn/flash.h"
#include "flash_attn/from_views.h"
#include "hk/device.h"
#include "hk/error.h"
#include "hk/ops.h"
#include "hk/stream.h"
#include "hk/tensor.h"
#include "ops/decode/decode_kernels.h"

namespace {

using hk::DType;
using hk::Tensor;
namespace decode = hk::decode;

__global__ void fill_kernel(__nv_bfloat16* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffffu) / 65536.0f - 0.5f) * scale);
  }
}

// The floor: a launch that waits on its predecessor, lets its successor launch and exits.
__global__ void empty_pdl_kernel() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

Tensor random_bf16(std::vector<int64_t> shape, uint32_t seed, float scale = 0.05f) {
  Tensor t = Tensor::empty(shape, DType::BF16, hk::Device::cuda(0));
  const size_t n = t.numel();
  fill_kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(t.view().ptr()), n, seed, scale);
  CK(cudaGetLastError());
  return t;
}

struct Layer {
  Tensor qkv, o, gate_up, down, norm1, norm2, q_norm, k_norm, k_cache, v_cache;
};

constexpr int64_t kHidden = 1024, kQkv = 4096, kQ = 2048, kInter = 3072, kVocab = 151936;
constexpr int64_t kHeadsQ = 16, kHeadsKv = 8, kHeadDim = 128;
constexpr int64_t kCacheCapacity = 256, kCacheLength = 80;  // the 16+128 decode's bucket, mid-way
constexpr int kLayers = 28;

struct Buffers {
  Tensor h0, h1, delta, normed, qkv, attn, act, gate_up, logits;
  Tensor positions, lengths, key_start;  // i32 [rows]: kCacheLength, kCacheLength, 0
  Tensor attn_workspace, attn_counters;  // hk's decode attention with key splits
};

decode::GemvParams base(decode::GemvKernel kernel, int64_t m, int64_t k, const Tensor* x) {
  decode::GemvParams p;
  p.kernel = kernel;
  p.dtype = DType::BF16;
  p.m = m;
  p.k = k;
  if (x) {
    p.x = x->view().ptr();
    p.x_stride = k;
  }
  return p;
}

// The step fuses the RMSNorm into the gemv at the batches it hands to the gemv (up to 16 rows);
// past that it runs the norm as its own kernel (add_norm) and the products read the normalised
// rows (b.normed).
bool fused_norm(int64_t m) {
  return m <= decode::kGemvPreferredMaxRows;
}

decode::GemvParams qkv_product(decode::GemvKernel kn, int64_t m, const Layer& l, Buffers& b) {
  decode::GemvParams p = base(kn, m, kHidden, fused_norm(m) ? nullptr : &b.normed);
  p.has_prologue = fused_norm(m);
  if (p.has_prologue)
    p.prologue = {b.h0.view().ptr(), kHidden, b.delta.view().ptr(), kHidden,
                  b.h1.view().ptr(), kHidden, l.norm1.view().ptr(), 1e-6f};
  p.segments[0] = {l.qkv.view().ptr(), nullptr, b.qkv.view().ptr(), kQkv, kQkv};
  p.num_segments = 1;
  return p;
}
decode::GemvParams o_product(decode::GemvKernel kn, int64_t m, const Layer& l, Buffers& b) {
  decode::GemvParams p = base(kn, m, kQ, &b.attn);
  p.segments[0] = {l.o.view().ptr(), nullptr, b.delta.view().ptr(), kHidden, kHidden};
  p.num_segments = 1;
  return p;
}
decode::GemvParams gate_up_product(decode::GemvKernel kn, int64_t m, const Layer& l, Buffers& b) {
  decode::GemvParams p = base(kn, m, kHidden, fused_norm(m) ? nullptr : &b.normed);
  p.has_prologue = fused_norm(m);
  if (p.has_prologue)
    p.prologue = {b.h1.view().ptr(), kHidden, b.delta.view().ptr(), kHidden,
                  b.h0.view().ptr(), kHidden, l.norm2.view().ptr(), 1e-6f};
  const char* w = static_cast<const char*>(l.gate_up.view().ptr());
  p.segments[0] = {w, nullptr, b.act.view().ptr(), kInter, kInter};
  p.segments[1] = {w + kInter * kHidden * 2, nullptr, b.act.view().ptr(), kInter, kInter};
  p.num_segments = 2;
  p.epilogue = decode::GemvEpilogue::SiluMul;
  return p;
}
decode::GemvParams down_product(decode::GemvKernel kn, int64_t m, const Layer& l, Buffers& b) {
  decode::GemvParams p = base(kn, m, kInter, &b.act);
  p.segments[0] = {l.down.view().ptr(), nullptr, b.delta.view().ptr(), kHidden, kHidden};
  p.num_segments = 1;
  return p;
}

// The unfused residual step past 16 rows: normed = rms_norm(h += delta), as the decode step's
// ops::add_rms_norm.
void add_norm(int64_t m, const Tensor& norm_w, Buffers& b, hk::Stream stream) {
  hk::ops::add_rms_norm(b.h0.slice(0, 0, m).view(), b.delta.slice(0, 0, m).view(), norm_w.view(),
                        1e-6f, b.normed.slice(0, 0, m).view(), stream);
}

// The layers' own products past 16 rows (what the step runs there): cuBLASLt through
// ops::linear over the adjacent q/k/v and gate/up weights, and ops::act_mul.
void cublaslt_qkv(int64_t m, const Layer& l, Buffers& b, hk::Stream stream) {
  hk::ops::linear(b.normed.slice(0, 0, m).view(), l.qkv.view(), nullptr,
                  b.qkv.slice(0, 0, m).view(), stream);
}
void cublaslt_o(int64_t m, const Layer& l, Buffers& b, hk::Stream stream) {
  hk::ops::linear(b.attn.slice(0, 0, m).view(), l.o.view(), nullptr, b.delta.slice(0, 0, m).view(),
                  stream);
}
void cublaslt_gate_up(int64_t m, const Layer& l, Buffers& b, hk::Stream stream) {
  const Tensor gu = b.gate_up.slice(0, 0, m);
  hk::ops::linear(b.normed.slice(0, 0, m).view(), l.gate_up.view(), nullptr, gu.view(), stream);
  hk::ops::act_mul(hk::ops::Activation::SiLU, gu.slice(1, 0, kInter).view(),
                   gu.slice(1, kInter, 2 * kInter).view(), b.act.slice(0, 0, m).view(), stream);
}
void cublaslt_down(int64_t m, const Layer& l, Buffers& b, hk::Stream stream) {
  hk::ops::linear(b.act.slice(0, 0, m).view(), l.down.view(), nullptr,
                  b.delta.slice(0, 0, m).view(), stream);
}

// q/k norm + rotary of the q/k/v row, k and v into the layer's cache at row kCacheLength.
void rope(int64_t m, const Layer& l, Buffers& b, hk::Stream stream) {
  decode::QkRopeCacheParams r;
  r.dtype = DType::BF16;
  r.batch = m;
  r.heads_q = kHeadsQ;
  r.heads_kv = kHeadsKv;
  r.head_dim = kHeadDim;
  r.qkv = b.qkv.view().ptr();
  r.qkv_stride = kQkv;
  r.q_norm_weight = l.q_norm.view().ptr();
  r.k_norm_weight = l.k_norm.view().ptr();
  r.positions = b.positions.data_as<int32_t>();
  r.rope_theta = 1e6f;
  r.cache_index = b.lengths.data_as<int32_t>();
  r.k_cache = l.k_cache.view().ptr();
  r.v_cache = l.v_cache.view().ptr();
  r.cache_batch_stride = kCacheCapacity * kHeadsKv * kHeadDim;
  r.cache_row_stride = kHeadsKv * kHeadDim;
  r.capacity = kCacheCapacity;
  decode::qk_rope_cache(r, stream);
}

// The flash split-KV decode over the layer's cache, as the decode step calls it (no workspace:
// the cluster form).
void flash_decode(int64_t m, const Layer& l, Buffers& b, hk::Stream stream) {
  const Tensor qkv = b.qkv.slice(0, 0, m).reshape({m, 1, kQkv});
  const Tensor q = qkv.slice(2, 0, kHeadsQ * kHeadDim).reshape({m, 1, kHeadsQ, kHeadDim});
  const Tensor out = b.attn.slice(0, 0, m).reshape({m, 1, kHeadsQ, kHeadDim});
  const Tensor ks = b.key_start.slice(0, 0, m);
  hk_flash::CallOptions o;
  o.scale = 1.0f / 11.3137085f;
  o.causal = true;
  o.key_start = &ks.view();
  hk_flash::Params fp =
      hk_flash::forward_params(q.view(), l.k_cache.slice(0, 0, m).view(),
                               l.v_cache.slice(0, 0, m).view(), out.view(), nullptr, o);
  fp.seqlens_k = b.lengths.data_as<int32_t>();
  fp.seqlens_k_add = 1;
  fp.cache_settled = true;  // as the decode step sets it
  hk_flash::forward(fp, static_cast<hk_flash::Stream>(stream.handle));
}

// hk's decode attention over the layer's cache (the step's kernel over short caches),
// with `splits` key splits (0: attention_splits(), the step's choice over long caches).
void hk_decode_attention(int64_t m, const Layer& l, Buffers& b, int splits, hk::Stream stream) {
  decode::DecodeAttentionParams ap;
  ap.dtype = DType::BF16;
  ap.batch = m;
  ap.heads_q = kHeadsQ;
  ap.heads_kv = kHeadsKv;
  ap.head_dim = kHeadDim;
  ap.q = b.qkv.view().ptr();
  ap.q_batch_stride = kQkv;
  ap.k_cache = l.k_cache.view().ptr();
  ap.v_cache = l.v_cache.view().ptr();
  ap.cache_batch_stride = kCacheCapacity * kHeadsKv * kHeadDim;
  ap.cache_row_stride = kHeadsKv * kHeadDim;
  ap.lengths = b.lengths.data_as<int32_t>();
  ap.length_add = 1;
  ap.key_start = b.key_start.data_as<int32_t>();
  ap.out = b.attn.view().ptr();
  ap.out_batch_stride = kQ;
  ap.scale = 1.0f / 11.3137085f;
  ap.splits = splits > 0 ? splits : decode::attention_splits(m, kHeadsKv, kCacheCapacity);
  if (ap.splits > 1) {
    ap.workspace = b.attn_workspace.data_as<float>();
    ap.counters = b.attn_counters.data_as<int32_t>();
  }
  decode::attention(ap, stream);
}

// Replays queued back to back (no sync between them): the GPU's µs per replay and the host's µs
// per cudaGraphLaunch call. When the two are equal the replays are bound by the launch calls.
struct BackToBack {
  double gpu_us = 0.0, host_us = 0.0;
};

// Median µs of one replay of the graph `record` captures; with `queued`, also `reps` replays
// back to back.
template <class F>
double time_graph(cudaStream_t s, int reps, F record, BackToBack* queued = nullptr) {
  record();  // once eagerly: what the launches allocate (cuBLASLt's workspace) comes from the cache
  CK(cudaStreamSynchronize(s));
  cudaGraph_t graph;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  record();
  CK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) CK(cudaGraphLaunch(exec, s));
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a, s));
    CK(cudaGraphLaunch(exec, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  if (queued) {
    CK(cudaEventRecord(a, s));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) CK(cudaGraphLaunch(exec, s));
    const auto t1 = std::chrono::steady_clock::now();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    queued->gpu_us = t * 1000.0 / reps;
    queued->host_us = std::chrono::duration<double, std::micro>(t1 - t0).count() / reps;
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ms[ms.size() / 2] * 1000.0;
}

// `item` as an integer in [lo, hi]; -1 when it is not one.
long parse_in_range(const std::string& item, long lo, long hi) {
  char* end = nullptr;
  const long v = std::strtol(item.c_str(), &end, 10);
  return item.empty() || *end != '\0' || v < lo || v > hi ? -1 : v;
}

std::vector<int64_t> parse_rows(const std::string& s) {
  std::vector<int64_t> r;
  size_t at = 0;
  while (at < s.size()) {
    const size_t comma = s.find(',', at);
    const long v = parse_in_range(
        s.substr(at, comma == std::string::npos ? std::string::npos : comma - at), 1, 64);
    if (v < 0)
      throw hk::InvalidArgument("--rows takes a comma-separated list of 1..64, not '" + s + "'");
    r.push_back(v);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string out = "decode-chain.json";
  int reps = 20;
  std::vector<int64_t> rows = {1, 8, 64};
  std::string attention_kind = "auto";  // auto: the step's choice (hk's over this short cache)
  int attention_splits = 1;             // as the step over a short cache
  bool trace = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw hk::InvalidArgument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--out")
      out = value();
    else if (a == "--reps")
      reps = std::max(3, std::atoi(value().c_str()));
    else if (a == "--rows")
      rows = parse_rows(value());
    else if (a == "--attention") {
      attention_kind = value();
      if (attention_kind != "auto" && attention_kind != "hk" && attention_kind != "flash")
        throw hk::InvalidArgument("--attention takes auto, hk or flash, not '" + attention_kind +
                                  "'");
    } else if (a == "--attention-splits") {
      const std::string v = value();
      const long n = parse_in_range(v, 0, 64);
      if (n < 0)
        throw hk::InvalidArgument("--attention-splits takes 0..64 (0: attention_splits()), not '" +
                                  v + "'");
      attention_splits = static_cast<int>(n);
    } else if (a == "--trace")
      trace = true;
    else
      throw hk::InvalidArgument(
          "usage: hk_bench_decode_chain [--out FILE.json] [--reps N] [--rows 1,8,64] "
          "[--attention auto|hk|flash] [--attention-splits N] [--trace] (unknown argument '" +
          a + "')");
  }
  cudaStream_t cs;
  CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  const hk::Stream stream{cs};
  std::vector<Layer> layers(kLayers);
  uint32_t seed = 1;
  for (Layer& l : layers) {
    l.qkv = random_bf16({kQkv, kHidden}, seed++);
    l.o = random_bf16({kHidden, kQ}, seed++);
    l.gate_up = random_bf16({2 * kInter, kHidden}, seed++);
    l.down = random_bf16({kHidden, kInter}, seed++);
    l.norm1 = random_bf16({kHidden}, seed++, 1.0f);
    l.norm2 = random_bf16({kHidden}, seed++, 1.0f);
    l.q_norm = random_bf16({kHeadDim}, seed++, 1.0f);
    l.k_norm = random_bf16({kHeadDim}, seed++, 1.0f);
  }
  Tensor lm_head = random_bf16({kVocab, kHidden}, seed++);
  Buffers b;
  const int64_t mmax = *std::max_element(rows.begin(), rows.end());
  b.h0 = random_bf16({mmax, kHidden}, seed++, 1.0f);
  b.h1 = random_bf16({mmax, kHidden}, seed++, 1.0f);
  b.delta = random_bf16({mmax, kHidden}, seed++, 1.0f);
  b.qkv = random_bf16({mmax, kQkv}, seed++);
  b.attn = random_bf16({mmax, kQ}, seed++, 1.0f);
  b.act = random_bf16({mmax, kInter}, seed++, 1.0f);
  b.normed = random_bf16({mmax, kHidden}, seed++, 1.0f);
  b.gate_up = random_bf16({mmax, 2 * kInter}, seed++, 1.0f);
  b.attn_workspace = Tensor::empty(
      {static_cast<int64_t>(decode::attention_workspace_floats(mmax, kHeadsQ, kHeadDim, 64))},
      DType::F32, hk::Device::cuda(0));
  b.attn_counters = Tensor::zeros({mmax * kHeadsKv}, DType::I32, hk::Device::cuda(0));
  b.logits = random_bf16({mmax, kVocab}, seed++);
  for (Layer& l : layers) {
    l.k_cache = random_bf16({mmax, kCacheCapacity, kHeadsKv, kHeadDim}, seed++, 1.0f);
    l.v_cache = random_bf16({mmax, kCacheCapacity, kHeadsKv, kHeadDim}, seed++, 1.0f);
  }
  {
    const hk::Device gpu = hk::Device::cuda(0);
    std::vector<int32_t> len(static_cast<size_t>(mmax), int32_t(kCacheLength));
    std::vector<int32_t> zero(static_cast<size_t>(mmax), 0);
    b.positions = Tensor::empty({mmax}, DType::I32, gpu);
    b.lengths = Tensor::empty({mmax}, DType::I32, gpu);
    b.key_start = Tensor::empty({mmax}, DType::I32, gpu);
    CK(cudaMemcpy(b.positions.view().ptr(), len.data(), len.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.lengths.view().ptr(), len.data(), len.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.key_start.view().ptr(), zero.data(), zero.size() * 4, cudaMemcpyHostToDevice));
  }
  CK(cudaDeviceSynchronize());

  nlohmann::json results = nlohmann::json::array();
  auto report = [&](const std::string& kernel, int64_t m, const std::string& seq, int launches,
                    double bytes, double us) {
    const double per = us / launches;
    const double gbs = bytes > 0 ? bytes / (us * 1e-6) / 1e9 : 0.0;
    std::printf("%-5s m=%-2lld %-22s %4d launches %9.1f us  %6.2f us/launch  %7.0f GB/s\n",
                kernel.c_str(), static_cast<long long>(m), seq.c_str(), launches, us, per, gbs);
    results.push_back({{"kernel", kernel},
                       {"rows", m},
                       {"sequence", seq},
                       {"launches", launches},
                       {"us", us},
                       {"us_per_launch", per},
                       {"weight_gb_per_s", gbs}});
  };

  // the floor: empty PDL kernels, 132 blocks of 256 threads
  {
    const int n = 168;
    const double us = time_graph(cs, reps, [&] {
      for (int i = 0; i < n; ++i) {
        launch_pdl(empty_pdl_kernel, dim3(132), dim3(256), 0, cs);
      }
    });
    report("none", 0, "empty PDL kernel", n, 0, us);
  }

  const double qkv_bytes = kQkv * kHidden * 2.0, o_bytes = kHidden * kQ * 2.0,
               gu_bytes = 2.0 * kInter * kHidden * 2.0, down_bytes = kHidden * kInter * 2.0;
  const double layer_bytes = qkv_bytes + o_bytes + gu_bytes + down_bytes;
  using Make = decode::GemvParams (*)(decode::GemvKernel, int64_t, const Layer&, Buffers&);
  using Run = void (*)(int64_t, const Layer&, Buffers&, hk::Stream);
  struct Product {
    const char* name;
    Make make;     // the decode gemv's parameters
    Run cublaslt;  // the layers' own product (past 16 rows)
    double bytes;
  };
  const Product products[] = {{"qkv", qkv_product, cublaslt_qkv, qkv_bytes},
                              {"o_proj", o_product, cublaslt_o, o_bytes},
                              {"gate_up + swiglu", gate_up_product, cublaslt_gate_up, gu_bytes},
                              {"down", down_product, cublaslt_down, down_bytes}};
  if (trace) {
    // Where a staged gemv launch's time goes inside a chain (--trace): every block's %globaltimer
    // at the kernel's phases, from the last of a few graph replays, over launches 1..n-2
    constexpr int kMaxBlocks = 1024, P = decode::kGemvTracePoints, M = decode::kGemvTraceMainPoints;
    for (int64_t m : rows) {
      auto traced = [&](const std::string& what, const std::vector<std::pair<int, size_t>>& seq) {
        const size_t n = seq.size();
        Tensor buf = Tensor::zeros({static_cast<int64_t>(n * kMaxBlocks * P)}, DType::I64,
                                   hk::Device::cuda(0));
        uint64_t* t = static_cast<uint64_t*>(buf.view().ptr());
        time_graph(cs, 3, [&] {
          for (size_t i = 0; i < n; ++i) {
            decode::GemvParams g =
                products[seq[i].first].make(decode::GemvKernel::Bulk, m, layers[seq[i].second], b);
            g.trace = t + i * kMaxBlocks * P;
            decode::gemv(g, stream);
          }
        });
        CK(cudaDeviceSynchronize());
        std::vector<uint64_t> h(n * kMaxBlocks * P);
        CK(cudaMemcpy(h.data(), t, h.size() * 8, cudaMemcpyDeviceToHost));
        // per launch: first/last start, wait return, end; mean phase lengths over blocks
        // phases: the M - 1 between the main points, then the RMSNorm prologue's four (wait
        // return to the row sums, to the scale, to the row stored, to x in shared memory)
        constexpr int kPro = 4;
        struct Launch {
          double start_min = 1e300, wait_min = 1e300, wait_max = 0, end_max = 0, blocks = 0;
          double phase[M - 1 + kPro] = {};
        };
        std::vector<Launch> L(n);
        for (size_t i = 0; i < n; ++i)
          for (int blk = 0; blk < kMaxBlocks; ++blk) {
            const uint64_t* q = &h[(i * kMaxBlocks + blk) * P];
            if (q[0] == 0) continue;
            Launch& l = L[i];
            l.blocks += 1;
            l.start_min = std::min(l.start_min, double(q[0]));
            l.wait_min = std::min(l.wait_min, double(q[2]));
            l.wait_max = std::max(l.wait_max, double(q[2]));
            l.end_max = std::max(l.end_max, double(q[6]));
            for (int p = 0; p + 1 < M; ++p) l.phase[p] += double(q[p + 1]) - double(q[p]);
            if (q[7] != 0) {
              const uint64_t pro[kPro + 1] = {q[2], q[7], q[8], q[9], q[3]};
              for (int p = 0; p < kPro; ++p)
                l.phase[M - 1 + p] += double(pro[p + 1]) - double(pro[p]);
            }
          }
        double period = 0, gap = 0, lead = 0, spread = 0, body = 0, phase[M - 1 + kPro] = {};
        int count = 0;
        for (size_t i = 1; i + 1 < n; ++i) {
          const Launch& l = L[i];
          if (l.blocks == 0) continue;
          ++count;
          period += L[i + 1].wait_min - l.wait_min;
          gap += L[i + 1].wait_min - l.end_max;
          lead += l.wait_min - l.start_min;
          spread += l.wait_max - l.wait_min;
          body += l.end_max - l.wait_min;
          for (int p = 0; p < M - 1 + kPro; ++p) phase[p] += l.phase[p] / l.blocks;
        }
        if (count == 0) return;
        auto us = [&](double ns) { return ns / count / 1000.0; };
        std::printf(
            "trace bulk m=%-2lld %-30s %3.0f blocks: period %.2f us (wait-to-wait); last store to "
            "next wait %.2f; first start before wait %.2f; wait spread %.2f; wait to last store "
            "%.2f | per block: issue copies %.2f, to wait return %.2f, x %.2f, weights %.2f, "
            "products %.2f, sum + store %.2f\n",
            static_cast<long long>(m), what.c_str(), L[1].blocks, us(period), us(gap), us(lead),
            us(spread), us(body), us(phase[0]), us(phase[1]), us(phase[2]), us(phase[3]),
            us(phase[4]), us(phase[5]));
        if (phase[M - 1] > 0)  // the RMSNorm prologue's steps inside the x phase
          std::printf(
              "                 %-30s prologue: wait return to row sums %.2f us, to scale %.2f, to "
              "row stored %.2f, to x in shared memory %.2f\n",
              what.c_str(), us(phase[M - 1]), us(phase[M]), us(phase[M + 1]), us(phase[M + 2]));
        results.push_back(
            {{"kernel", "bulk"},
             {"rows", m},
             {"trace", what},
             {"period_us", us(period)},
             {"store_to_next_wait_us", us(gap)},
             {"start_before_wait_us", us(lead)},
             {"wait_spread_us", us(spread)},
             {"wait_to_last_store_us", us(body)},
             {"phase_us",
              {us(phase[0]), us(phase[1]), us(phase[2]), us(phase[3]), us(phase[4]), us(phase[5])}},
             {"prologue_phase_us",
              {us(phase[M - 1]), us(phase[M]), us(phase[M + 1]), us(phase[M + 2])}}});
      };
      if (!decode::gemv_kernel_unsupported(o_product(decode::GemvKernel::Bulk, m, layers[0], b))
               .empty())
        continue;
      for (int j = 0; j < 4; ++j) {
        std::vector<std::pair<int, size_t>> hbm, l2;
        for (size_t li = 0; li < layers.size(); ++li) {
          hbm.push_back({j, li});
          l2.push_back({j, 0});
        }
        traced(products[j].name, hbm);
        traced(std::string(products[j].name) + " (L2-resident)", l2);
      }
      std::vector<std::pair<int, size_t>> seq;
      for (size_t li = 0; li < layers.size(); ++li)
        for (int j = 0; j < 4; ++j) seq.push_back({j, li});
      traced("layers (products)", seq);
    }
  }
  for (int64_t m : rows) {
    const bool norm_kernels = !fused_norm(m);
    const std::string norm = norm_kernels ? " + 2 norms" : " (norms fused)";
    // the step's attention over this short cache: hk's decode kernel (decode_step.cc's choice)
    const bool hk_attention = attention_kind != "flash";
    for (const std::string name : {"mma", "bulk", "cublaslt"}) {
      const bool lt = name == "cublaslt";
      if (lt && !norm_kernels) continue;  // the step hands these rows to the gemv
      const decode::GemvKernel kn =
          name == "mma" ? decode::GemvKernel::Mma : decode::GemvKernel::Bulk;
      if (!lt && !decode::gemv_kernel_unsupported(qkv_product(kn, m, layers[0], b)).empty())
        continue;
      auto product = [&](const Product& pr, const Layer& l) {
        if (lt)
          pr.cublaslt(m, l, b, stream);
        else
          decode::gemv(pr.make(kn, m, l, b), stream);
      };
      for (const Product& pr : products) {
        const double us = time_graph(cs, reps, [&] {
          for (const Layer& l : layers) product(pr, l);
        });
        report(name, m, pr.name, kLayers, pr.bytes * kLayers, us);
      }
      // the same launches over one layer's weights, which stay in L2: what a launch costs when
      // its weights need not come from HBM (the most an L2 prefetch could give)
      for (const Product& pr : products) {
        if (lt) break;  // (cuBLASLt: the step's own products, not timed this way)
        const double us = time_graph(cs, reps, [&] {
          for (int i = 0; i < kLayers; ++i) product(pr, layers[0]);
        });
        report(name, m, std::string(pr.name) + " (L2-resident)", kLayers, pr.bytes * kLayers, us);
      }
      auto attention = [&](const Layer& l) {
        if (hk_attention)
          hk_decode_attention(m, l, b, attention_splits, stream);
        else
          flash_decode(m, l, b, stream);
      };
      // one layer in the step's order; with_attention adds rotary + cache write and attention
      auto layer = [&](const Layer& l, bool with_attention) {
        if (norm_kernels) add_norm(m, l.norm1, b, stream);
        product(products[0], l);
        if (with_attention) {
          rope(m, l, b, stream);
          attention(l);
        }
        product(products[1], l);
        if (norm_kernels) add_norm(m, l.norm2, b, stream);
        product(products[2], l);
        product(products[3], l);
      };
      const int per_layer = 4 + (norm_kernels ? 2 : 0) + (lt ? 1 : 0);  // + act_mul
      const double us = time_graph(cs, reps, [&] {
        for (const Layer& l : layers) layer(l, false);
      });
      report(name, m, "layers (products" + norm + ")", per_layer * kLayers, layer_bytes * kLayers,
             us);
      if (!lt) {
        // lm_head: the named kernel where it serves (the staged one does not: its weights do
        // not fit on chip in one pass), else what Auto picks
        decode::GemvParams head = base(kn, m, kHidden, &b.h0);
        head.segments[0] = {lm_head.view().ptr(), nullptr, b.logits.view().ptr(), kVocab, kVocab};
        head.num_segments = 1;
        const bool named = decode::gemv_kernel_unsupported(head).empty();
        if (!named) head.kernel = decode::GemvKernel::Auto;
        const double lm_us = time_graph(cs, reps, [&] {
          for (int i = 0; i < 4; ++i) decode::gemv(head, stream);
        });
        report(name, m, named ? "lm_head" : "lm_head (auto)", 4, 4.0 * kVocab * kHidden * 2.0,
               lm_us);
      }
      // the step's other two kernels a layer, alone and in the whole layer sequence
      const double kv_bytes = 2.0 * m * (kCacheLength + 1) * kHeadsKv * kHeadDim * 2.0;
      const std::string attn_name =
          std::string(hk_attention ? "hk decode attention" : "flash decode") + " (81 keys)";
      if (name == "mma") {  // the same kernels whatever the gemv: timed once
        const double rope_us = time_graph(cs, reps, [&] {
          for (const Layer& l : layers) rope(m, l, b, stream);
        });
        report("-", m, "q/k norm + rope + cache", kLayers, 0, rope_us);
        const double attn_us = time_graph(cs, reps, [&] {
          for (const Layer& l : layers) attention(l);
        });
        report("-", m, attn_name, kLayers, kv_bytes * kLayers, attn_us);
      }
      BackToBack queued;
      const double step_us = time_graph(
          cs, reps,
          [&] {
            for (const Layer& l : layers) layer(l, true);
          },
          &queued);
      report(name, m, "layers (all kernels)", (per_layer + 2) * kLayers,
             (layer_bytes + kv_bytes) * kLayers, step_us);
      std::printf(
          "%-5s m=%-2d layers (all kernels) back to back: %.1f us a replay, host %.1f us "
          "a cudaGraphLaunch\n",
          name.c_str(), m, queued.gpu_us, queued.host_us);
    }
  }
  CK(cudaDeviceSynchronize());
  std::ofstream f(out);
  f << nlohmann::json{{"bench", "hk_bench_decode_chain"}, {"results", results}}.dump(1) << "\n";
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "hk_bench_decode_chain: %s\n", e.what());
  return 1;
}
