// hk_bench_split_step — a persistent batch-1 decode step at the Qwen3-0.6B shape with three
// grid-wide synchronisation points a layer instead of five (issue 14), measured before it is built.
//
// Why: hk_bench_persistent_step's trace (thirtieth session) showed its step (~845 µs on an H100)
// bound by the consumers, not the copies: one block an SM pulls 86-102 % of the copy bandwidth
// alone, but each of 141 phases costs ~2.2 µs of input reads, norms, epilogues and barriers on
// top of its products, and the synchronisation chain alone is ~350 µs (141 × 2.45 µs). Fewer
// synchronisation points and faster products are the only way under the ≤ 406 µs a step that 70 %
// of the H200's bandwidth limit asks. What the forms of this probe measured (thirtieth session:
// 707 µs a step on an H100, chain 320 µs, instruction-latency-bound at two warps a scheduler;
// thirty-first: 580 µs on an H200 and 661 on an H100 with four accumulator copies) is in
// docs/performance.md, issue 14.
//
// The step here, one cooperative launch, one block an SM (8 consumer warps + 1 producer warp; with
// `--warps 12|16` the warps past the eighth take row-product chunk pairs and the attention's loops
// too — measured slower on an H100, 680 and 777 against 666 µs a step, the 16-warp kernel spilling
// at its 96 registers):
//   A  qkv      v = rms_norm(h)·w_in, qkv = W_qkv·v, rows split over blocks         [4096 × 1024]
//   B  attend+o each block attends the one q head its rows of W_oᵀ belong to (redundantly on the
//               head's 8-9 blocks; plain f32 softmax as decode_step_probe.cuh's stand-in, but a
//               thread a cache position with the head's K rows and the block's dims of V fetched
//               into shared memory during the qkv phase before), then multiplies its rows c of W_oᵀ
//               [2048 × 1024] by a[c] and adds its 1024 partial sums into the accumulator with
//               vector reductions (split-K: no output rows to gather)
//   C  mlp      h' = h + bf(Σ acc_o), v = rms_norm(h')·w_post, the block's rows r of gate and
//               up, s[r] = silu(g)·u, then rows r of W_downᵀ [3072 × 1024] times s[r] into the
//               down accumulator (split-K again: the s the block made never leaves it)
//   then lm_head (the next A's input is h'' = h' + bf(Σ acc_down)), rows split [151936 × 1024].
// Every streamed matrix is row-major with rows of 1024 (W_o and W_down stored transposed, as a
// loader would once), so the producer copies whole rows, 8 to a 16 KB slot. The accumulators are
// f32 or, with `--accumulate i64`, fixed point (deterministic), `--copies` copies each (block b
// adds into copy b % copies; readers sum the copies; 4 by default: 132 blocks' vector reductions
// into one copy queue at L2 — 709 against 661 µs a step on an H100, and 8 copies 673), two parity
// sets (a step zeroes the set the next step uses). `--accumulate tagged` is the fixed point with
// each element's contribution count in its top bits and q/k/v stored again with the step's tag:
// readers poll the data itself, and no phase waits on a counter or releases one (thirty-second
// session, H100: 638-643 against 656-662 µs a step for f32 with counters — deterministic and
// faster). `--reduce bulk` adds a block's split-K sums by one TMA bulk reduction instead of 256
// threads' vector reductions; `--descriptor ahead` loads each phase's descriptor a phase early.
// `--inflight 1` keeps one 16 KB copy outstanding a block during the layers (lm_head uncapped): the
// synchronisation traffic then no longer queues behind the weight stream — 573 against 646 µs a
// step on an H100, 563 with the descriptor ahead (thirty-second session); `--weight-hint
// evict-first` reads the weights with an L2 evict-first policy.
// Rounding points as the built-in ops: each product to bf16, then the residual add to bf16; silu to
// bf16 before the product with up. Consumers take row products a warp a pair of chunks on the
// tensor cores (v as bf16 in shared memory) and split-K products every thread 4 of the 1024
// columns; every warp waits on and arrives at every chunk in order. After its counter a phase reads
// only what the phase before made (the sums, or q/k/v): the residual is the v every block computed
// two phases back (kept in registers); norm weights and cache rows are fetched before the wait.
//
// Modes: persistent (the producer as far ahead as the ring allows), stream (nobody waits on
// counters: the weights-and-math floor, numbers not checked), chain (no weights, no products, the
// reductions of zeros still made: the synchronisation floor of three points a layer), resident
// (the chain with the products made on whatever the ring holds, no copies, no slot barriers: the
// step if every weight were already in shared memory). It checks
// itself (persistent): one more step after every output is poisoned with bf16 NaN, each phase
// against the host from the device's own inputs to it. One more step per mode is traced: for
// blocks 0 and grid/2, each phase's counter wait, input, products and release by %globaltimer,
// summed by phase kind.
//
// `--qk-norm-rope` adds what the real step does between q/k/v and the attention: Qwen3's q/k
// RMSNorm and rotary embedding (B, warp 0, one half warp a head vector) and the step's k/v rows
// written into the cache, all checked against the host (built in the thirty-second session after
// its last device call: not yet run).
//
// Not an hk kernel: no split attention, sampling or batch > 1.
//
// Usage: hk_bench_split_step [--out FILE.json] [--steps N] [--cache T] [--slots S] [--copies C]
//                            [--accumulate f32|i64|tagged] [--reduce red|bulk] [--poll one|all]
//                            [--backoff NS] [--descriptor inline|ahead] [--inflight K]
//                            [--weight-hint none|evict-first] [--l2-lead N]
//                            [--warps 8|12|16] [--only MODE]
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "decode_step_probe.cuh"
#include "hk/kernel_sdk_sm90.cuh"

namespace {

using namespace decode_probe;

// consumer warps: 8, 12 or 16 (`--warps`; a template parameter of the kernel). The first 8 warps'
// 256 threads own 4 of the 1024 columns each (v, the norm, the split-K sums); every consumer warp
// takes row-product chunk pairs in turn and joins the attention's loops.
constexpr int kMaxConsumerWarps = 16, kSplitThreads = 256;
template <int kWarps>
__host__ __device__ constexpr int threads_of() {
  return kWarps * 32 + 32;  // + the producer warp
}
constexpr int kRowBytes = kHidden * 2, kRowsPerSlot = 8, kSlotBytes = kRowsPerSlot * kRowBytes;
constexpr int kMaxSlots = 10, kMaxCopies = 8;
constexpr int kMaxCache = 160;     // B keeps a head's cache rows in shared memory
constexpr int kMaxSplitRows = 64;  // a block's rows in B and C (grid ≥ 48)
static_assert(kSplitThreads * 4 == kHidden, "a split thread owns 4 of the split-K outputs");
static_assert(kMaxCache <= kSplitThreads, "a consumer thread fetches one cache position's V");

enum Kind : int { kRows = 0, kAttendO = 1, kMlp = 2 };
enum Mode : int { kPersistent = 0, kStream = 1, kChain = 2, kResident = 3 };
constexpr int kModes = 4;
constexpr const char* kModeNames[kModes] = {"persistent", "stream", "chain", "resident"};

struct SplitPhase {
  int kind, n, segments;  // n rows in each of `segments` streamed matrices [n × kHidden]
  const bf16* w[3];
  // the input vector v: `in` itself (layer 0; B's qkv), else bf(h + bf(Σ copies of acc_in)) with h
  // the v of the phase before last (every block holds it: no read)
  const bf16* in;
  const void* acc_in;  // parity 0's (f32 or fixed-point i64); parity 1's acc_half elements further
  const bf16* norm_w;
  bf16* v_out;  // each block's slice of v (null: not written)
  bf16* out;    // A: the n products; B: a (2048); C: s (3072)
  void* acc_out;
  // `--accumulate tagged`: A's q/k/v written again as tagged elements here, which B reads
  unsigned* tagged;
  bf16* k_cache;  // B writes the step's own row with `--qk-norm-rope`
  bf16* v_cache;
  // `--qk-norm-rope` (B): the layer's q_norm and k_norm weights [2 × 128], and the step's rotary
  // table, cos then sin of its position [2 × 64] (bf16, as Transformers casts them)
  const bf16* qk_norm;
  const bf16* rope;
};

// B's rows: each head's 128 rows of W_oᵀ over its 8-9 blocks, so a block attends one head
__host__ __device__ inline void attend_rows(int block, int grid, int& head, int64_t& r0,
                                            int64_t& r1) {
  hk::decode::persistent::attend_rows(block, grid, kQHeads, kHeadDim, head, r0, r1);
}
__host__ __device__ inline void phase_rows(const SplitPhase& ph, int block, int grid, int64_t& r0,
                                           int64_t& r1) {
  if (ph.kind == kAttendO) {
    int head;
    attend_rows(block, grid, head, r0, r1);
  } else {
    r0 = row_begin(ph.n, block, grid), r1 = row_begin(ph.n, block + 1, grid);
  }
}

constexpr int kMaxDims = kMaxSplitRows / 4;  // B's rows a block: 128 / (blocks a head ≥ 8)
// shared memory: ring | normed v (bf16) | split-K inputs | gate, up | K rows (bf16) | the block's V
// dims (f32, [dim][position]) | scores | q (f32) | reduce | bars (full, empty, K)
constexpr int kOffX = kMaxSlots * kSlotBytes;
constexpr int kOffXc = kOffX + kHidden * 2;
constexpr int kOffGate = kOffXc + kMaxSplitRows * 4;
constexpr int kOffUp = kOffGate + kMaxSplitRows * 4;
constexpr int kOffK = kOffUp + kMaxSplitRows * 4;
constexpr int kOffV = kOffK + kMaxCache * kHeadDim * 2;
constexpr int kOffScores = kOffV + kMaxDims * kMaxCache * 4;
constexpr int kOffQ = kOffScores + kMaxCache * 4;
constexpr int kOffReduce = kOffQ + kHeadDim * 4;
// the block's split-K sums staged for one bulk reduction (`--reduce bulk`): 1024 f32 or i64
constexpr int kOffRed = kOffReduce + 2 * kMaxConsumerWarps * 4;
constexpr int kOffBars = kOffRed + kHidden * 8;
constexpr int kSmem = kOffBars + (2 * kMaxSlots + 1) * 8;

// the trace: for blocks 0 and grid/2, each phase's counter acquired, input ready, products done
// and release made (%globaltimer)
constexpr int kTraceBlocks = 2, kTracePoints = 4;

// The accumulators: f32 (one vector reduction a thread; the sum's order, so its last bits, vary
// run to run), fixed point, i64 in units of 2^-32 (integer adds: the same bits whatever the
// order, as the graph-equals-eager token tests would need), or `tagged`: the same fixed point with
// the count of contributions in each element's top six bits, so a reader knows an element is
// complete from the element itself — no counter, no release fence, no acquire (each contribution
// is 2^58 + 2^50 + v·2^32 with |v·2^32| < 2^50: ≤ 63 of them a copy never carry into the count).
enum AccKind : int { kAccF32 = 0, kAccI64 = 1, kAccTagged = 2 };
// (the tagged element's constants and contribution are libhk's: persistent_step_device.cuh)
__device__ __forceinline__ long long fixed_contribution(float v, int kind) {
  return kind == kAccTagged ? tagged_contribution(v) : llrintf(v * kFixedScale);
}
__device__ __forceinline__ void reduce_add4(void* p, const float (&v)[4], int kind) {
  if (kind == kAccF32) {
    asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(v[0]),
                 "f"(v[1]), "f"(v[2]), "f"(v[3])
                 : "memory");
    return;
  }
  for (int e = 0; e < 4; ++e)
    asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;\n" ::"l"(static_cast<char*>(p) + 8 * e),
                 "l"(static_cast<unsigned long long>(fixed_contribution(v[e], kind)))
                 : "memory");
}
// four accumulator elements at p, as raw words (f32: one 16-byte load; i64: two, each element
// read whole — a tagged element's count and value must come from the same moment)
struct Acc4 {
  unsigned long long e[4];
};
__device__ __forceinline__ Acc4 load_acc4(const void* p, int kind) {
  Acc4 a;
  if (kind == kAccF32) {
    const uint4 v = load_cg16(p);
    a.e[0] = v.x, a.e[1] = v.y, a.e[2] = v.z, a.e[3] = v.w;
    return a;
  }
  load_relaxed_2x64(p, a.e[0], a.e[1]);
  load_relaxed_2x64(static_cast<const char*>(p) + 16, a.e[2], a.e[3]);
  return a;
}
// every element of a tagged Acc4 holds `want` contributions
__device__ __forceinline__ bool acc4_complete(const Acc4& a, unsigned want) {
  return unsigned(a.e[0] >> kTagShift) == want && unsigned(a.e[1] >> kTagShift) == want &&
         unsigned(a.e[2] >> kTagShift) == want && unsigned(a.e[3] >> kTagShift) == want;
}
__device__ __forceinline__ void add_acc4(float (&sum)[4], long long (&isum)[4], const Acc4& a,
                                         int kind) {
  if (kind == kAccF32) {
    for (int e = 0; e < 4; ++e) sum[e] += __uint_as_float(unsigned(a.e[e]));
    return;
  }
  for (int e = 0; e < 4; ++e) {
    if (kind == kAccI64) {
      isum[e] += static_cast<long long>(a.e[e]);
    } else {
      const long long n = static_cast<long long>(a.e[e] >> kTagShift);
      isum[e] += static_cast<long long>(a.e[e] & ((1ull << kTagShift) - 1)) - n * kTagBias;
    }
  }
}
// a tagged q/k/v element: the bf16 bits low, the step's tag (step_tag: 1..65535) high, one
// 4-byte store, polled by load_relaxed16 / load_relaxed
__device__ __forceinline__ bool tags_are(const uint4& v, unsigned tag) {
  return (v.x >> 16) == tag && (v.y >> 16) == tag && (v.z >> 16) == tag && (v.w >> 16) == tag;
}
// eight tagged elements at p once all carry `tag` (every load is the wait: no counter before it)
// A failed poll sleeps `backoff_ns` before the next (`--backoff`): every block polling the lines
// the reductions are still landing in slows those reductions.
__device__ __forceinline__ void poll_backoff(uint32_t& tries, int backoff_ns) {
  if (++tries > (1u << 25)) __trap();
  if (backoff_ns > 0) __nanosleep(backoff_ns);
}
__device__ __forceinline__ void load_tagged8(const unsigned* p, unsigned tag, bool wait,
                                             int backoff_ns, float (&out)[8]) {
  uint4 a, b;
  for (uint32_t tries = 0;;) {
    a = load_relaxed16(p), b = load_relaxed16(p + 4);
    if (!wait || (tags_are(a, tag) && tags_are(b, tag))) break;
    poll_backoff(tries, backoff_ns);
  }
  const unsigned w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  for (int i = 0; i < 8; ++i) out[i] = __uint_as_float((w[i] & 0xffffu) << 16);
}

// The accumulator kind and the split-K reduction form are template parameters: as runtime flags
// their branches cost the f32 step ~20 % (thirty-second session, H100: chain 345 against 288 µs).
// kQkRope (`--qk-norm-rope`): B applies Qwen3's q/k RMSNorm and rotary embedding to q and the new k
// and writes the step's k and v rows into the cache, as the real step must.
template <int kConsumerWarps, int kAcc, bool kBulk, bool kDescriptorAhead, bool kQkRope = false>
__global__ void __launch_bounds__(threads_of<kConsumerWarps>(), 1)
    split_step_kernel(const SplitPhase* phases, int n_phases, unsigned* counters, unsigned epoch,
                      int mode, int slots, int l2_lead, int cache_t, int copies, bool poll_all,
                      int backoff_ns, int inflight, bool weight_evict_first, char* acc_all,
                      int64_t acc_half, unsigned long long* trace) {
  using namespace hk::sdk::cuda::sm90;
  constexpr int kConsumers = kConsumerWarps * 32, kThreads = threads_of<kConsumerWarps>();
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  bf16* x = reinterpret_cast<bf16*>(smem + kOffX);  // the phase's normed v, bf16 (exact)
  float* xc = reinterpret_cast<float*>(smem + kOffXc);
  float* gate = reinterpret_cast<float*>(smem + kOffGate);
  float* up = reinterpret_cast<float*>(smem + kOffUp);
  unsigned char* kbuf = smem + kOffK;
  float* vbuf = reinterpret_cast<float*>(smem + kOffV);
  float* scores = reinterpret_cast<float*>(smem + kOffScores);
  float* qs = reinterpret_cast<float*>(smem + kOffQ);
  float* reduce = reinterpret_cast<float*>(smem + kOffReduce);
  const uint32_t kbar = base + kOffBars + 16 * kMaxSlots;
  auto full = [&](int s) { return base + kOffBars + 8 * s; };
  auto empty = [&](int s) { return base + kOffBars + 8 * (kMaxSlots + s); };
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int grid = gridDim.x, block = blockIdx.x;
  const unsigned target = unsigned(grid) * (epoch + 1);
  constexpr int acc_kind = kAcc;
  constexpr bool bulk_reduce = kBulk, fixed = kAcc != kAccF32, tagged = kAcc == kAccTagged;
  const int acc_bytes = fixed ? 8 : 4;  // an accumulator element
  const unsigned tag = step_tag(epoch);
  // tagged: the contributions copy c of an accumulator gets (blocks b with b % copies == c)
  auto copy_count = [&](int c) { return unsigned((grid - c + copies - 1) / copies); };
  const int64_t parity_off = (epoch & 1) ? acc_half : 0;
  // element `e` of copy `c` of an accumulator, this step's parity
  auto acc_at = [&](const void* acc, int c, int e) {
    return static_cast<const char*>(acc) + (parity_off + int64_t(c) * kHidden + e) * acc_bytes;
  };
  const int traced = block == 0 ? 0 : block == grid / 2 ? 1 : -1;
  auto trace_point = [&](int p, int point) {
    if (trace != nullptr && traced >= 0 && tid == 0)
      trace[(size_t(traced) * n_phases + p) * kTracePoints + point] = global_time();
  };
  if (tid == 0) {
    for (int s = 0; s < slots; ++s) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), kConsumerWarps);
    }
    mbar_init(kbar, 1);
    fence_barrier_init();
  }
  // the other parity's accumulators, for the next step (nobody reads them this step)
  {
    uint4* other = reinterpret_cast<uint4*>(acc_all + ((epoch & 1) ? 0 : acc_half * acc_bytes));
    const int64_t n4 = acc_half * acc_bytes / 16;
    for (int64_t i = row_begin(n4, block, grid) + tid; i < row_begin(n4, block + 1, grid);
         i += kThreads)
      other[i] = make_uint4(0, 0, 0, 0);
  }
  __syncthreads();

  if (warp == kConsumerWarps) {  // the producer: every phase's rows, in order
    if (lane != 0 || mode == kChain || mode == kResident) return;
    // the block's chunks in stream order; `ahead` runs l2_lead chunks in front of the copies,
    // prefetching into L2 (no shared memory, no barrier): L2 then holds the stream's next ~l2_lead
    // × 16 KB a block while the ring is full and the copies wait on the consumers
    auto rows_of = [=](const SplitPhase& ph, int64_t& r0, int64_t& r1) {
      phase_rows(ph, block, grid, r0, r1);
    };
    using Cursor = ChunkCursor<SplitPhase, decltype(rows_of), kRowsPerSlot, kHidden>;
    Cursor next{phases, n_phases, rows_of}, ahead{phases, n_phases, rows_of};
    for (int i = 0; i < l2_lead && ahead.valid(); ++i, ahead.advance())
      hk::sdk::cuda::sm90::bulk_prefetch_l2(ahead.source(), ahead.bytes());
    // `--inflight K`: at most K chunks' copies outstanding (the copy K back has landed before the
    // next is issued), so an input read or a release's acknowledgement queues behind at most K × 16
    // KB of weights on the way to this SM; `--weight-hint evict-first`: the copies read the weights
    // with an L2 evict-first policy, so the stream does not push the activations out of L2
    const uint64_t policy = weight_evict_first ? l2_evict_first_policy() : 0;
    int slot = 0, old_slot = 0;
    uint32_t use = 0, old_use = 0;  // how many times the ring has wrapped (at the copy K back)
    int issued = 0;
    for (; next.valid(); next.advance()) {
      const uint32_t bytes = next.bytes();
      if (use > 0) mbar_wait(empty(slot), (use - 1) & 1);
      // lm_head's copies are not capped: it only streams (nothing synchronises after it)
      if (inflight > 0 && issued >= inflight && next.p < n_phases - 1) {
        mbar_wait(full(old_slot), old_use & 1);
        if (++old_slot == slots) old_slot = 0, ++old_use;
      }
      mbar_expect_tx(full(slot), bytes);
      if (weight_evict_first)
        bulk_load(base + slot * kSlotBytes, next.source(), bytes, full(slot), policy);
      else
        bulk_load(base + slot * kSlotBytes, next.source(), bytes, full(slot));
      // (the cap counts from the copy K back: after lm_head's first uncapped copy there is no
      // later capped one)
      ++issued;
      if (++slot == slots) slot = 0, ++use;
      if (l2_lead > 0 && ahead.valid())
        hk::sdk::cuda::sm90::bulk_prefetch_l2(ahead.source(), ahead.bytes()), ahead.advance();
    }
    return;
  }

  // the consumers (kConsumers threads, named barrier 1); the split threads are the first 256
  auto sync = [] { named_sync(1, kConsumers); };
  RingPos next{0, 0};  // the next chunk's slot and the ring's wraps before it
  // `rows` rows of the next chunks times the phase's v, a warp a pair of chunks (pair p to warp
  // p % kConsumerWarps) on the tensor cores (rows_mma); sink(row, y) on lanes q == 0. The first
  // forms (CUDA-core dot products: a warp a row with a 5-shuffle sum, then a warp a chunk) ran ~0.4
  // µs a chunk with the data resident: about 600 instructions a chunk at two warps a scheduler.
  auto rows_product = [&](int rows, auto&& sink) {
    const int chunks = (rows + kRowsPerSlot - 1) / kRowsPerSlot;
    if (mode == kChain) {
      if (lane == 0)
        for (int r = warp; r < rows; r += kConsumerWarps) sink(r, 0.f);
      return;
    }
    // every warp waits on and arrives at every chunk, in order, and only the pair's own warp reads
    // it: so no warp can fall a lap behind a slot or wait on a fill whose predecessor it has not
    // seen (an mbarrier's phases alias two apart)
    for (int i = 0; i < chunks; i += 2) {
      const bool two = i + 1 < chunks;
      const RingPos a = next, b = two ? next.after(slots) : next;
      if (mode != kResident) {
        mbar_wait(full(a.slot), a.parity());
        if (two) mbar_wait(full(b.slot), b.parity());
      }
      if ((i / 2) % kConsumerWarps == warp) {
        float ya, yb;
        rows_mma<kHidden>(smem + a.slot * kSlotBytes, smem + b.slot * kSlotBytes,
                          reinterpret_cast<const unsigned char*>(x), lane, ya, yb);
        sink_pair<kRowsPerSlot>(lane, i, rows, two, ya, yb, sink);
      }
      __syncwarp();  // the pair's reads are done before the warp's arrival
      if (lane == 0 && mode != kResident) {
        mbar_arrive(empty(a.slot));
        if (two) mbar_arrive(empty(b.slot));
      }
      next = b.after(slots);
    }
  };
  // `rows` rows c of the next chunks times xc[c], every thread its 4 of the 1024 columns, summed
  // into the accumulator copy of this block
  auto split_k = [&](int rows, void* acc_out) {
    const int chunks = (rows + kRowsPerSlot - 1) / kRowsPerSlot;
    float acc[4] = {0, 0, 0, 0};
    if (mode != kChain) {
      for (int i = 0; i < chunks; ++i) {
        const RingPos a = next;
        next = next.after(slots);
        if (mode != kResident) mbar_wait(full(a.slot), a.parity());
        // every row of the slot: xc is zero past the phase's rows (rows of a part-filled slot
        // hold earlier weights, finite), so no branch
        if (tid < kSplitThreads)
          add_chunk_columns<kRowsPerSlot, kRowBytes>(smem + a.slot * kSlotBytes + tid * 8,
                                                     xc + i * kRowsPerSlot, acc);
        __syncwarp();
        if (lane == 0 && mode != kResident) mbar_arrive(empty(a.slot));
      }
    }

    char* dst = const_cast<char*>(acc_at(acc_out, block % copies, 0));
    if (!bulk_reduce) {
      if (tid < kSplitThreads) reduce_add4(dst + tid * 4 * acc_bytes, acc, acc_kind);
      return;
    }
    // one bulk reduction a block (the TMA unit adds the 4 or 8 KB at L2) instead of 256 threads'
    // vector reductions
    if (tid < kSplitThreads) {
      if (fixed) {
        long long* st = reinterpret_cast<long long*>(smem + kOffRed) + tid * 4;
        for (int e = 0; e < 4; ++e) st[e] = fixed_contribution(acc[e], acc_kind);
      } else {
        *reinterpret_cast<float4*>(smem + kOffRed + tid * 16) =
            make_float4(acc[0], acc[1], acc[2], acc[3]);
      }
      fence_proxy_async();
    }
    sync();
    if (tid == 0) {
      if (fixed)
        bulk_reduce_add_u64(dst, base + kOffRed, kHidden * 8);
      else
        bulk_reduce_add_f32(reinterpret_cast<float*>(dst), base + kOffRed, kHidden * 4);
      bulk_commit();
      if (tagged) {
        bulk_wait_read_all();  // the staging buffer is free again; the adds land on their own
      } else {
        bulk_wait_all();
        // the async proxy's global writes before the generic release that publishes them
        fence_proxy_async_global();
      }
    }
  };

  // copies c0 … c0 + 3 of an accumulator's elements [e, e + 4) into part, every load issued before
  // any is looked at; tagged: whether every element holds all its contributions
  auto load_copies = [&](const void* acc, int c0, int e, Acc4(&part)[4]) {
#pragma unroll
    for (int c = 0; c < 4; ++c)
      if (c0 + c < copies) part[c] = load_acc4(acc_at(acc, c0 + c, e), acc_kind);
    bool complete = true;
    if (tagged)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (c0 + c < copies) complete = complete && acc4_complete(part[c], copy_count(c0 + c));
    return complete;
  };

  float vkeep[4] = {0, 0, 0, 0};  // this thread's 4 elements of the last v: the next residual
  int attend_uses = 0;
  // `--descriptor ahead`: each phase's descriptor is loaded into registers one phase early —
  // otherwise its first fields (L2: every phase's descriptor is read once a step, so L1 misses) are
  // a round trip at the head of every phase
  SplitPhase ph_next = phases[0];
  for (int p = 0; p < n_phases; ++p) {
    // by value: a reference re-read the fields from global memory after every barrier and counter
    // acquire (which leave L1 stale), an L2 round trip each
    const SplitPhase ph = kDescriptorAhead ? ph_next : phases[p];
    if (kDescriptorAhead && p + 1 < n_phases) ph_next = phases[p + 1];
    int64_t r0, r1;
    phase_rows(ph, block, grid, r0, r1);
    const int rows = int(r1 - r0);
    // before the counter, what does not depend on the phase before: the norm weights; and in a
    // qkv phase the cache rows of the B after it (K's by one bulk copy, the block's dims of V into
    // registers, stored after this phase's products), so their round trips overlap a whole phase
    int head = 0, g = 0, d0 = 0;
    float gw[4] = {0, 0, 0, 0};
    // kQkRope: warp 0's lane l holds q (l < 16) or the new k (l ≥ 16) elements 8·(l % 16) … + 7;
    // their norm weights and the rotary table's entries for them
    uint4 qk_w = make_uint4(0, 0, 0, 0), rope_cos = qk_w, rope_sin = qk_w;
    if (ph.kind == kAttendO) {
      attend_rows(block, grid, head, r0, r1);
      g = head / (kQHeads / kKvHeads), d0 = int(r0 - int64_t(head) * kHeadDim);
      if (kQkRope && warp == 0) {
        const int d = (lane % 16) * 8;
        qk_w = __ldg(reinterpret_cast<const uint4*>(ph.qk_norm + (lane < 16 ? 0 : kHeadDim) + d));
        rope_cos = __ldg(reinterpret_cast<const uint4*>(ph.rope + d % (kHeadDim / 2)));
        rope_sin =
            __ldg(reinterpret_cast<const uint4*>(ph.rope + kHeadDim / 2 + d % (kHeadDim / 2)));
      }
    } else {
      if (tid < kSplitThreads) bf16x4(__ldg(reinterpret_cast<const uint2*>(ph.norm_w) + tid), gw);
    }
    const bool prefetch =
        p + 1 < n_phases && (kDescriptorAhead ? ph_next.kind : phases[p + 1].kind) == kAttendO;
    unsigned short vpre[kMaxDims];  // raw bits: converted only at the store, so no wait here
    int next_dims = 0;
    if (prefetch) {
      const SplitPhase& nb = kDescriptorAhead ? ph_next : phases[p + 1];
      int nh;
      int64_t n0, n1;
      attend_rows(block, grid, nh, n0, n1);
      const int ng = nh / (kQHeads / kKvHeads), nd0 = int(n0 - int64_t(nh) * kHeadDim);
      next_dims = int(n1 - n0);
      if (tid == 0 && cache_t > 1) {
        const uint32_t bytes = uint32_t(cache_t - 1) * kHeadDim * 2;
        mbar_expect_tx(kbar, bytes);
        bulk_load(base + kOffK, nb.k_cache + size_t(ng) * cache_t * kHeadDim, bytes, kbar);
      }
      const unsigned short* vrow = reinterpret_cast<const unsigned short*>(nb.v_cache) +
                                   (size_t(ng) * cache_t + tid) * kHeadDim + nd0;
#pragma unroll
      for (int d = 0; d < kMaxDims; ++d)
        if (d < next_dims && tid < cache_t - 1) vpre[d] = __ldg(vrow + d);
    }
    if (mode != kStream && p > 0 && !tagged) {
      if (tid == 0) wait_count(counters + p - 1, target);
      sync();
    }
    trace_point(p, 0);
    if (ph.kind == kAttendO) {
      // the step's q, own k and the block's dims of its own v (one round trip), then scores by
      // position (a thread a position, pieces of its K row in a rotated order: no bank conflicts
      // within a quarter warp), softmax, and the block's dims of the output, a warp a dim
      const bf16* q = ph.in + head * kHeadDim;
      const bf16* k_new = ph.in + kQHeads * kHeadDim + g * kHeadDim;
      const bf16* v_new = k_new + kKvHeads * kHeadDim;
      if (tagged) {
        // each element says whether it is this step's: no counter was waited on
        const unsigned* tq = ph.tagged + head * kHeadDim;
        const unsigned* tk = ph.tagged + kQHeads * kHeadDim + g * kHeadDim;
        const unsigned* tv = tk + kKvHeads * kHeadDim;
        const bool wait = mode != kStream;
        float f[8];
        if (tid < 16) {
          load_tagged8(tq + tid * 8, tag, wait, backoff_ns, f);
          for (int i = 0; i < 8; ++i) qs[tid * 8 + i] = f[i];
        } else if (tid < 32) {
          load_tagged8(tk + (tid - 16) * 8, tag, wait, backoff_ns, f);
          __nv_bfloat162* kd = reinterpret_cast<__nv_bfloat162*>(
              kbuf + (cache_t - 1) * kHeadDim * 2 + (tid - 16) * 16);
          for (int i = 0; i < 4; ++i) kd[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
        } else if (tid - 32 < rows) {
          unsigned w;
          for (uint32_t tries = 0;;) {
            w = load_relaxed(tv + d0 + tid - 32);
            if (!wait || (w >> 16) == tag) break;
            poll_backoff(tries, backoff_ns);
          }
          vbuf[(tid - 32) * kMaxCache + cache_t - 1] = __uint_as_float((w & 0xffffu) << 16);
        }
      } else if (tid < 16) {
        const uint4 qv = load_cg16(q + tid * 8);
        const __nv_bfloat162* e = reinterpret_cast<const __nv_bfloat162*>(&qv);
        for (int i = 0; i < 4; ++i) {
          const float2 f = __bfloat1622float2(e[i]);
          qs[tid * 8 + 2 * i] = f.x, qs[tid * 8 + 2 * i + 1] = f.y;
        }
      } else if (tid < 32) {
        *reinterpret_cast<uint4*>(kbuf + (cache_t - 1) * kHeadDim * 2 + (tid - 16) * 16) =
            load_cg16(k_new + (tid - 16) * 8);
      } else if (tid - 32 < rows) {
        vbuf[(tid - 32) * kMaxCache + cache_t - 1] = load_cg_bf16(v_new + d0 + tid - 32);
      }
      if constexpr (kQkRope) {
        __syncwarp();
        if (warp == 0) {
          // each half warp one head vector: RMSNorm (f32, the product with the weight rounded
          // to bf16), then x·cos + rotate_half(x)·sin, each product and the sum rounded to bf16;
          // rotate_half pairs element d with d ± 64, which is lane ± 8's same slot
          float e[8], w[8], c[8], sn[8];
          unsigned char* krow = kbuf + (cache_t - 1) * kHeadDim * 2 + (lane % 16) * 16;
          if (lane < 16) {
            for (int i = 0; i < 8; ++i) e[i] = qs[lane * 8 + i];
          } else {
            bf16x8(*reinterpret_cast<const uint4*>(krow), e);
          }
          bf16x8(qk_w, w);
          bf16x8(rope_cos, c);
          bf16x8(rope_sin, sn);
          float ss = 0;
          for (int i = 0; i < 8; ++i) ss += e[i] * e[i];
          for (int o = 8; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
          const float r = rsqrtf(ss / float(kHeadDim) + kEps);
          for (int i = 0; i < 8; ++i) e[i] = bf(bf(e[i] * r) * w[i]);
          const bool low = lane % 16 < 8;  // elements 0 … 63: rotate_half gives −x[d + 64]
          float out[8];
          for (int i = 0; i < 8; ++i) {
            const float partner = __shfl_xor_sync(0xffffffffu, e[i], 8);
            out[i] = bf(bf(e[i] * c[i]) + bf((low ? -partner : partner) * sn[i]));
          }
          if (lane < 16) {
            for (int i = 0; i < 8; ++i) qs[lane * 8 + i] = out[i];
          } else {
            uint4 packed;
            __nv_bfloat162* pk = reinterpret_cast<__nv_bfloat162*>(&packed);
            for (int i = 0; i < 4; ++i) pk[i] = __floats2bfloat162_rn(out[2 * i], out[2 * i + 1]);
            *reinterpret_cast<uint4*>(krow) = packed;
            // the step's k row into the cache, by the first block of the group's first head
            if (head % (kQHeads / kKvHeads) == 0 && block == grid * head / kQHeads)
              *reinterpret_cast<uint4*>(
                  ph.k_cache + (size_t(g) * cache_t + cache_t - 1) * kHeadDim + (lane - 16) * 8) =
                  packed;
          }
        }
        // the block's dims of the step's v row into the cache (the group's blocks write theirs;
        // the two heads' blocks write the same values)
        if (tid >= 32 && tid - 32 < rows)
          ph.v_cache[(size_t(g) * cache_t + cache_t - 1) * kHeadDim + d0 + tid - 32] =
              __float2bfloat16_rn(vbuf[(tid - 32) * kMaxCache + cache_t - 1]);
      }
      if (tid == 0 && cache_t > 1) mbar_wait(kbar, uint32_t(attend_uses) & 1);
      ++attend_uses;
      sync();
      if (tid >= rows && tid < kMaxSplitRows) xc[tid] = 0.f;  // split_k reads whole slots
      attend_dims<kHeadDim, kConsumerWarps>(
          kbuf, qs, [&](int d, int t) { return vbuf[d * kMaxCache + t]; }, scores, reduce, cache_t,
          0, rsqrtf(float(kHeadDim)), rows, xc, ph.out + r0, sync);
      sync();
      trace_point(p, 1);
      split_k(rows, ph.acc_out);
    } else {
      // v: 4 elements a thread (the residual from registers, the sums of the phase before by one
      // round trip); the block's slice written out; rms_norm into x
      if (tagged && ph.acc_in != nullptr && mode != kStream && !poll_all) {
        // thread 0 waits on its own elements of every copy (all copies' loads in one round); the
        // others then read theirs, mostly once (`--poll all`: every thread polls its own)
        if (tid == 0)
          for (uint32_t tries = 0;;) {
            bool complete = true;
            for (int c0 = 0; c0 < copies; c0 += 4) {
              Acc4 part[4];
              complete = load_copies(ph.acc_in, c0, 0, part) && complete;
            }
            if (complete) break;
            poll_backoff(tries, backoff_ns);
          }
        sync();
      }
      float v[4] = {0, 0, 0, 0};  // the warps past the split threads own none
      if (tid < kSplitThreads) {
        if (ph.acc_in == nullptr) {
          bf16x4(load_cg8(ph.in + tid * 4), v);
        } else {
          float sum[4] = {0, 0, 0, 0};
          long long isum[4] = {0, 0, 0, 0};
          // four copies' loads issued before their sums (all eight at once cost 18 registers and a
          // spill); tagged, loaded again until every element holds all its contributions (thread
          // 0's poll before the barrier above makes that rare)
#pragma unroll
          for (int c0 = 0; c0 < kMaxCopies; c0 += 4) {
            if (c0 >= copies) break;
            Acc4 part[4];
            for (uint32_t tries = 0;;) {
              const bool complete = load_copies(ph.acc_in, c0, tid * 4, part);
              if (!tagged || mode == kStream || complete) break;
              poll_backoff(tries, backoff_ns);
            }
#pragma unroll
            for (int c = 0; c < 4; ++c)
              if (c0 + c < copies) add_acc4(sum, isum, part[c], acc_kind);
          }
          if (fixed)
            for (int e = 0; e < 4; ++e) sum[e] = float(double(isum[e]) * (1.0 / 4294967296.0));
          for (int e = 0; e < 4; ++e) v[e] = bf(vkeep[e] + bf(sum[e]));
        }
      }
      for (int e = 0; e < 4; ++e) vkeep[e] = v[e];
      if (ph.v_out != nullptr) {  // (no thread past the split threads owns a column)
        const int64_t own0 = row_begin(kHidden, block, grid),
                      own1 = row_begin(kHidden, block + 1, grid);
        for (int e = 0; e < 4; ++e)
          if (tid * 4 + e >= own0 && tid * 4 + e < own1)
            ph.v_out[tid * 4 + e] = __float2bfloat16_rn(v[e]);
      }
      float ss = v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3];
      for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) reduce[warp] = ss;
      sync();
      float total = 0;
      for (int w = 0; w < kConsumerWarps; ++w) total += reduce[w];
      const float r = rsqrtf(total / float(kHidden) + kEps);
      if (tid < kSplitThreads)
        for (int e = 0; e < 4; ++e) x[tid * 4 + e] = __float2bfloat16_rn(bf(v[e] * r) * gw[e]);
      sync();
      trace_point(p, 1);
      if (ph.kind == kRows) {
        bf16* out = ph.out + r0;
        unsigned* tagged_out = ph.tagged == nullptr ? nullptr : ph.tagged + r0;
        rows_product(rows, [&](int r, float y) {
          const bf16 b = __float2bfloat16_rn(y);
          out[r] = b;
          if (tagged_out != nullptr) tagged_out[r] = __bfloat16_as_ushort(b) | (tag << 16);
        });
      } else {
        rows_product(rows, [&](int r, float y) { gate[r] = y; });
        rows_product(rows, [&](int r, float y) { up[r] = y; });
        sync();
        if (tid < rows) {
          const float gg = bf(gate[tid]);
          const float sv = bf(bf(gg / (1.f + __expf(-gg))) * bf(up[tid]));
          xc[tid] = sv;
          ph.out[r0 + tid] = __float2bfloat16_rn(sv);
        } else if (tid < kMaxSplitRows) {
          xc[tid] = 0.f;  // split_k reads whole slots
        }
        sync();
        split_k(rows, ph.acc_out);
      }
    }
    if (prefetch && tid < cache_t - 1)
#pragma unroll
      for (int d = 0; d < kMaxDims; ++d)
        if (d < next_dims)
          vbuf[d * kMaxCache + tid] = __bfloat162float(__ushort_as_bfloat16(vpre[d]));
    trace_point(p, 2);
    sync();
    if (tid == 0 && !tagged) release_add(counters + p);
    trace_point(p, 3);
  }
}

// ---- host ----------------------------------------------------------------------------------
struct HostPhase {
  SplitPhase d;
  std::vector<size_t> w_off;  // into the host weight copy
  // activations (into the host activation copy; npos: none)
  size_t in = npos, resid = npos, v_out = npos, out = npos;
  size_t norm = 0, k_cache = 0, v_cache = 0;
  size_t qk_norm = npos, rope = npos;  // `--qk-norm-rope` (B): into the host weight copy
  int acc_in = -1, acc_out = -1;       // accumulator index
  static constexpr size_t npos = size_t(-1);
};

// y = M·x (M [n × k] rows) or Mᵀ·x (M [k × n] rows, `transposed`) in double, from bf16 bits
std::vector<float> host_product(const uint16_t* m, const std::vector<float>& x, int n,
                                bool transposed) {
  const int k = int(x.size());
  std::vector<double> y(n, 0.0);
  if (transposed) {
    for (int c = 0; c < k; ++c)
      for (int j = 0; j < n; ++j) y[j] += double(from_bf16(m[size_t(c) * n + j])) * x[c];
  } else {
    for (int j = 0; j < n; ++j)
      for (int c = 0; c < k; ++c) y[j] += double(from_bf16(m[size_t(j) * k + c])) * x[c];
  }
  return std::vector<float>(y.begin(), y.end());
}
std::vector<float> host_vector(const std::vector<uint16_t>& act, size_t at, int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = from_bf16(act[at + i]);
  return v;
}
std::vector<float> host_norm(const std::vector<float>& v, const uint16_t* g) {
  double ss = 0;
  for (float e : v) ss += double(e) * e;
  const float r = 1.f / std::sqrt(float(ss / v.size()) + kEps);
  std::vector<float> x(v.size());
  for (size_t i = 0; i < v.size(); ++i) x[i] = rb(rb(v[i] * r) * from_bf16(g[i]));
  return x;
}

// Qwen3's q/k RMSNorm and rotary embedding on a layer's q/k/v (bf16 bits) as B applies them with
// `--qk-norm-rope`: the norm in f32 with its product by the weight rounded to bf16, then x·cos +
// rotate_half(x)·sin with each product and the sum rounded to bf16.
std::vector<uint16_t> host_qk_norm_rope(const uint16_t* qkv, const std::vector<uint16_t>& w,
                                        const HostPhase& hp) {
  std::vector<uint16_t> out(qkv, qkv + kQkv);
  auto apply = [&](uint16_t* x, const uint16_t* weight) {
    double ss = 0;
    for (int d = 0; d < kHeadDim; ++d) ss += double(from_bf16(x[d])) * from_bf16(x[d]);
    const float r = 1.f / std::sqrt(float(ss / kHeadDim) + kEps);
    float n[kHeadDim];
    for (int d = 0; d < kHeadDim; ++d) n[d] = rb(rb(from_bf16(x[d]) * r) * from_bf16(weight[d]));
    constexpr int kHalf = kHeadDim / 2;
    for (int d = 0; d < kHeadDim; ++d) {
      const float c = from_bf16(w[hp.rope + d % kHalf]),
                  sn = from_bf16(w[hp.rope + kHalf + d % kHalf]);
      const float rot = d < kHalf ? -n[d + kHalf] : n[d - kHalf];
      x[d] = to_bf16(rb(rb(n[d] * c) + rb(rot * sn)));
    }
  };
  for (int h = 0; h < kQHeads; ++h) apply(out.data() + h * kHeadDim, w.data() + hp.qk_norm);
  for (int g = 0; g < kKvHeads; ++g)
    apply(out.data() + (kQHeads + g) * kHeadDim, w.data() + hp.qk_norm + kHeadDim);
  return out;
}

// Each phase from the device's own inputs (the activations after the poisoned step): returns
// the worst error over the tolerance and which output it was.
std::pair<double, std::string> check_step(const std::vector<HostPhase>& hps,
                                          const std::vector<uint16_t>& w,
                                          const std::vector<uint16_t>& act, int cache_t) {
  double worst = 0;
  std::string where = "-";
  auto note = [&](double e, const std::string& what) {
    if (!(e <= worst)) worst = e, where = what;
  };
  // the split-K sums the phase before this one made (h = resid + bf(product)): from the device's
  // input to that product (a or s) and its matrix
  std::vector<float> pending;  // the product the next phase's input adds, f32
  for (size_t p = 0; p < hps.size(); ++p) {
    const HostPhase& hp = hps[p];
    const SplitPhase& ph = hp.d;
    const std::string name =
        "phase " + std::to_string(p) + " (layer " + std::to_string(p / 3) + ")";
    if (ph.kind == kAttendO) {
      std::vector<float> want(kQHeads * kHeadDim);
      const std::vector<uint16_t> qkv =
          hp.qk_norm == HostPhase::npos
              ? std::vector<uint16_t>(act.begin() + hp.in, act.begin() + hp.in + kQkv)
              : host_qk_norm_rope(act.data() + hp.in, w, hp);
      for (int h = 0; h < kQHeads; ++h) {
        const std::vector<float> o =
            host_attend_head(qkv.data(), w.data() + hp.k_cache, w.data() + hp.v_cache, cache_t, h);
        std::copy(o.begin(), o.end(), want.begin() + h * kHeadDim);
      }
      note(worst_over_tolerance(want, act.data() + hp.out), name + " a");
      pending = host_product(w.data() + hp.w_off[0], host_vector(act, hp.out, kQHeads * kHeadDim),
                             kHidden, true);
      continue;
    }
    // v: the device's own inputs to it
    std::vector<float> v;
    if (hp.acc_in < 0) {
      v = host_vector(act, hp.in, kHidden);
    } else {
      const std::vector<float> resid = host_vector(act, hp.resid, kHidden);
      std::vector<float> want(kHidden);
      for (int j = 0; j < kHidden; ++j) want[j] = resid[j] + rb(pending[j]);
      note(worst_over_tolerance(want, act.data() + hp.v_out), name + " v");
      v = host_vector(act, hp.v_out, kHidden);
    }
    const std::vector<float> x = host_norm(v, w.data() + hp.norm);
    if (ph.kind == kRows) {
      note(worst_over_tolerance(host_product(w.data() + hp.w_off[0], x, ph.n, false),
                                act.data() + hp.out),
           name + " out");
    } else {
      const std::vector<float> g = host_product(w.data() + hp.w_off[0], x, ph.n, false);
      const std::vector<float> u = host_product(w.data() + hp.w_off[1], x, ph.n, false);
      std::vector<float> s(ph.n);
      for (int j = 0; j < ph.n; ++j) {
        const float gg = rb(g[j]);
        s[j] = rb(gg / (1.f + std::exp(-gg))) * rb(u[j]);
      }
      note(worst_over_tolerance(s, act.data() + hp.out), name + " s");
      pending = host_product(w.data() + hp.w_off[2], host_vector(act, hp.out, ph.n), kHidden, true);
    }
  }
  return {worst, where};
}

// `--qk-norm-rope`: the step's k (normed, rotated) and v rows B wrote into every layer's cache,
// read back from the device, against the host's from the device's own q/k/v.
std::pair<double, std::string> check_cache_rows(const std::vector<HostPhase>& hps,
                                                const std::vector<uint16_t>& w,
                                                const std::vector<uint16_t>& act, const bf16* d_w,
                                                int cache_t) {
  double worst = 0;
  std::string where = "-";
  for (size_t p = 0; p < hps.size(); ++p) {
    const HostPhase& hp = hps[p];
    if (hp.d.kind != kAttendO) continue;
    const std::vector<uint16_t> qkv = host_qk_norm_rope(act.data() + hp.in, w, hp);
    for (int g = 0; g < kKvHeads; ++g) {
      const size_t row = (size_t(g) * cache_t + cache_t - 1) * kHeadDim;
      for (int part = 0; part < 2; ++part) {  // k, then v
        std::vector<uint16_t> got(kHeadDim);
        CK(cudaMemcpy(got.data(), d_w + (part == 0 ? hp.k_cache : hp.v_cache) + row, kHeadDim * 2,
                      cudaMemcpyDeviceToHost));
        const uint16_t* want_bits = qkv.data() + (kQHeads + part * kKvHeads + g) * kHeadDim;
        std::vector<float> want(kHeadDim);
        for (int d = 0; d < kHeadDim; ++d) want[d] = from_bf16(want_bits[d]);
        const double e = worst_over_tolerance(want, got.data());
        if (!(e <= worst))
          worst = e, where = "layer " + std::to_string(p / 3) + " cache " +
                             (part == 0 ? "k" : "v") + " row, kv head " + std::to_string(g);
      }
    }
  }
  return {worst, where};
}

// The traced step, per traced block and phase kind: the sums over its phases of the counter wait
// (previous phase's release to this one's acquire), the input (v or attention), the products and
// the release, in µs.
nlohmann::json summarize_trace(const std::vector<unsigned long long>& tr,
                               const std::vector<HostPhase>& hps) {
  const char* kinds[4] = {"qkv", "attend+o", "mlp", "lm_head"};
  const int n_phases = int(hps.size());
  nlohmann::json out = nlohmann::json::array();
  for (int b = 0; b < kTraceBlocks; ++b) {
    auto at = [&](int p, int point) {
      return double(tr[(size_t(b) * n_phases + p) * kTracePoints + point]) * 1e-3;
    };
    double sums[4][4] = {};
    int counts[4] = {};
    for (int p = 0; p < n_phases; ++p) {
      const int kind = p == n_phases - 1 ? 3 : hps[p].d.kind;
      sums[kind][0] += p > 0 ? at(p, 0) - at(p - 1, 3) : 0;
      sums[kind][1] += at(p, 1) - at(p, 0);
      sums[kind][2] += at(p, 2) - at(p, 1);
      sums[kind][3] += at(p, 3) - at(p, 2);
      ++counts[kind];
    }
    for (int k = 0; k < 4; ++k)
      out.push_back({{"block", b == 0 ? "0" : "grid/2"},
                     {"kind", kinds[k]},
                     {"phases", counts[k]},
                     {"wait_us", sums[k][0]},
                     {"input_us", sums[k][1]},
                     {"products_us", sums[k][2]},
                     {"release_us", sums[k][3]}});
    out.push_back({{"block", b == 0 ? "0" : "grid/2"},
                   {"kind", "span"},
                   {"span_us", at(n_phases - 1, 3) - at(0, 0)}});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path;
  int steps = 20, cache_t = 80, slots = kMaxSlots, copies = 4, l2_lead = 0, warps = 8;
  int acc_kind = kAccF32;
  bool bulk = false, poll_all = false;
  int backoff_ns = 0;
  bool descriptor_ahead = false, weight_evict_first = false, qk_rope = false;
  int inflight = 0;
  std::string only;  // one mode by name (a profiler's run), else all
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::atoi(argv[++i]) : -1; };
    // `--name VALUE` with VALUE one of `values`: its index (the value consumed), else -1
    auto choice = [&](const char* name, std::initializer_list<const char*> values) {
      if (a != name || i + 1 >= argc) return -1;
      int k = 0;
      for (const char* v : values) {
        if (std::string(argv[i + 1]) == v) return ++i, k;
        ++k;
      }
      return -1;
    };
    int pick = -1;
    if (a == "--out" && i + 1 < argc)
      out_path = argv[++i];
    else if (a == "--steps")
      steps = next();
    else if (a == "--cache")
      cache_t = next();
    else if (a == "--slots")
      slots = next();
    else if (a == "--copies")
      copies = next();
    else if (a == "--l2-lead")
      l2_lead = next();
    else if (a == "--warps")
      warps = next();
    else if (a == "--only" && i + 1 < argc)
      only = argv[++i];
    else if ((pick = choice("--accumulate", {"f32", "i64", "tagged"})) >= 0)
      acc_kind = pick;  // kAccF32, kAccI64, kAccTagged
    else if ((pick = choice("--reduce", {"red", "bulk"})) >= 0)
      bulk = pick == 1;
    else if ((pick = choice("--poll", {"one", "all"})) >= 0)
      poll_all = pick == 1;
    else if ((pick = choice("--descriptor", {"inline", "ahead"})) >= 0)
      descriptor_ahead = pick == 1;
    else if ((pick = choice("--weight-hint", {"none", "evict-first"})) >= 0)
      weight_evict_first = pick == 1;
    else if (a == "--qk-norm-rope")
      qk_rope = true;
    else if (a == "--inflight")
      inflight = next();
    else if (a == "--backoff")
      backoff_ns = next();
    else {
      std::fprintf(stderr,
                   "usage: hk_bench_split_step [--out FILE.json] [--steps N] [--cache T] "
                   "[--slots S] [--copies C] [--accumulate f32|i64|tagged] [--reduce red|bulk] "
                   "[--poll one|all] [--backoff NS] [--descriptor inline|ahead] [--inflight K] "
                   "[--weight-hint none|evict-first] [--qk-norm-rope] "
                   "[--l2-lead N] [--warps 8|12|16] [--only MODE]\n");
      return 1;
    }
  }
  if (steps < 1 || cache_t < 1 || slots < 2 || slots > kMaxSlots || copies < 1 ||
      copies > kMaxCopies || l2_lead < 0 || (warps != 8 && warps != 12 && warps != 16) ||
      backoff_ns < 0 || backoff_ns > 100000 || inflight < 0) {
    std::fprintf(stderr,
                 "hk_bench_split_step: --steps ≥ 1, --cache ≥ 1, --slots 2..%d, --copies 1..%d, "
                 "--l2-lead ≥ 0, --warps 8, 12 or 16, --backoff 0..100000, --inflight ≥ 0\n",
                 kMaxSlots, kMaxCopies);
    return 1;
  }
  if (!only.empty() && std::find_if(kModeNames, kModeNames + kModes, [&](const char* m) {
                         return only == m;
                       }) == kModeNames + kModes) {
    std::fprintf(stderr,
                 "hk_bench_split_step: --only takes persistent, stream, chain or resident, not "
                 "'%s'\n",
                 only.c_str());
    return 1;
  }
  cudaDeviceProp prop{};
  const int grid = sm90_grid("hk_bench_split_step", prop);
  if (cache_t > kMaxCache) {
    std::fprintf(stderr, "hk_bench_split_step: --cache ≤ %d\n", kMaxCache);
    return 1;
  }
  if (acc_kind == kAccTagged && (grid + copies - 1) / copies > kMaxTagCount) {
    std::fprintf(stderr,
                 "hk_bench_split_step: --accumulate tagged counts ≤ %d contributions a copy; "
                 "%d blocks need --copies ≥ %d\n",
                 kMaxTagCount, grid, (grid + kMaxTagCount - 1) / kMaxTagCount);
    return 1;
  }
  if ((kInter + grid - 1) / grid > kMaxSplitRows || grid < kQHeads * 8) {
    std::fprintf(stderr, "hk_bench_split_step: %d SMs is too few for this shape\n", grid);
    return 1;
  }

  HostArena arena;
  std::vector<uint16_t>& w = arena.w;
  // [rows × kHidden] (W_o and W_down transposed: their contracted length is the rows')
  auto matrix = [&](int rows, int contracted) { return arena.matrix(rows, kHidden, contracted); };
  std::vector<HostPhase> hps;
  const size_t h0 = arena.activation(kHidden);
  size_t h = h0, hp_prev = HostPhase::npos;
  int acc_down_prev = -1, n_acc = 0;
  // `--qk-norm-rope`: the rotary table of the step's position (cache_t − 1) as Transformers builds
  // it for Qwen3 (θ = 10⁶; inverse frequencies, angles and cos/sin in f32, cast to bf16)
  size_t rope_table = HostPhase::npos;
  if (qk_rope) {
    rope_table = arena.weight(kHeadDim, 0.f, 0.f);
    for (int j = 0; j < kHeadDim / 2; ++j) {
      const float inv_freq = 1.f / std::pow(1e6f, float(2 * j) / float(kHeadDim));
      const float angle = float(cache_t - 1) * inv_freq;
      w[rope_table + j] = to_bf16(float(std::cos(double(angle))));
      w[rope_table + kHeadDim / 2 + j] = to_bf16(float(std::sin(double(angle))));
    }
  }
  for (int l = 0; l < kLayers; ++l) {
    const size_t w_qkv = matrix(kQkv, kHidden),
                 w_ot = matrix(kQHeads * kHeadDim, kQHeads * kHeadDim);
    const size_t w_gate = matrix(kInter, kHidden), w_up = matrix(kInter, kHidden);
    const size_t w_downt = matrix(kInter, kInter);
    const size_t n_in = arena.norm_weight(), n_post = arena.norm_weight();
    const size_t kc = arena.weight(size_t(kKvHeads) * cache_t * kHeadDim, 1.f, 0);
    const size_t vc = arena.weight(size_t(kKvHeads) * cache_t * kHeadDim, 1.f, 0);
    HostPhase a{}, b{}, c{};
    a.d.kind = kRows, a.d.n = kQkv, a.d.segments = 1, a.w_off = {w_qkv}, a.norm = n_in;
    if (l == 0) {
      a.in = h0;
    } else {
      a.resid = hp_prev, a.acc_in = acc_down_prev;
      a.v_out = h = arena.activation(kHidden);
    }
    a.out = arena.activation(kQkv);
    b.d.kind = kAttendO, b.d.n = kQHeads * kHeadDim, b.d.segments = 1, b.w_off = {w_ot};
    b.in = a.out, b.out = arena.activation(kQHeads * kHeadDim), b.acc_out = n_acc++;
    b.k_cache = kc, b.v_cache = vc;
    if (qk_rope) b.qk_norm = arena.weight(2 * kHeadDim, 0.1f, 1.f), b.rope = rope_table;
    c.d.kind = kMlp, c.d.n = kInter, c.d.segments = 3, c.w_off = {w_gate, w_up, w_downt};
    c.norm = n_post, c.resid = h, c.acc_in = b.acc_out;
    c.v_out = arena.activation(kHidden), c.out = arena.activation(kInter), c.acc_out = n_acc++;
    hps.push_back(a), hps.push_back(b), hps.push_back(c);
    hp_prev = c.v_out, acc_down_prev = c.acc_out;
  }
  {
    HostPhase lm{};
    const size_t w_lm = matrix(kVocab, kHidden);
    lm.d.kind = kRows, lm.d.n = kVocab, lm.d.segments = 1, lm.w_off = {w_lm};
    lm.norm = arena.norm_weight(), lm.resid = hp_prev, lm.acc_in = acc_down_prev;
    lm.v_out = arena.activation(kHidden), lm.out = arena.activation(kVocab);
    hps.push_back(lm);
  }
  std::vector<uint16_t> act(arena.act_total, 0);
  {
    Rng rng{12345};
    for (int i = 0; i < kHidden; ++i) act[h0 + i] = to_bf16(rng.uniform() * 1.7f);
  }
  size_t weight_bytes = 0;  // the bytes a step streams: the weights, without caches and norms
  for (const HostPhase& p : hps) weight_bytes += size_t(p.d.segments) * p.d.n * kRowBytes;

  bf16 *d_w = nullptr, *d_act = nullptr;
  CK(cudaMalloc(&d_w, w.size() * 2));
  CK(cudaMalloc(&d_act, act.size() * 2));
  CK(cudaMemcpy(d_w, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_act, act.data(), act.size() * 2, cudaMemcpyHostToDevice));
  const int64_t acc_half = int64_t(n_acc) * copies * kHidden;  // elements a parity
  const bool fixed = acc_kind != kAccF32;
  const size_t acc_bytes = fixed ? 8 : 4;
  const char* acc_name = acc_kind == kAccF32 ? "f32" : acc_kind == kAccI64 ? "i64" : "tagged i64";
  char* d_acc = nullptr;
  CK(cudaMalloc(&d_acc, size_t(acc_half) * 2 * acc_bytes));
  auto act_ptr = [&](size_t at) { return at == HostPhase::npos ? nullptr : d_act + at; };
  auto acc_ptr = [&](int i) {
    return i < 0 ? nullptr : d_acc + int64_t(i) * copies * kHidden * int64_t(acc_bytes);
  };
  // tagged q/k/v, a buffer a layer (each A writes it, the B after it reads it)
  unsigned* d_tagged = nullptr;
  CK(cudaMalloc(&d_tagged, size_t(kLayers) * kQkv * sizeof(unsigned)));
  CK(cudaMemset(d_tagged, 0, size_t(kLayers) * kQkv * sizeof(unsigned)));
  std::vector<SplitPhase> phases;
  for (const HostPhase& p : hps) {
    SplitPhase d = p.d;
    const size_t layer = phases.size() / 3;
    const bool qkv_or_attend = layer < size_t(kLayers) && phases.size() % 3 < 2;
    d.tagged = acc_kind == kAccTagged && qkv_or_attend ? d_tagged + layer * kQkv : nullptr;
    for (int s = 0; s < d.segments; ++s) d.w[s] = d_w + p.w_off[s];
    d.in = act_ptr(p.in), d.v_out = act_ptr(p.v_out);
    d.out = act_ptr(p.out);
    d.acc_in = acc_ptr(p.acc_in), d.acc_out = acc_ptr(p.acc_out);
    d.norm_w = d.kind == kAttendO ? nullptr : d_w + p.norm;
    d.k_cache = d.kind == kAttendO ? d_w + p.k_cache : nullptr;
    d.v_cache = d.kind == kAttendO ? d_w + p.v_cache : nullptr;
    d.qk_norm = p.qk_norm == HostPhase::npos ? nullptr : d_w + p.qk_norm;
    d.rope = p.rope == HostPhase::npos ? nullptr : d_w + p.rope;
    phases.push_back(d);
  }
  const int n_phases = int(phases.size());
  SplitPhase* d_phases = nullptr;
  unsigned* d_counters = nullptr;
  CK(cudaMalloc(&d_phases, phases.size() * sizeof(SplitPhase)));
  CK(cudaMemcpy(d_phases, phases.data(), phases.size() * sizeof(SplitPhase),
                cudaMemcpyHostToDevice));
  CK(cudaMalloc(&d_counters, n_phases * sizeof(unsigned)));
  const size_t trace_words = size_t(kTraceBlocks) * n_phases * kTracePoints;
  unsigned long long* d_trace = nullptr;
  CK(cudaMalloc(&d_trace, trace_words * sizeof(unsigned long long)));
  // the kernel of `warps` consumer warps, and its block size
  // the instantiations: every accumulator and reduction form at 8 warps (f32 by vector reductions
  // and tagged by bulk ones also with the descriptor loaded ahead), f32 by vector reductions at 12
  // and 16
  const void* kernel = nullptr;
  if (warps == 8) {
    const void* k8[3][2][2] = {
        {{reinterpret_cast<const void*>(split_step_kernel<8, kAccF32, false, false>),
          reinterpret_cast<const void*>(split_step_kernel<8, kAccF32, false, true>)},
         {reinterpret_cast<const void*>(split_step_kernel<8, kAccF32, true, false>), nullptr}},
        {{reinterpret_cast<const void*>(split_step_kernel<8, kAccI64, false, false>), nullptr},
         {reinterpret_cast<const void*>(split_step_kernel<8, kAccI64, true, false>), nullptr}},
        {{reinterpret_cast<const void*>(split_step_kernel<8, kAccTagged, false, false>), nullptr},
         {reinterpret_cast<const void*>(split_step_kernel<8, kAccTagged, true, false>),
          reinterpret_cast<const void*>(split_step_kernel<8, kAccTagged, true, true>)}}};
    kernel = k8[acc_kind][bulk ? 1 : 0][descriptor_ahead ? 1 : 0];
    if (qk_rope)
      kernel =
          acc_kind != kAccF32 || bulk ? nullptr
          : descriptor_ahead
              ? reinterpret_cast<const void*>(split_step_kernel<8, kAccF32, false, true, true>)
              : reinterpret_cast<const void*>(split_step_kernel<8, kAccF32, false, false, true>);
  } else if (acc_kind == kAccF32 && !bulk && !descriptor_ahead && !qk_rope) {
    kernel = warps == 12
                 ? reinterpret_cast<const void*>(split_step_kernel<12, kAccF32, false, false>)
                 : reinterpret_cast<const void*>(split_step_kernel<16, kAccF32, false, false>);
  }
  if (kernel == nullptr) {
    std::fprintf(stderr,
                 "hk_bench_split_step: this combination is not built: --descriptor ahead is built "
                 "for 8 warps with --accumulate f32 --reduce red or --accumulate tagged --reduce "
                 "bulk, --qk-norm-rope for 8 warps with --accumulate f32 --reduce red, --warps 12 "
                 "and 16 for --accumulate f32 --reduce red only\n");
    return 1;
  }
  const int threads = warps * 32 + 32;
  fit_one_block_an_sm(kernel, threads, kSmem, "hk_bench_split_step");
  const double copy_gbs = copy_bandwidth_gbs();

  nlohmann::json modes = nlohmann::json::array();
  std::printf(
      "split-K decode step probe (%s, %d blocks of %d consumer warps, %d slots of 16 KB, L2 lead "
      "%d chunks, %d %s accumulator copies, cache %d, %.3f GB of weights a step, copy bandwidth "
      "%.0f GB/s -> %.1f us floor)\n",
      prop.name, grid, warps, slots, l2_lead, copies, acc_name, cache_t, weight_bytes / 1e9,
      copy_gbs, weight_bytes / copy_gbs * 1e-3);
  bool ok = true;
  for (int mode = 0; mode < kModes; ++mode) {
    if (!only.empty() && only != kModeNames[mode]) continue;
    const bool checked = mode == kPersistent;
    CK(cudaMemset(d_counters, 0, n_phases * sizeof(unsigned)));
    CK(cudaMemset(d_acc, 0, size_t(acc_half) * 2 * acc_bytes));
    CK(cudaMemcpy(d_act, act.data(), act.size() * 2, cudaMemcpyHostToDevice));
    unsigned epoch = 0;
    auto launch = [&](unsigned long long* trace) {
      int m = mode, sl = slots, ll = l2_lead, ct = cache_t, np = n_phases, cp = copies;
      bool pa = poll_all;
      int bo = backoff_ns, inf = inflight;
      bool ef = weight_evict_first;
      int64_t half = acc_half;
      void* args[] = {&d_phases, &np, &d_counters, &epoch, &m,  &sl,    &ll,   &ct,
                      &cp,       &pa, &bo,         &inf,   &ef, &d_acc, &half, &trace};
      CK(cudaLaunchCooperativeKernel(kernel, dim3(grid), dim3(threads), args, kSmem, nullptr));
      ++epoch;
    };
    const ModeTiming timing = time_mode(steps, d_trace, trace_words, launch);
    const nlohmann::json phase_trace = summarize_trace(timing.trace, hps);
    const double med = timing.median_us, best = timing.best_us;
    std::pair<double, std::string> worst{0.0, "-"};
    if (checked) {
      const std::vector<uint16_t> after = poisoned_step(act, h0, d_act, [&] { launch(nullptr); });
      worst = check_step(hps, w, after, cache_t);
      if (qk_rope) {
        const std::pair<double, std::string> rows = check_cache_rows(hps, w, after, d_w, cache_t);
        if (!(rows.first <= worst.first)) worst = rows;
      }
      if (!(worst.first <= 1.0)) ok = false;
    }
    std::printf(
        "%-11s step %8.1f us median (best %.1f)  %6.0f tok/s  %5.1f %% of the weights' copy "
        "time  %s\n",
        kModeNames[mode], med, best, 1e6 / med, weight_bytes / copy_gbs * 1e-3 / med * 100,
        !checked             ? "(not checked)"
        : worst.first <= 1.0 ? "checked"
                             : "CHECK FAILED");
    if (checked && !(worst.first <= 1.0))
      std::printf("  worst: %s, %.2f x the tolerance\n", worst.second.c_str(), worst.first);
    for (const nlohmann::json& t : phase_trace) {
      if (t["kind"] == "span") {
        std::printf("  block %s span %.0f us\n", t["block"].get<std::string>().c_str(),
                    t["span_us"].get<double>());
        continue;
      }
      std::printf(
          "  block %-6s %-8s x%-2d wait %6.1f  input %6.1f  products %6.1f  release %5.1f us\n",
          t["block"].get<std::string>().c_str(), t["kind"].get<std::string>().c_str(),
          t["phases"].get<int>(), t["wait_us"].get<double>(), t["input_us"].get<double>(),
          t["products_us"].get<double>(), t["release_us"].get<double>());
    }
    nlohmann::json record =
        mode_record(kModeNames[mode], timing, weight_bytes / copy_gbs * 1e-3, checked);
    record["worst_error_over_tolerance"] = worst.first;
    record["worst_where"] = worst.second;
    record["phase_trace"] = phase_trace;
    modes.push_back(record);
  }
  if (!out_path.empty()) {
    nlohmann::json j = {
        {"gpu", prop.name},
        {"blocks", grid},
        {"slots", slots},
        {"consumer_warps", warps},
        {"slot_bytes", kSlotBytes},
        {"l2_lead_chunks", l2_lead},
        {"accumulator_copies", copies},
        {"accumulate", acc_kind == kAccF32   ? "f32"
                       : acc_kind == kAccI64 ? "i64 (fixed point, 2^-32)"
                                             : "tagged i64 (fixed point, 2^-32, "
                                               "contribution count in the top "
                                               "6 bits; no counters)"},
        {"split_k_reduce",
         bulk ? "bulk (one TMA reduction a block)" : "red (vector reductions a thread)"},
        {"tagged_poll",
         poll_all ? "every thread polls its own elements" : "thread 0 polls, then a barrier"},
        {"tagged_poll_backoff_ns", backoff_ns},
        {"max_chunks_in_flight", inflight},
        {"weight_l2_hint", weight_evict_first ? "evict_first" : "none"},
        {"qk_norm_rope_cache_write", qk_rope},
        {"descriptor", descriptor_ahead ? "loaded a phase ahead" : "loaded at the phase's head"},
        {"cache_positions", cache_t},
        {"phases", n_phases},
        {"weight_bytes", weight_bytes},
        {"copy_gbs", copy_gbs},
        {"steps_timed", steps},
        {"modes", modes}};
    std::ofstream(out_path) << j.dump(1) << "\n";
  }
  return ok ? 0 : 1;
}
