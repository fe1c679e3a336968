// hk_bench_persistent_step — the weight stream and the grid-wide synchronisation of a persistent
// batch-1 decode step at the Qwen3-0.6B shape, measured before the real step is built (issue 14).
//
// Why: batch-1 decode is bound by its chain of launches (~19.5 µs a layer in six launches against
// ~7 µs of weight streaming). The way out named in docs/performance.md (issue 14) is one persistent
// kernel a step whose weight stream runs ahead of the activation chain — each block streams its
// slice of the coming phases' weights into a ring in shared memory while it waits for the vector
// of the phase before — with grid-wide readiness counters instead of launches. Its budget
// (twenty-seventh session) put a step between ~277 and ~447 µs against ≤ 406 µs for 70 % of the
// bandwidth limit, depending on whether the stream keeps running through the ~140 sync points.
// This program measures exactly that.
//
// What a step runs (one cooperative launch, one block an SM, 8 consumer warps + 1 producer warp):
// 28 layers of five phases, then lm_head —
//   qkv     x = rms_norm(h)·w_in (each block, redundantly), qkv = W_qkv·x          [4096 × 1024]
//   attend  blocks 0–15 each attend one q head over a cache of T positions whose last is the
//           step's own k, v (plain f32 online softmax, no weights), a = [2048]
//   o       h' = h + W_o·a                                                          [1024 × 2048]
//   gate/up x = rms_norm(h')·w_post, s = silu(W_gate·x)·(W_up·x)                  [2 × 3072 × 1024]
//   down    h_next = h' + W_down·s                                                  [1024 × 3072]
//   lm_head logits = W_lm·(rms_norm(h)·w_final)                                   [151936 × 1024]
// with the built-in ops' rounding points (each product rounded to bf16, then the residual add;
// silu rounded before the product with up). Every phase writes its own bf16 vector; a block that
// has written its rows adds 1 to the phase's counter (release), and each phase starts in every
// block when the previous phase's counter reaches the grid size (acquire). The producer thread
// copies the block's row slices of every phase's weights, in phase order, by 1-D bulk copies into
// a ring of 16 KB slots; consumers take the slots in the same order. Modes:
//   persistent    the design: the producer runs as far ahead as the ring allows
//   no-lookahead  the producer starts a phase's copies only when the phase's input is ready (what
//                 the chain of launches gets: weights fetched after the wait)
//   stream        nobody waits on counters: the weights-and-math floor (numbers not checked)
//   chain         no weights and no products: the counters, input reads, norms, attention and
//                 epilogues alone — the synchronisation chain's floor (numbers not checked)
//
// Not an hk kernel: no q/k norm, rotary, cache write, split attention, sampling or batch > 1. A
// step's time: `--steps` cooperative launches queued back to back between two events, median of
// five windows. It checks itself (persistent and no-lookahead): one more step after every output
// buffer is poisoned with bf16 NaN, then each phase's output against a host computation from the
// device's own input to that phase (f32 sums in another order). After the timed steps one more
// step per mode is traced (untimed): for blocks 0 and grid/2, each weight chunk's copy issue, the
// consumers' wait return and warp 0's end of products, by %globaltimer — the first runs showed a
// step bound by something per chunk (~1.3 µs a 16 KB chunk whatever the ring depth, the card's
// bandwidth or the products' form); the trace (thirtieth session) put it in the consumers: 0.5 µs
// of products and ~0.9 µs of phase work a chunk, with the copies alone at 86-102 % of the copy
// bandwidth. hk_bench_split_step goes on from here.
//
// Usage: hk_bench_persistent_step [--out FILE.json] [--steps N] [--cache T] [--slots S]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "decode_step_probe.cuh"
#include "hk/kernel_sdk_sm90.cuh"

namespace {

using namespace decode_probe;

constexpr int kConsumerWarps = 8, kThreads = (kConsumerWarps + 1) * 32;
constexpr int kSlotBytes = 16384, kMaxSlots = 12;
constexpr int kMaxK = 3072, kMaxPartials = 2048;
constexpr int kMaxItemPieces = 128;  // 16-byte pieces of one warp's part of a row

enum Kind : int { kGemv = 0, kAttend = 1 };
enum Epilogue : int { kStore = 0, kResidual = 1, kSwiGlu = 2 };
enum Mode : int { kPersistent = 0, kNoLookahead = 1, kStream = 2, kChain = 3 };
constexpr int kModes = 4;

struct Phase {
  int kind, epilogue, k, n, segments, split;  // split: warps a row (each a contiguous k part)
  int rows_per_chunk;                         // whole rows a 16 KB slot holds (a power of 2)
  const bf16* w[2];
  const bf16* in;      // the previous phase's output (the chain is linear)
  const bf16* norm_w;  // null: no norm
  const bf16* resid;
  bf16* out;
  const bf16* k_cache;  // attend: [kKvHeads][T][kHeadDim], position T-1 from `in`
  const bf16* v_cache;
};

// shared memory: ring | x (bf16) | partial sums | attention scratch | reductions | barriers
constexpr int kOffX = kMaxSlots * kSlotBytes;
constexpr int kOffPartial = kOffX + kMaxK * 2;
constexpr int kOffAttend = kOffPartial + kMaxPartials * 4;
constexpr int kOffReduce = kOffAttend + kConsumerWarps * (kHeadDim + 2) * 4;
constexpr int kOffBars = kOffReduce + 64;
constexpr int kSmem = kOffBars + 2 * kMaxSlots * 8;

// The trace of one step (every mode, after its timed steps): for blocks 0 and grid/2, each weight
// chunk's %globaltimer when the producer issued its copy, when the consumers' wait on it returned
// and when warp 0 had finished its products — where a chunk's time goes, which the step times alone
// cannot say.
constexpr int kTraceBlocks = 2, kTraceChunks = 1024, kTracePoints = 3;
__device__ __forceinline__ void trace_point(unsigned long long* trace, int traced, int chunk,
                                            int point) {
  if (trace != nullptr && traced >= 0 && chunk < kTraceChunks)
    trace[(size_t(traced) * kTraceChunks + chunk) * kTracePoints + point] = global_time();
}

__global__ void __launch_bounds__(kThreads, 1)
    step_kernel(const Phase* phases, int n_phases, unsigned* counters, unsigned epoch, int mode,
                int slots, int cache_t, unsigned long long* trace) {
  using namespace hk::sdk::cuda::sm90;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  bf16* x = reinterpret_cast<bf16*>(smem + kOffX);  // the phase's input row, bf16 as written
  float* partial = reinterpret_cast<float*>(smem + kOffPartial);
  float* attend = reinterpret_cast<float*>(smem + kOffAttend);
  float* reduce = reinterpret_cast<float*>(smem + kOffReduce);
  auto full = [&](int s) { return base + kOffBars + 8 * s; };
  auto empty = [&](int s) { return base + kOffBars + 8 * (kMaxSlots + s); };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int grid = gridDim.x, block = blockIdx.x;
  const unsigned target = unsigned(grid) * (epoch + 1);
  const int traced = block == 0 ? 0 : block == grid / 2 ? 1 : -1;
  if (threadIdx.x == 0) {
    for (int s = 0; s < slots; ++s) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), kConsumerWarps);
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (warp == kConsumerWarps) {  // the producer: every phase's row slices, in order
    if (lane != 0 || mode == kChain) return;
    int slot = 0, chunk = 0;
    uint32_t use = 0;  // how many times the ring has wrapped
    for (int p = 0; p < n_phases; ++p) {
      const Phase ph = phases[p];
      if (ph.kind != kGemv) continue;
      if (mode == kNoLookahead && p > 0) wait_count(counters + p - 1, target);
      const int64_t r0 = row_begin(ph.n, block, grid), r1 = row_begin(ph.n, block + 1, grid);
      for (int seg = 0; seg < ph.segments; ++seg)
        for (int64_t r = r0; r < r1; r += ph.rows_per_chunk) {
          const int rows = int(min(int64_t(ph.rows_per_chunk), r1 - r));
          const uint32_t bytes = uint32_t(rows) * ph.k * 2;
          if (use > 0) mbar_wait(empty(slot), (use - 1) & 1);
          mbar_expect_tx(full(slot), bytes);
          bulk_load(base + slot * kSlotBytes, ph.w[seg] + r * ph.k, bytes, full(slot));
          trace_point(trace, traced, chunk++, 0);
          if (++slot == slots) slot = 0, ++use;
        }
    }
    return;
  }

  // the consumers (256 threads, named barrier 1)
  const int tid = threadIdx.x;
  auto sync = [] { named_sync(1, kConsumerWarps * 32); };
  int slot = 0, chunk = 0;
  uint32_t use = 0;
  for (int p = 0; p < n_phases; ++p) {
    const Phase ph = phases[p];
    if (mode != kStream && p > 0) {
      if (tid == 0) wait_count(counters + p - 1, target);
      sync();
    }
    if (ph.kind == kAttend) {
      if (block < kQHeads) {
        const float o = attend_head<kConsumerWarps>(ph.in, ph.k_cache, ph.v_cache, block, cache_t,
                                                    attend, sync);
        if (tid < kHeadDim) ph.out[block * kHeadDim + tid] = __float2bfloat16_rn(o);
      }
    } else {
      // the input row, read once (16 bytes a thread, k ≤ 4096), into shared memory through the
      // norm where the phase has one
      const int pieces = ph.k / 8;
      uint4 in[2];
      float ss = 0;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = tid + j * kConsumerWarps * 32;
        if (c < pieces) {
          in[j] = load_cg16(ph.in + c * 8);
          const __nv_bfloat162* e = reinterpret_cast<const __nv_bfloat162*>(&in[j]);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 f = __bfloat1622float2(e[i]);
            ss += f.x * f.x + f.y * f.y;
          }
        }
      }
      float r = 1.f;
      if (ph.norm_w != nullptr) {
        for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) reduce[warp] = ss;
        sync();
        float total = 0;
        for (int w = 0; w < kConsumerWarps; ++w) total += reduce[w];
        r = rsqrtf(total / float(ph.k) + kEps);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = tid + j * kConsumerWarps * 32;
        if (c >= pieces) continue;
        if (ph.norm_w != nullptr) {
          const uint4 nw = __ldg(reinterpret_cast<const uint4*>(ph.norm_w + c * 8));
          const bf16* e = reinterpret_cast<const bf16*>(&in[j]);
          const bf16* g = reinterpret_cast<const bf16*>(&nw);
          uint4 normed;
          bf16* o = reinterpret_cast<bf16*>(&normed);
#pragma unroll
          for (int i = 0; i < 8; ++i)
            o[i] = __float2bfloat16_rn(bf(__bfloat162float(e[i]) * r) * __bfloat162float(g[i]));
          in[j] = normed;
        }
        *reinterpret_cast<uint4*>(x + c * 8) = in[j];
      }
      sync();
      const int64_t r0 = row_begin(ph.n, block, grid), r1 = row_begin(ph.n, block + 1, grid);
      const int rows_blk = int(r1 - r0), part_k = ph.k / ph.split;
      for (int seg = 0; seg < ph.segments && mode != kChain; ++seg)
        for (int64_t r = r0; r < r1; r += ph.rows_per_chunk) {
          const int rows = int(min(int64_t(ph.rows_per_chunk), r1 - r));
          mbar_wait(full(slot), use & 1);
          if (tid == 0) trace_point(trace, traced, chunk, 1);
          const unsigned char* w = smem + slot * kSlotBytes;
          for (int item = warp; item < rows * ph.split; item += kConsumerWarps) {
            const int row = item / ph.split, part = item % ph.split;
            const int k0 = part * part_k;
            // every 16-byte piece of the item loaded before the sums, four independent sums (one
            // dependent chain a warp before 4e7082a; the step time did not change, so the products
            // are not what bounds it)
            float sums[4] = {0, 0, 0, 0};
            const int pieces_k = part_k / 8;  // ≤ kMaxItemPieces (checked on the host)
#pragma unroll
            for (int u = 0; u < kMaxItemPieces / 32; ++u) {
              const int v = lane + u * 32;
              if (v < pieces_k) {
                const uint4 q =
                    *reinterpret_cast<const uint4*>(w + (size_t(row) * ph.k + k0 + v * 8) * 2);
                const uint4 xq = *reinterpret_cast<const uint4*>(x + k0 + v * 8);
                const __nv_bfloat162* e = reinterpret_cast<const __nv_bfloat162*>(&q);
                const __nv_bfloat162* xe = reinterpret_cast<const __nv_bfloat162*>(&xq);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                  const float2 a = __bfloat1622float2(e[i]), b = __bfloat1622float2(xe[i]);
                  sums[i] = fmaf(a.x, b.x, fmaf(a.y, b.y, sums[i]));
                }
              }
            }
            float acc = (sums[0] + sums[1]) + (sums[2] + sums[3]);
            for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (lane == 0) partial[(seg * rows_blk + int(r - r0) + row) * ph.split + part] = acc;
          }
          __syncwarp();
          if (lane == 0) mbar_arrive(empty(slot));
          if (tid == 0) trace_point(trace, traced, chunk, 2);
          ++chunk;
          if (++slot == slots) slot = 0, ++use;
        }
      sync();
      for (int i = tid; i < rows_blk; i += kConsumerWarps * 32) {
        float y0 = 0, y1 = 0;
        for (int part = 0; part < ph.split && mode != kChain; ++part)
          y0 += partial[i * ph.split + part];
        if (ph.segments == 2 && mode != kChain)
          for (int part = 0; part < ph.split; ++part)
            y1 += partial[(rows_blk + i) * ph.split + part];
        float out;
        if (ph.epilogue == kSwiGlu) {
          const float g = bf(y0);
          out = bf(g / (1.f + __expf(-g))) * bf(y1);
        } else if (ph.epilogue == kResidual) {
          out = load_cg_bf16(ph.resid + r0 + i) + bf(y0);
        } else {
          out = y0;
        }
        ph.out[r0 + i] = __float2bfloat16_rn(out);
      }
    }
    sync();
    if (tid == 0) release_add(counters + p);
  }
}

// ---- how fast one block an SM pulls bytes on chip, by form ----------------------------------
// Every persistent form measured so far (the seventh session's, this probe's stream mode) and the
// staged gemv's layers stream at ~11-12 GB/s an SM, the same on the H100 and the H200 and whatever
// the ring depth: the shared part is 1-D bulk copies issued by one thread of one block an SM. This
// kernel times that alone, with no consumer (a slot is reissued as soon as its copy has landed),
// beside more issuing warps, every slot's own issuing lane of one warp, and plain 16-byte loads by
// every thread. They all ran at 86-102 % of the copy bandwidth on an H100 (thirtieth session): the
// copies' form is not what bounds the persistent forms.
enum CopyForm : int { kBulkOneIssuer = 0, kBulkFourIssuers = 1, kVectorLoads = 2, kBulkLanes = 3 };

__global__ void __launch_bounds__(kThreads, 1)
    copy_form_kernel(const unsigned char* src, size_t bytes_per_block, int form, int chunk_bytes,
                     int slots, unsigned* sink) {
  using namespace hk::sdk::cuda::sm90;
  extern __shared__ __align__(128) unsigned char smem[];
  const unsigned char* mine = src + bytes_per_block * blockIdx.x;
  if (form == kVectorLoads) {
    const uint4* p = reinterpret_cast<const uint4*>(mine);
    const size_t n = bytes_per_block / 16;
    unsigned acc = 0;
    for (size_t i = threadIdx.x; i < n; i += size_t(blockDim.x) * 8) {
      uint4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const size_t j = i + size_t(u) * blockDim.x;
        v[u] = j < n ? __ldg(p + j) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x9E3779B9u) sink[blockIdx.x] = acc;  // keeps the loads
    return;
  }
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t bars = base + uint32_t(slots) * uint32_t(chunk_bytes);
  // issuers: lane 0 of warps 0..3 (four issuers), or lanes 0..slots-1 of warp 0 (one a slot)
  const int issuers = form == kBulkOneIssuer ? 1 : form == kBulkFourIssuers ? 4 : slots;
  const int per = slots / issuers;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int issuer = form == kBulkLanes ? (warp == 0 && lane < issuers ? lane : -1)
                                        : (lane == 0 && warp < issuers ? warp : -1);
  if (threadIdx.x == 0) {
    for (int s = 0; s < slots; ++s) mbar_init(bars + 8 * s, 1);
    fence_barrier_init();
  }
  __syncthreads();
  if (issuer < 0) return;
  const int chunks = int(bytes_per_block / size_t(chunk_bytes));
  int mine_count = 0;  // this issuer's chunks: issuer, issuer + issuers, ...
  for (int c = issuer; c < chunks; c += issuers, ++mine_count) {
    const int s = issuer * per + mine_count % per;
    const uint32_t use = uint32_t(mine_count / per);
    if (use > 0) mbar_wait(bars + 8 * s, (use - 1) & 1);
    mbar_expect_tx(bars + 8 * s, uint32_t(chunk_bytes));
    bulk_load(base + uint32_t(s) * uint32_t(chunk_bytes), mine + size_t(c) * chunk_bytes,
              uint32_t(chunk_bytes), bars + 8 * s);
  }
  for (int j = 0; j < per; ++j) {  // the last copy of each slot has landed
    const int uses = mine_count / per + (j < mine_count % per ? 1 : 0);
    if (uses > 0) mbar_wait(bars + 8 * (issuer * per + j), uint32_t(uses - 1) & 1);
  }
}

// ---- host ----------------------------------------------------------------------------------
struct HostPhase {
  Phase d;
  std::vector<size_t> w_off;  // into the host weight copy
  size_t in_off, out_off, resid_off = 0, norm_off = 0, k_off = 0, v_off = 0;
  bool norm = false;
};

// The phase from the device's own input, on the host; returns the worst |device − host| over
// the tolerance (worst_over_tolerance).
double check_phase(const HostPhase& hp, const std::vector<uint16_t>& w,
                   const std::vector<uint16_t>& act, int cache_t) {
  const Phase& ph = hp.d;
  std::vector<float> ref(size_t(ph.n), 0.f);
  if (ph.kind == kAttend) {
    for (int h = 0; h < kQHeads; ++h) {
      const std::vector<float> o = host_attend_head(act.data() + hp.in_off, w.data() + hp.k_off,
                                                    w.data() + hp.v_off, cache_t, h);
      std::copy(o.begin(), o.end(), ref.begin() + h * kHeadDim);
    }
  } else {
    std::vector<float> x(ph.k);
    double ss = 0;
    for (int i = 0; i < ph.k; ++i)
      ss += double(from_bf16(act[hp.in_off + i])) * from_bf16(act[hp.in_off + i]);
    const float r = 1.f / std::sqrt(float(ss / ph.k) + kEps);
    for (int i = 0; i < ph.k; ++i) {
      const float v = from_bf16(act[hp.in_off + i]);
      x[i] = hp.norm ? rb(rb(v * r) * from_bf16(w[hp.norm_off + i])) : v;
    }
    for (int j = 0; j < ph.n; ++j) {
      float y[2] = {0, 0};
      for (int seg = 0; seg < ph.segments; ++seg) {
        const uint16_t* row = w.data() + hp.w_off[seg] + size_t(j) * ph.k;
        double acc = 0;
        for (int i = 0; i < ph.k; ++i) acc += double(from_bf16(row[i])) * x[i];
        y[seg] = float(acc);
      }
      if (ph.epilogue == kSwiGlu) {
        const float g = rb(y[0]);
        ref[j] = rb(g / (1.f + std::exp(-g))) * rb(y[1]);
      } else if (ph.epilogue == kResidual) {
        ref[j] = from_bf16(act[hp.resid_off + j]) + rb(y[0]);
      } else {
        ref[j] = y[0];
      }
    }
  }
  return worst_over_tolerance(ref, act.data() + hp.out_off);
}

// The traced step's chunks of each traced block: median copy issue -> consumers' wait returned,
// median products (warp 0), the consumers' time between a chunk done and the next one's wait
// returned (phase work, counter waits and waiting for data together), how many chunks the
// producer had issued ahead when the consumers took one, and the span.
nlohmann::json summarize_trace(const std::vector<unsigned long long>& tr,
                               const std::vector<int>& chunks_per_block) {
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  nlohmann::json out = nlohmann::json::array();
  for (int b = 0; b < kTraceBlocks; ++b) {
    const int n = std::min(chunks_per_block[b], kTraceChunks);
    auto at = [&](int c, int point) {
      return double(tr[(size_t(b) * kTraceChunks + c) * kTracePoints + point]);
    };
    if (n == 0 || at(0, 0) == 0) continue;
    std::vector<double> latency, products, between, lead;
    double between_total = 0, products_total = 0;
    int issued = 0;  // copies issued by the time the consumers took chunk c (both in chunk order)
    for (int c = 0; c < n; ++c) {
      latency.push_back((at(c, 1) - at(c, 0)) * 1e-3);
      products.push_back((at(c, 2) - at(c, 1)) * 1e-3);
      products_total += products.back();
      if (c > 0) {
        between.push_back((at(c, 1) - at(c - 1, 2)) * 1e-3);
        between_total += between.back();
      }
      while (issued < n && at(issued, 0) <= at(c, 1)) ++issued;
      lead.push_back(issued - c - 1);
    }
    out.push_back({{"block", b == 0 ? "0" : "grid/2"},
                   {"chunks", n},
                   {"issue_to_taken_us_median", median(latency)},
                   {"products_us_median", median(products)},
                   {"products_us_total", products_total},
                   {"between_chunks_us_median", median(between)},
                   {"between_chunks_us_total", between_total},
                   {"issued_ahead_median", median(lead)},
                   {"span_us", (at(n - 1, 2) - at(0, 0)) * 1e-3}});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path;
  int steps = 20, cache_t = 80, slots = kMaxSlots;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc)
      out_path = argv[++i];
    else if (a == "--steps" && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (a == "--cache" && i + 1 < argc)
      cache_t = std::atoi(argv[++i]);
    else if (a == "--slots" && i + 1 < argc)
      slots = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: hk_bench_persistent_step [--out FILE.json] [--steps N] [--cache T] "
                   "[--slots S]\n");
      return 1;
    }
  }
  if (steps < 1 || cache_t < 1 || slots < 2 || slots > kMaxSlots) {
    std::fprintf(stderr, "hk_bench_persistent_step: --steps ≥ 1, --cache ≥ 1, --slots 2..%d\n",
                 kMaxSlots);
    return 1;
  }
  cudaDeviceProp prop{};
  const int grid = sm90_grid("hk_bench_persistent_step", prop);

  HostArena arena;
  std::vector<uint16_t>& w = arena.w;
  std::vector<HostPhase> hps;
  auto gemv = [](Epilogue epilogue, int k, int n, std::vector<size_t> w_off, size_t in,
                 size_t out) {
    HostPhase p{};
    p.d.kind = kGemv, p.d.epilogue = epilogue, p.d.k = k, p.d.n = n;
    p.d.segments = int(w_off.size()), p.w_off = std::move(w_off), p.in_off = in, p.out_off = out;
    return p;
  };
  auto normed = [](HostPhase p, size_t norm_off) {
    p.norm = true, p.norm_off = norm_off;
    return p;
  };
  auto plus = [](HostPhase p, size_t resid_off) {
    p.resid_off = resid_off;
    return p;
  };
  std::vector<size_t> h(kLayers + 1);
  h[0] = arena.activation(kHidden);
  for (int l = 0; l < kLayers; ++l) {
    const size_t w_qkv = arena.matrix(kQkv, kHidden, kHidden),
                 w_o = arena.matrix(kHidden, kQHeads * kHeadDim, kQHeads * kHeadDim);
    const size_t w_gate = arena.matrix(kInter, kHidden, kHidden),
                 w_up = arena.matrix(kInter, kHidden, kHidden);
    const size_t w_down = arena.matrix(kHidden, kInter, kInter);
    const size_t n_in = arena.norm_weight(), n_post = arena.norm_weight();
    const size_t kc = arena.weight(size_t(kKvHeads) * cache_t * kHeadDim, 1.f, 0);
    const size_t vc = arena.weight(size_t(kKvHeads) * cache_t * kHeadDim, 1.f, 0);
    const size_t qkv = arena.activation(kQkv), a = arena.activation(kQHeads * kHeadDim),
                 hp = arena.activation(kHidden), s = arena.activation(kInter);
    h[l + 1] = arena.activation(kHidden);
    hps.push_back(normed(gemv(kStore, kHidden, kQkv, {w_qkv}, h[l], qkv), n_in));
    HostPhase attend{};
    attend.d.kind = kAttend, attend.d.n = kQHeads * kHeadDim;
    attend.in_off = qkv, attend.out_off = a, attend.k_off = kc, attend.v_off = vc;
    hps.push_back(attend);
    hps.push_back(plus(gemv(kResidual, kQHeads * kHeadDim, kHidden, {w_o}, a, hp), h[l]));
    hps.push_back(normed(gemv(kSwiGlu, kHidden, kInter, {w_gate, w_up}, hp, s), n_post));
    hps.push_back(plus(gemv(kResidual, kInter, kHidden, {w_down}, s, h[l + 1]), hp));
  }
  const size_t w_lm = arena.matrix(kVocab, kHidden, kHidden), n_final = arena.norm_weight();
  hps.push_back(
      normed(gemv(kStore, kHidden, kVocab, {w_lm}, h[kLayers], arena.activation(kVocab)), n_final));
  std::vector<uint16_t> act(arena.act_total, 0);
  {
    Rng rng{12345};
    for (int i = 0; i < kHidden; ++i) act[h[0] + i] = to_bf16(rng.uniform() * 1.7f);
  }
  size_t weight_bytes = 0;  // the bytes a step streams: the weights, without caches and norms
  for (const HostPhase& p : hps)
    if (p.d.kind == kGemv) weight_bytes += size_t(p.d.segments) * p.d.n * p.d.k * 2;

  bf16 *d_w = nullptr, *d_act = nullptr;
  CK(cudaMalloc(&d_w, w.size() * 2));
  CK(cudaMalloc(&d_act, act.size() * 2));
  CK(cudaMemcpy(d_w, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_act, act.data(), act.size() * 2, cudaMemcpyHostToDevice));
  std::vector<Phase> phases;
  for (HostPhase& p : hps) {
    Phase d = p.d;
    if (d.kind == kGemv) {
      d.rows_per_chunk = 1;
      while (d.rows_per_chunk * 2 * d.k * 2 <= kSlotBytes) d.rows_per_chunk *= 2;
      d.split = d.rows_per_chunk >= kConsumerWarps ? 1 : kConsumerWarps / d.rows_per_chunk;
      const int64_t rows_blk = (int64_t(d.n) + grid - 1) / grid;
      if (d.k % (d.split * 8) != 0 || d.k > kMaxK || d.k / d.split / 8 > kMaxItemPieces ||
          rows_blk * d.segments * d.split > kMaxPartials) {
        std::fprintf(stderr, "hk_bench_persistent_step: a phase (k %d, n %d) does not fit\n", d.k,
                     d.n);
        return 1;
      }
      for (int s = 0; s < d.segments; ++s) d.w[s] = d_w + p.w_off[s];
      d.norm_w = p.norm ? d_w + p.norm_off : nullptr;
      d.resid = d.epilogue == kResidual ? d_act + p.resid_off : nullptr;
    } else {
      d.k_cache = d_w + p.k_off, d.v_cache = d_w + p.v_off;
    }
    d.in = d_act + p.in_off;
    d.out = d_act + p.out_off;
    phases.push_back(d);
  }
  Phase* d_phases = nullptr;
  unsigned* d_counters = nullptr;
  const int n_phases = int(phases.size());
  CK(cudaMalloc(&d_phases, phases.size() * sizeof(Phase)));
  CK(cudaMemcpy(d_phases, phases.data(), phases.size() * sizeof(Phase), cudaMemcpyHostToDevice));
  CK(cudaMalloc(&d_counters, n_phases * sizeof(unsigned)));
  const size_t trace_words = size_t(kTraceBlocks) * kTraceChunks * kTracePoints;
  unsigned long long* d_trace = nullptr;
  CK(cudaMalloc(&d_trace, trace_words * sizeof(unsigned long long)));
  std::vector<int> chunks_per_block(kTraceBlocks, 0);
  for (int b = 0; b < kTraceBlocks; ++b) {
    const int block = b == 0 ? 0 : grid / 2;
    for (const Phase& d : phases) {
      if (d.kind != kGemv) continue;
      const int64_t rows = row_begin(d.n, block + 1, grid) - row_begin(d.n, block, grid);
      chunks_per_block[b] += d.segments * int((rows + d.rows_per_chunk - 1) / d.rows_per_chunk);
    }
  }
  fit_one_block_an_sm(step_kernel, kThreads, kSmem, "hk_bench_persistent_step");

  const double copy_gbs = copy_bandwidth_gbs();

  // the copy forms, each over the weights (bytes_per_block a block, one block an SM), median of 5
  nlohmann::json copy_forms = nlohmann::json::array();
  {
    struct Form {
      const char* name;
      int form, chunk_bytes, slots;
    };
    const Form forms[] = {{"bulk, 1 issuer, 16 KB x 12", kBulkOneIssuer, 16384, 12},
                          {"bulk, 1 issuer, 4 KB x 12", kBulkOneIssuer, 4096, 12},
                          {"bulk, 1 issuer, 64 KB x 3", kBulkOneIssuer, 65536, 3},
                          {"bulk, 4 issuers, 16 KB x 12", kBulkFourIssuers, 16384, 12},
                          {"bulk, 12 lanes, 16 KB x 12", kBulkLanes, 16384, 12},
                          {"16-byte loads, 288 threads", kVectorLoads, 16384, 12}};
    const size_t bytes_per_block = (w.size() * 2 / size_t(grid)) / 65536 * 65536;
    unsigned* d_sink = nullptr;
    CK(cudaMalloc(&d_sink, size_t(grid) * sizeof(unsigned)));
    CK(cudaFuncSetAttribute(copy_form_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    std::printf("one block an SM pulling %.1f MB each into shared memory (GB/s, all SMs):\n",
                bytes_per_block / 1e6);
    for (const Form& f : forms) {
      auto pull = [&] {
        copy_form_kernel<<<grid, kThreads, kSmem>>>(reinterpret_cast<const unsigned char*>(d_w),
                                                    bytes_per_block, f.form, f.chunk_bytes, f.slots,
                                                    d_sink);
        CK(cudaGetLastError());
      };
      pull();  // warms up
      const std::vector<float> ms = sorted_times_ms(5, pull);
      const double gbs = double(bytes_per_block) * grid / (ms[ms.size() / 2] * 1e-3) / 1e9;
      std::printf("  %-30s %7.0f GB/s  (%.1f GB/s an SM, %.0f %% of the copy bandwidth)\n", f.name,
                  gbs, gbs / grid, gbs / copy_gbs * 100);
      copy_forms.push_back({{"form", f.name},
                            {"chunk_bytes", f.chunk_bytes},
                            {"slots", f.slots},
                            {"gbs", gbs},
                            {"fraction_of_copy_bandwidth", gbs / copy_gbs}});
    }
    CK(cudaFree(d_sink));
  }

  const char* mode_names[kModes] = {"persistent", "no-lookahead", "stream", "chain"};
  nlohmann::json modes = nlohmann::json::array();
  std::printf(
      "persistent decode step probe (%s, %d blocks, %d slots of 16 KB, cache %d, %.3f GB "
      "of weights a step, copy bandwidth %.0f GB/s -> %.1f us floor)\n",
      prop.name, grid, slots, cache_t, weight_bytes / 1e9, copy_gbs,
      weight_bytes / copy_gbs * 1e-3);
  bool ok = true;
  for (int mode = 0; mode < kModes; ++mode) {
    const bool checked = mode == kPersistent || mode == kNoLookahead;
    CK(cudaMemset(d_counters, 0, n_phases * sizeof(unsigned)));
    CK(cudaMemcpy(d_act, act.data(), act.size() * 2, cudaMemcpyHostToDevice));
    unsigned epoch = 0;
    auto launch = [&](unsigned long long* trace) {
      int m = mode, sl = slots, ct = cache_t, np = n_phases;
      void* args[] = {&d_phases, &np, &d_counters, &epoch, &m, &sl, &ct, &trace};
      CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(step_kernel), dim3(grid),
                                     dim3(kThreads), args, kSmem, nullptr));
      ++epoch;
    };
    const ModeTiming timing = time_mode(steps, d_trace, trace_words, launch);
    const nlohmann::json chunk_trace = summarize_trace(timing.trace, chunks_per_block);
    const double med = timing.median_us, best = timing.best_us;
    double worst = 0;
    int worst_phase = -1;
    if (checked) {
      const std::vector<uint16_t> got = poisoned_step(act, h[0], d_act, [&] { launch(nullptr); });
      for (int p = 0; p < n_phases; ++p) {
        const double e = check_phase(hps[p], w, got, cache_t);
        if (!(e <= worst)) worst = e, worst_phase = p;
      }
      if (!(worst <= 1.0)) ok = false;
    }
    std::printf(
        "%-13s step %8.1f us median (best %.1f)  %6.0f tok/s  %5.1f %% of the weights' copy "
        "time  %s\n",
        mode_names[mode], med, best, 1e6 / med, weight_bytes / copy_gbs * 1e-3 / med * 100,
        !checked       ? "(not checked)"
        : worst <= 1.0 ? "checked"
                       : "CHECK FAILED");
    for (const nlohmann::json& t : chunk_trace)
      std::printf(
          "  block %s, %d chunks: issued -> taken %.2f us, products %.2f us (total %.0f), "
          "between chunks %.2f us (total %.0f), issued ahead %.0f, span %.0f us\n",
          t["block"].get<std::string>().c_str(), t["chunks"].get<int>(),
          t["issue_to_taken_us_median"].get<double>(), t["products_us_median"].get<double>(),
          t["products_us_total"].get<double>(), t["between_chunks_us_median"].get<double>(),
          t["between_chunks_us_total"].get<double>(), t["issued_ahead_median"].get<double>(),
          t["span_us"].get<double>());
    if (checked && worst > 1.0)
      std::printf("  worst phase %d (layer %d, phase %d of 5): %.2f × the tolerance\n", worst_phase,
                  worst_phase / 5, worst_phase % 5, worst);
    nlohmann::json record =
        mode_record(mode_names[mode], timing, weight_bytes / copy_gbs * 1e-3, checked);
    record["chunk_trace"] = chunk_trace;
    record["worst_error_over_tolerance"] = worst;
    modes.push_back(record);
  }
  if (!out_path.empty()) {
    nlohmann::json j = {{"gpu", prop.name},
                        {"blocks", grid},
                        {"slots", slots},
                        {"slot_bytes", kSlotBytes},
                        {"cache_positions", cache_t},
                        {"phases", n_phases},
                        {"weight_bytes", weight_bytes},
                        {"copy_gbs", copy_gbs},
                        {"steps_timed", steps},
                        {"modes", modes},
                        {"copy_forms", copy_forms}};
    std::ofstream(out_path) << j.dump(1) << "\n";
  }
  return ok ? 0 : 1;
}
