// The batch-1 decode step in one cooperative launch (decode_kernels.h, "the whole step in one
// launch"): hk_bench_split_step's design (bench/ops, thirty-first and thirty-second sessions)
// brought to a real model's step — the embedding row, q/k RMSNorm, rotary, the cache write, the
// attention over the cache with device lengths, lm_head and the greedy pick or the sampling
// logits, with the generation bookkeeping.
//
// One block an SM: a producer warp streams every weight the block needs, in the order the block
// uses them, through a ring of 16 KB slots (one-dimensional bulk copies of 8 rows of 1024), with at
// most one copy outstanding during the layers (the synchronisation traffic then does not queue
// behind the weight stream: 646 → 573 µs a step in the probe on an H100); eight consumer warps
// take the products. A layer is three phases:
//   A  v = the residual + the down sums, x = rms_norm(v)·w_in, the block's rows of q/k/v (x·W_qkv
//      on the tensor cores);
//   B  the block's q head: q/k RMSNorm + rotary (warp 0), the step's k/v rows into the cache, the
//      scores over the cache (the head's K rows fetched into shared memory during A) and the
//      block's output dims, times its rows of W_oᵀ, added into the o accumulator (split-K);
//   C  v = the residual + the o sums, rms_norm, the block's rows of gate and up, SwiGLU, times its
//      rows of W_downᵀ into the down accumulator;
// then lm_head (the block's vocabulary rows) and the pick: each block's best (value, then lowest
// index, over bf16-rounded logits as the kernel sequence's argmax sees them), the last block to
// finish reduces them, writes the token, marks eos and advances positions and lengths.
//
// Accumulators: `deterministic` (default) keeps each element as fixed point in units of 2^-32 with
// its count of contributions in the top bits, added by one TMA bulk reduction a block; a reader
// waits until every block has passed the phase (a counter), then reads the elements until every
// one holds all its contributions (the integer sums do not depend on the order blocks arrive:
// graph replays decode the ids of eager steps). Two copies of each (block b adds into copy b % 2;
// a reader sums both). The other form adds f32 by vector reductions into four copies and waits on
// the counter alone. Two parity sets (a step zeroes the set the next step uses). The step number
// lives on the device (graph replays cannot change arguments): the last block advances it.
//
// Rounding as the kernel sequence (ops): each product to bf16, the residual sum to bf16, the norm
// output to bf16 before the weight and after, silu and the gate/up product each to bf16, rotary in
// f32 from the normed q/k rounded once, attention in f32 (flash/sdpa form) rounded once. Only the
// order of f32 sums differs.
//
// Not here: batch > 1, other hidden sizes or head dims, caches over 256 positions, eager attention
// semantics, biases (decode_step.cc plans the kernel sequence for those).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <mutex>
#include <vector>

#include "hk/error.h"
#include "hk/kernel_sdk_sm90.cuh"
#include "ops/decode/decode_common.cuh"
#include "ops/decode/persistent_step_device.cuh"

namespace hk::decode {
namespace {
using namespace detail;
using namespace persistent;

constexpr int kHidden = 1024, kHeadDim = 128;
constexpr int kConsumerWarps = 8, kConsumers = kConsumerWarps * 32, kThreads = kConsumers + 32;
static_assert(kConsumers * 4 == kHidden, "a consumer thread owns 4 of the hidden columns");
constexpr int kRowBytes = kHidden * 2, kRowsPerSlot = 8, kSlotBytes = kRowsPerSlot * kRowBytes;
constexpr int kMaxSlots = 10, kMinSlots = 4;
// the most copies of a split-K sum (the f32 form uses all four; the deterministic StepArgs::copies,
// kDefaultCopies unless HK_DECODE_PERSISTENT_COPIES says)
constexpr int kCopies = 4, kDefaultCopies = 2;  // (HK_DECODE_PERSISTENT_COPIES counts from 2)
// Whether `copies` deterministic copies keep each element's contributions countable on `grid` SMs
constexpr bool copies_fit(int grid, int copies) {
  return (grid + copies - 1) / copies <= persistent::kMaxTagCountWide;
}
constexpr int kMaxCache = 256;     // positions a block holds in shared memory (a thread each)
constexpr int kMaxSplitRows = 64;  // a block's rows in B and C
constexpr int kMaxDims = 16;       // B's output dims a block (≥ 8 blocks a head)
static_assert(kMaxCache <= kConsumers, "a consumer thread fetches one cache position");
constexpr int kMaxSmem = 227 * 1024;

enum Kind : int { kQkv = 0, kAttendO = 1, kMlp = 2, kHead = 3 };
// StepArgs::products and ::poll, in env_choice's order of their names
enum Products : int { kProductsSliced = 0, kProductsPairs = 1, kProductsBatched = 2 };
enum Poll : int { kPollCounted = 0, kPollIncomplete = 1, kPollAll = 2, kPollSleep = 3 };

struct Phase {
  int kind = 0, n = 0, segments = 0;  // n rows in each of `segments` streamed matrices [n × 1024]
  const bf16* w[3] = {nullptr, nullptr, nullptr};
  const bf16* norm_w = nullptr;  // A, C and the head
  const void* acc_in = nullptr;  // the sums this phase's v adds (null: the embedding row)
  void* acc_out = nullptr;       // B, C
  bf16* qkv = nullptr;           // f32 form: A writes q/k/v, B reads them
  unsigned* tagged = nullptr;    // deterministic form: q/k/v as (bf16, step tag) words
  bf16* k_cache = nullptr;       // B
  bf16* v_cache = nullptr;
  const bf16* q_norm = nullptr;  // B, or null (no q/k norm)
  const bf16* k_norm = nullptr;
};

struct StepArgs {
  const Phase* phases;
  int n_phases, slots, ring_offset, inflight, l2_lead;
  // Switches (env_switch; docs/generation.md). The next three are on by default since the
  // thirty-sixth session (H200, 16 + 128, with the K rows by cp.async from every thread: 1,781
  // tok/s against 1,652–1,657 with none of the three); their old forms stay for measuring:
  // RING=length (=bucket: the old form) — the ring starts after this step's K rows, not the
  // bucket's, in all the shared memory a block may have (10 slots rather than 8 at 16 + 128);
  int ring_by_length;
  int smem_bytes;  // the launch's dynamic shared memory
  // PRODUCTS=sliced (=pairs) — the q/k/v and gate/up products a 128-column slice a warp of every
  // pair of chunks (chains of 4 MMAs, not 32), the 8 partials then summed in warp order;
  // =batched as sliced, two pairs taken together — gate's and up's where the ring holds both,
  // q/k/v's first two chunks' and the next two — four MMA chains a warp, not two (the same bits;
  // −0.5 % to +0.6 % on an H100, thirty-seventh session);
  int products;
  // K_LAYOUT=swizzled (=rotated) — the K rows swizzled (k_piece), q read as broadcasts;
  int k_swizzled;
  // STAGING=lazy (default eager; measured 1 % slower) — a phase's bulk reduction's read of its
  // staging buffer waited for at the next phase's start, not before the closing barrier.
  int lazy_staging;
  // POLL=counted (default since the thirty-seventh session: 1,792–1,793 tok/s against 1,649–1,652
  // on an H100, alternated) — thread 0 first waits until every block has passed the phase before
  // (its counter, which blocks add to relaxed: the tags say when a copy is complete), then the
  // copies are read until each is complete (about once), not polled by 132 blocks × 32 KB a round
  // while the sums land; =incomplete (the thirty-sixth session's) polls at once, a copy once
  // complete not read again; =all reads them all every round; =sleep as incomplete, 64 ns between
  // rounds. How A and C wait for the sums (the count read by acquire loads; relaxed ones measured
  // the same).
  int poll;
  // COPIES=2|3|4 (deterministic form; 2 the default since the thirty-seventh session: 1,846–1,848
  // tok/s against 1,835 with 3 and 1,794–1,797 with 4 on an H100, alternated, the same bits) — the
  // split-K sums' copies: fewer are less for 132 blocks to read after each split-K (16 KB a block
  // rather than 32), more contributions landing on each element (66, the count in 7 bits,
  // tag_format)
  int copies;
  // COUNT=early (default) — a split-K phase's block adds to its counter as soon as its bulk
  // reduction is issued (=late: after the staging's read and the closing barrier); and
  // KV_ISSUE=with-reads (default) — A issues the next B's K/V copies right behind its first round
  // of loads of the sums, their ~0.4 µs of issue then overlapping the loads' round trip
  // (=after-norm: between its norm and its products). The same bits; on an H100, alternated over
  // three rounds, both 1,845–1,855 tok/s against 1,825–1,835 with neither, with-reads alone
  // 1,838–1,847 over five, early alone 1,832–1,838 over two (thirty-seventh session).
  int count_early;
  int kv_with_reads;
  // COUNT_SLACK=N (default 0; not yet measured) — A and C start reading the sums once all but N
  // blocks have passed the phase before, so the read's round trip overlaps the last arrivals (the
  // tags still say when a copy is complete; an incomplete one is read again)
  int count_slack;
  // B_WAIT=counted (default polled; not yet measured) — B reads its q/k/v words once thread 0 has
  // seen the q/k/v phase's count (less COUNT_SLACK), rather than 48 threads polling them while A's
  // rows are stored (its inputs come from ~12 blocks, so the count may wait on others)
  int b_counted;
  // HK_DECODE_PERSISTENT_WEIGHTS=resident (the profile build only) — no weight is copied: the
  // producer marks each chunk landed at once and the products read a zeroed ring, so the profile
  // times the step's chain alone (the tokens are wrong)
  int resident_weights;
  unsigned* counters;  // [n_phases]: blocks past each phase, all steps
  unsigned* epoch;     // steps done
  unsigned* finish;    // blocks finished, all steps
  unsigned long long* best;
  char* acc;
  int64_t acc_half;  // elements a parity set
  int heads_q, heads_kv, capacity;
  float eps, qk_eps, scale, theta, rope_scaling;
  const float* inv_freq;
  const bf16* embed;
  int vocab;
  int64_t* tokens;
  int32_t *positions, *lengths;
  const int32_t* key_start;
  int32_t* done;
  const int64_t* eos;
  int num_eos;
  int64_t pad;
  float* logits_f32;
  unsigned long long* profile;  // profile build: [grid][n_phases][kPhaseMarks], [grid][kBlockMarks]
};

// The profile build's marks, thread 0's clock64 cycles summed over steps. A phase's, from its
// start: its inputs ready, the chunk waits (a duration), ready to multiply, the first and the last
// warp done with its products, the phase's end (after the block's barrier).
// In B and C also: the split-K product's start and its chunks done (before the staging and the
// reduction).
enum PhaseMark : int {
  kInputs,
  kChunks,
  kReady,
  kFirstDone,
  kLastDone,
  kEnd,
  kSplitStart,
  kSplitChunks,
  // A and C's sliced products (thread 0's clocks): A — warp 0's own slices done, all warps' (the
  // barrier), the rows stored; C — warp 0's gate slices, its up slices, all warps' (the barrier)
  kStage1,
  kStage2,
  kStage3,
  kPhaseMarks
};
// A block's: launch → first phase, last phase → exit (the last block: the pick), and the whole
// block in cycles and in %globaltimer ns (the clock the cycles ran at).
enum BlockMark : int { kPrologue, kEpilogue, kBlockCycles, kBlockNs, kBlockMarks };
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- shared memory: fixed regions, then the K rows (capacity), then the ring ----------------
constexpr int kOffX = 0;                                      // the phase's normed x, bf16
constexpr int kOffXc = kOffX + kHidden * 2;                   // split-K inputs, f32
constexpr int kOffGate = kOffXc + kMaxSplitRows * 4;          // f32
constexpr int kOffUp = kOffGate + kMaxSplitRows * 4;          // f32
constexpr int kOffQ = kOffUp + kMaxSplitRows * 4;             // q, f32
constexpr int kOffScores = kOffQ + kHeadDim * 4;              // f32
constexpr int kOffReduce = kOffScores + kMaxCache * 4;        // warp partials
constexpr int kOffRed = kOffReduce + 4 * kConsumerWarps * 8;  // split-K staging, i64 or f32
constexpr int kOffBars = kOffRed + kHidden * 8;               // full, empty
constexpr int kOffV = kOffBars + 256;  // the block's V dims (kVRowBytes a position)
// The next B's dims of V, fetched after A's norm by cp.async with the K rows, a thread a cached
// position: the 16-byte pieces covering the block's dims (≤ 16 from any offset span at most 3), at
// kOffV + t·kVRowBytes, dims from element dim0 % 8. (Before the thirty-seventh session: 16 two-byte
// loads a thread into registers ahead of A's polls — ~2,300 sector requests queued before them —
// kept through A's products and stored transposed as f32 at its end; A's input wait 101 → 48 µs
// a step in the profile on an H100.)
constexpr int kVRowBytes = 48, kVRowElems = kVRowBytes / 2;
static_assert(7 + kMaxDims <= kVRowElems, "a block's dims fit a row's pieces");
constexpr int kOffK = kOffV + kMaxCache * kVRowBytes;       // K rows, bf16
constexpr int kOffWarpDone = kOffBars + 2 * kMaxSlots * 8;  // profile build: a clock a warp
static_assert(kOffWarpDone + kConsumerWarps * 8 <= kOffV, "mbarriers and warp clocks fit");
// Where position t's 16-byte piece `piece` of its K row lies in the K rows: piece ^ (t & 7) within
// the row, so the 8 rows a quarter warp reads the same piece of fall in 8 bank groups (attend_dims'
// swizzled form: every thread then reads the same piece of q, a broadcast).
constexpr int kKPieces = kHeadDim * 2 / 16;
// (HK_DECODE_PERSISTENT_K_LAYOUT=rotated: not swizzled, read in attend_dims' rotated order.)
__device__ __forceinline__ int k_piece(int t, int piece, bool swizzled) {
  return t * kHeadDim * 2 + ((piece ^ (swizzled ? t & 7 : 0)) * 16);
}
__host__ __device__ inline int ring_offset(int cache_rows) {
  return (kOffK + cache_rows * kHeadDim * 2 + 127) / 128 * 128;
}

// A block's rows in each phase kind — the same in every layer, so found once a launch rather than
// by three divisions a phase (they were ~9 % of the instructions a step) — and, in B, its head and
// that head's first output dim it owns.
struct BlockRows {
  int qkv0, qkv1, attend0, attend1, mlp0, mlp1, head0, head1;
  int head, dim0;
  __device__ void of(int kind, int64_t& r0, int64_t& r1) const {
    r0 = kind == kQkv ? qkv0 : kind == kAttendO ? attend0 : kind == kMlp ? mlp0 : head0;
    r1 = kind == kQkv ? qkv1 : kind == kAttendO ? attend1 : kind == kMlp ? mlp1 : head1;
  }
};
__device__ inline BlockRows block_rows(const Phase* phases, int n_phases, int block, int grid,
                                       int heads) {
  BlockRows b;
  auto split = [&](const Phase& ph, int& r0, int& r1) {
    r0 = int(row_begin(ph.n, block, grid)), r1 = int(row_begin(ph.n, block + 1, grid));
  };
  // persistent_step_prepare's order: a layer's q/k/v, attention + o and MLP phases, lm_head last
  split(phases[0], b.qkv0, b.qkv1);
  split(phases[2], b.mlp0, b.mlp1);
  split(phases[n_phases - 1], b.head0, b.head1);
  int64_t r0, r1;
  attend_rows(block, grid, heads, kHeadDim, b.head, r0, r1);
  b.attend0 = int(r0), b.attend1 = int(r1), b.dim0 = int(r0) - b.head * kHeadDim;
  return b;
}

// The better of two (value, index) candidates: larger value, then smaller index; index -1 = none.
__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
  if (oi < 0) return;
  if (i < 0 || ov > v || (ov == v && oi < i)) v = ov, i = oi;
}
// (value, index) as one integer whose order is the candidates' (value up, then index down)
__device__ __forceinline__ unsigned long long pack_best(float v, int i) {
  const unsigned bits = __float_as_uint(v);
  const unsigned ordered = (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
  return (static_cast<unsigned long long>(ordered) << 32) | (0xffffffffu - unsigned(i));
}
__device__ __forceinline__ int unpack_index(unsigned long long key) {
  return int(0xffffffffu - unsigned(key & 0xffffffffu));
}

template <bool kDeterministic, bool kProfile>
__global__ void __launch_bounds__(kThreads, 1) persistent_step_kernel(const StepArgs a) {
  using namespace hk::sdk::cuda::sm90;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  bf16* x = reinterpret_cast<bf16*>(smem + kOffX);
  float* xc = reinterpret_cast<float*>(smem + kOffXc);
  float* gate = reinterpret_cast<float*>(smem + kOffGate);
  float* up = reinterpret_cast<float*>(smem + kOffUp);
  float* qs = reinterpret_cast<float*>(smem + kOffQ);
  float* scores = reinterpret_cast<float*>(smem + kOffScores);
  float* reduce = reinterpret_cast<float*>(smem + kOffReduce);
  bf16* vpieces = reinterpret_cast<bf16*>(smem + kOffV);
  unsigned char* kbuf = smem + kOffK;
  auto full = [&](int s) { return base + kOffBars + 8 * s; };
  auto empty = [&](int s) { return base + kOffBars + 8 * (kMaxSlots + s); };
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int grid = gridDim.x, block = blockIdx.x;
  long long t_launch = 0, t_loop_end = 0;  // profile build
  unsigned long long ns_launch = 0;
  if constexpr (kProfile) t_launch = clock64(), ns_launch = global_ns();
  unsigned long long* block_marks =
      kProfile ? a.profile + (int64_t(grid) * a.n_phases * kPhaseMarks + block * kBlockMarks)
               : nullptr;
  auto mark_exit = [&] {  // thread 0, as the block leaves
    if constexpr (kProfile) {
      block_marks[kEpilogue] += static_cast<unsigned long long>(clock64() - t_loop_end);
      block_marks[kBlockCycles] += static_cast<unsigned long long>(clock64() - t_launch);
      block_marks[kBlockNs] += global_ns() - ns_launch;
    }
  };
  const int heads = a.heads_q, group = a.heads_q / a.heads_kv;
  const BlockRows mine = block_rows(a.phases, a.n_phases, block, grid, heads);
  // the step's state: every block reads it here, and the last block to finish changes it (after
  // every block's arrival, so after these reads)
  const unsigned epoch = *const_cast<volatile unsigned*>(a.epoch);
  const unsigned target = unsigned(grid) * (epoch + 1);
  const unsigned tag = step_tag(epoch);
  const int length = min(*const_cast<volatile int32_t*>(a.lengths), a.capacity - 1);
  const int position = *const_cast<volatile int32_t*>(a.positions);
  const int key_start = a.key_start != nullptr ? *const_cast<volatile int32_t*>(a.key_start) : 0;
  const int cache_t = length + 1;  // positions attended: the cache's and the step's own
  // the ring after the K rows: of the bucket's positions, or (a.ring_by_length) of this step's,
  // with as many slots as the rest of the launch's shared memory holds
  const int ring_off = a.ring_by_length ? ring_offset(cache_t) : a.ring_offset;
  const int slots =
      a.ring_by_length ? min(kMaxSlots, (a.smem_bytes - ring_off) / kSlotBytes) : a.slots;
  const uint32_t ring = base + uint32_t(ring_off);
  const unsigned char* ring_ptr = smem + ring_off;
  constexpr int acc_bytes = kDeterministic ? 8 : 4;
  const int64_t parity_off = (epoch & 1) ? a.acc_half : 0;
  auto acc_at = [&](const void* acc, int c, int e) {
    return static_cast<const char*>(acc) + (parity_off + int64_t(c) * kHidden + e) * acc_bytes;
  };
  const int copies = kDeterministic ? a.copies : kCopies;
  auto copy_count = [&](int c) { return unsigned((grid - c + copies - 1) / copies); };
  const TagFormat tags = tag_format(int(copy_count(0)));

  if (tid == 0) {
    for (int s = 0; s < slots; ++s) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), kConsumerWarps);
    }
    fence_barrier_init();
  }
  {  // the other parity's accumulators, for the next step (nobody reads them this step)
    uint4* other = reinterpret_cast<uint4*>(a.acc + ((epoch & 1) ? 0 : a.acc_half * acc_bytes));
    const int64_t n4 = a.acc_half * acc_bytes / 16;
    for (int64_t i = row_begin(n4, block, grid) + tid; i < row_begin(n4, block + 1, grid);
         i += kThreads)
      other[i] = make_uint4(0, 0, 0, 0);
  }
  if (kProfile && a.resident_weights)  // the products' weights: zeros (finite sums, no NaN tags)
    for (int i = tid; i < slots * kSlotBytes / 16; i += kThreads)
      reinterpret_cast<uint4*>(smem + ring_off)[i] = make_uint4(0, 0, 0, 0);
  __syncthreads();

  if (warp == kConsumerWarps) {  // the producer
    if (lane != 0) return;
    auto rows_of = [=](const Phase& ph, int64_t& r0, int64_t& r1) { mine.of(ph.kind, r0, r1); };
    using Cursor = ChunkCursor<Phase, decltype(rows_of), kRowsPerSlot, kHidden>;
    Cursor next{a.phases, a.n_phases, rows_of};
    // `ahead` runs l2_lead chunks in front of the copies, fetching them into L2 only (no shared
    // memory, no barrier, nothing queued on the way to this SM): with one copy in flight, a copy
    // that hits L2 keeps the stream's rate where one from HBM would halve it
    Cursor ahead{a.phases, a.n_phases, rows_of};
    for (int i = 0; i < a.l2_lead && ahead.valid(); ++i, ahead.advance())
      bulk_prefetch_l2(ahead.source(), ahead.bytes());
    int slot = 0, old_slot = 0, issued = 0;
    uint32_t use = 0, old_use = 0;
    for (; next.valid(); next.advance()) {
      const uint32_t bytes = next.bytes();
      if (use > 0) wait_phase(empty(slot), (use - 1) & 1);
      // during the layers at most `inflight` copies outstanding (the copy that many back has
      // landed); lm_head streams uncapped (nothing synchronises behind it)
      if (a.inflight > 0 && issued >= a.inflight && next.p < a.n_phases - 1) {
        wait_phase(full(old_slot), old_use & 1);
        if (++old_slot == slots) old_slot = 0, ++old_use;
      }
      if (kProfile && a.resident_weights) {
        mbar_arrive(full(slot));
      } else {
        mbar_expect_tx(full(slot), bytes);
        bulk_load(ring + slot * kSlotBytes, next.source(), bytes, full(slot));
      }
      ++issued;
      if (++slot == slots) slot = 0, ++use;
      if (a.l2_lead > 0 && ahead.valid()) {
        bulk_prefetch_l2(ahead.source(), ahead.bytes());
        ahead.advance();
      }
    }
    return;
  }

  auto sync = [] { named_sync(1, kConsumers); };
  // profile build: thread 0's cycles waiting for weight chunks this phase (its warp waits on
  // every chunk the block streams)
  long long chunk_wait = 0;
  bool counted = false;  // thread 0: this phase's count added already (split_k, COUNT=early)
  long long t_split = 0, t_split_chunks = 0;  // profile build: thread 0's clocks in split_k
  long long t_stage[3] = {0, 0, 0};           // and at kStage1 … kStage3
  auto stage = [&](int i) {
    if constexpr (kProfile)
      if (tid == 0) t_stage[i] = clock64();
  };
  auto wait_chunk = [&](const RingPos& pos) {
    if constexpr (kProfile) {
      if (tid == 0) {
        const long long t = clock64();
        wait_phase(full(pos.slot), pos.parity());
        chunk_wait += clock64() - t;
        return;
      }
    }
    wait_phase(full(pos.slot), pos.parity());
  };
  RingPos next{0, 0};
  // The next chunks of `rows` rows a pair at a time: every warp waits on and arrives at every
  // chunk, in order (so no warp falls a lap behind a slot), and between them calls
  // pair(i, two, a, b) with the pair's first chunk index, whether it has a second, and the slots.
  auto for_chunk_pairs = [&](int rows, auto&& pair) {
    const int chunks = (rows + kRowsPerSlot - 1) / kRowsPerSlot;
    for (int i = 0; i < chunks; i += 2) {
      const bool two = i + 1 < chunks;
      const RingPos pa = next, pb = two ? next.after(slots) : next;
      wait_chunk(pa);
      if (two) wait_chunk(pb);
      pair(i, two, ring_ptr + pa.slot * kSlotBytes, ring_ptr + pb.slot * kSlotBytes);
      __syncwarp();
      if (lane == 0) {
        mbar_arrive(empty(pa.slot));
        if (two) mbar_arrive(empty(pb.slot));
      }
      next = pb.after(slots);
    }
  };
  const unsigned char* x_bytes = reinterpret_cast<const unsigned char*>(x);
  // `rows` rows of the next chunks times x, a warp a pair of chunks (pair p to warp (first_warp +
  // p) % 8); sink(row, y) on lanes q == 0
  auto rows_product = [&](int rows, int first_warp, auto&& sink) {
    for_chunk_pairs(rows, [&](int i, bool two, const unsigned char* ca, const unsigned char* cb) {
      if ((first_warp + i / 2) % kConsumerWarps != warp) return;
      float ya, yb;
      rows_mma<kHidden>(ca, cb, x_bytes, lane, ya, yb);
      sink_pair<kRowsPerSlot>(lane, i, rows, two, ya, yb, sink);
    });
  };
  // the sliced form (a.products, not pairs): every warp a 1024/8-column slice of every pair of
  // chunks (a chain of 4 MMAs, not 32), its partial sums into part[warp][row]; sum_slices adds them
  // up after a barrier, in warp order (deterministic)
  auto rows_product_sliced = [&](int rows, float* part) {
    constexpr int kSpan = kHidden / 32 / kConsumerWarps;
    for_chunk_pairs(rows, [&](int i, bool two, const unsigned char* ca, const unsigned char* cb) {
      float y[2];
      rows_mma_pairs<kRowBytes, kSpan, 1>({ca, cb}, x_bytes, lane, warp * kSpan, y);
      sink_pair<kRowsPerSlot>(lane, i, rows, two, y[0], y[1],
                              [&](int row, float y) { part[warp * kMaxSplitRows + row] = y; });
    });
  };
  // the batched form (a.products == kProductsBatched): two row products in the sliced form, a pair
  // of chunks of each at a time (four MMA chains a warp, rows_mma_pairs; the same bits): P's rows_p
  // rows in the next chunks into part_p, Q's rows_q (≤ rows_p) in the chunks after them into part_q
  // from row q0. A warp waits on P's pair i and Q's pair i before taking either, so the ring must
  // hold P's chunks from i on and Q's pair: slots ≥ chunks(P) + 2.
  auto two_products_batched = [&](int rows_p, float* part_p, int rows_q, float* part_q, int q0) {
    constexpr int kSpan = kHidden / 32 / kConsumerWarps;
    const int chunks_p = (rows_p + kRowsPerSlot - 1) / kRowsPerSlot;
    const int chunks_q = (rows_q + kRowsPerSlot - 1) / kRowsPerSlot;
    RingPos pp = next, qp = next;
    for (int k = 0; k < chunks_p; ++k) qp = qp.after(slots);
    for (int i = 0; i < chunks_p; i += 2) {
      const bool two_p = i + 1 < chunks_p, has_q = i < chunks_q, two_q = i + 1 < chunks_q;
      const RingPos pa = pp, pb = two_p ? pp.after(slots) : pp;
      const RingPos qa = has_q ? qp : pa, qb = two_q ? qp.after(slots) : qa;
      wait_chunk(pa);
      if (two_p) wait_chunk(pb);
      if (has_q) wait_chunk(qa);
      if (two_q) wait_chunk(qb);
      float y[4];
      rows_mma_pairs<kRowBytes, kSpan, 2>(
          {ring_ptr + pa.slot * kSlotBytes, ring_ptr + pb.slot * kSlotBytes,
           ring_ptr + qa.slot * kSlotBytes, ring_ptr + qb.slot * kSlotBytes},
          x_bytes, lane, warp * kSpan, y);
      sink_pair<kRowsPerSlot>(lane, i, rows_p, two_p, y[0], y[1],
                              [&](int row, float v) { part_p[warp * kMaxSplitRows + row] = v; });
      if (has_q)
        sink_pair<kRowsPerSlot>(lane, i, rows_q, two_q, y[2], y[3], [&](int row, float v) {
          part_q[warp * kMaxSplitRows + q0 + row] = v;
        });
      __syncwarp();
      if (lane == 0) {
        mbar_arrive(empty(pa.slot));
        if (two_p) mbar_arrive(empty(pb.slot));
        if (has_q) mbar_arrive(empty(qa.slot));
        if (two_q) mbar_arrive(empty(qb.slot));
      }
      pp = pb.after(slots);
      if (has_q) qp = qb.after(slots);
    }
    next = chunks_q > 0 ? qp : pp;
  };
  auto sum_slices = [&](const float* part, int row) {
    float y = 0;
    for (int w = 0; w < kConsumerWarps; ++w) y += part[w * kMaxSplitRows + row];
    return y;
  };
  // the staging region holds the slices' partial sums (its reduction read it before this phase's
  // first barrier): 8 KB, two products' worth
  float* part_a = reinterpret_cast<float*>(smem + kOffRed);
  float* part_b = part_a + kConsumerWarps * kMaxSplitRows;
  static_assert(2 * kConsumerWarps * kMaxSplitRows * 4 <= kHidden * 8, "slices fit the staging");
  // `rows` rows c of the next chunks times xc[c], every thread its 4 of the 1024 columns, added
  // into this block's accumulator copy
  auto split_k = [&](int rows, void* acc_out, unsigned* counter) {
    if constexpr (kProfile) t_split = clock64();
    const int chunks = (rows + kRowsPerSlot - 1) / kRowsPerSlot;
    float acc[4] = {0, 0, 0, 0};
    for (int i = 0; i < chunks; ++i) {
      const RingPos pa = next;
      next = next.after(slots);
      wait_chunk(pa);
      // every row of the slot: xc is zero past the phase's rows (rows of a part-filled slot
      // hold earlier weights, finite), so no branch
      add_chunk_columns<kRowsPerSlot, kRowBytes>(ring_ptr + pa.slot * kSlotBytes + tid * 8,
                                                 xc + i * kRowsPerSlot, acc);
      __syncwarp();
      if (lane == 0) mbar_arrive(empty(pa.slot));
    }
    if constexpr (kProfile) t_split_chunks = clock64();
    char* dst = const_cast<char*>(acc_at(acc_out, block % copies, 0));
    if constexpr (!kDeterministic) {
      asm volatile(
          "red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst + tid * 16),
          "f"(acc[0]), "f"(acc[1]), "f"(acc[2]), "f"(acc[3])
          : "memory");
    } else {
      // one bulk reduction a block (the TMA unit adds the 8 KB at L2)
      long long* st = reinterpret_cast<long long*>(smem + kOffRed) + tid * 4;
      for (int e = 0; e < 4; ++e) st[e] = tagged_contribution(acc[e], tags);
      fence_proxy_async();
      sync();
      if (tid == 0) {
        bulk_reduce_add_u64(dst, base + kOffRed, kHidden * 8);
        bulk_commit();
        if (a.count_early) relaxed_add(counter), counted = true;
        // the staging buffer is free again once read; the adds land on their own
        if (!a.lazy_staging) bulk_wait_read_all();
      }
    }
  };

  float vkeep[4] = {0, 0, 0, 0};  // this thread's 4 elements of the last v: the next residual
  // warp 0's rotary factors in B: lane l holds elements 8·(l % 16) … + 7 of q (l < 16) or of the
  // step's k (l ≥ 16); the same position in every layer
  float rope_c[8], rope_s[8];
  if (warp == 0)
    for (int i = 0; i < 8; ++i) {
      const int j = ((lane % 16) * 8 + i) % (kHeadDim / 2);
      const float angle = float(position) * inverse_frequency(a.inv_freq, a.theta, j, kHeadDim);
      rope_c[i] = cosf(angle) * a.rope_scaling;
      rope_s[i] = sinf(angle) * a.rope_scaling;
    }
  // the greedy pick: this thread's best of the logits it made
  float best_v = -INFINITY;
  int best_i = -1;

  // each phase's descriptor is loaded a phase early: its first fields are otherwise an L2 round
  // trip at the head of every phase
  Phase ph_next = a.phases[0];
  for (int p = 0; p < a.n_phases; ++p) {
    const Phase ph = ph_next;
    if (p + 1 < a.n_phases) ph_next = a.phases[p + 1];
    // lazy staging: the last phase's reduction has read the staging buffer before this phase's
    // writes it (a barrier lies between this wait and those writes, and the pick's)
    if (kDeterministic && a.lazy_staging && tid == 0) bulk_wait_read_all();
    long long t_start = 0, t_inputs = 0, t_ready = 0;  // profile build
    if constexpr (kProfile) {
      t_start = clock64();
      if (p == 0 && tid == 0)
        block_marks[kPrologue] += static_cast<unsigned long long>(t_start - t_launch);
    }
    int64_t r0, r1;
    mine.of(ph.kind, r0, r1);
    const int rows = int(r1 - r0);
    // before any wait: what no phase of this step writes — norm weights, q/k norm weights (a q/k/v
    // phase fetches the next B's cache rows after its norm)
    const int head = mine.head, g = head / group, d0 = mine.dim0;
    float gw[4] = {0, 0, 0, 0};
    uint4 qk_w = make_uint4(0, 0, 0, 0);
    if (ph.kind == kAttendO) {
      if (warp == 0 && ph.q_norm != nullptr)
        qk_w = __ldg(
            reinterpret_cast<const uint4*>((lane < 16 ? ph.q_norm : ph.k_norm) + (lane % 16) * 8));
    } else {
      bf16x4(__ldg(reinterpret_cast<const uint2*>(ph.norm_w) + tid), gw);
    }
    const bool prefetch = p + 1 < a.n_phases && ph_next.kind == kAttendO;
    // the block waits until all but `slack` blocks have passed the phase before (its counter)
    auto wait_phase_before = [&](int slack) {
      if (tid == 0) wait_count(a.counters + p - 1, target - unsigned(slack));
      sync();
    };
    if (!kDeterministic && p > 0) wait_phase_before(0);
    if (ph.kind == kAttendO) {
      // the step's q, own k and the block's dims of its own v, then (warp 0) q/k norm and rotary
      // and the cache rows, the scores a thread a position, softmax, and the block's dims of the
      // output a warp a dim
      const int voff = d0 % 8;  // the block's first dim in vpieces' rows
      float own_v = 0.f;        // threads 32 … 32 + rows - 1: the step's v at their dim
      if constexpr (kDeterministic) {
        const unsigned* tq = ph.tagged + head * kHeadDim;
        const unsigned* tk = ph.tagged + heads * kHeadDim + g * kHeadDim;
        const unsigned* tv = tk + a.heads_kv * kHeadDim;
        if (a.b_counted) wait_phase_before(a.count_slack);  // B_WAIT=counted
        if (tid < 32) {
          const unsigned* src = tid < 16 ? tq + tid * 8 : tk + (tid - 16) * 8;
          uint4 u, w;
          for (uint32_t tries = 0;;) {
            u = load_relaxed16(src), w = load_relaxed16(src + 4);
            if ((u.x >> 16) == tag && (u.y >> 16) == tag && (u.z >> 16) == tag &&
                (u.w >> 16) == tag && (w.x >> 16) == tag && (w.y >> 16) == tag &&
                (w.z >> 16) == tag && (w.w >> 16) == tag)
              break;
            count_tries(tries);
          }
          const unsigned words[8] = {u.x, u.y, u.z, u.w, w.x, w.y, w.z, w.w};
          if (tid < 16) {
            for (int i = 0; i < 8; ++i)
              qs[tid * 8 + i] = __uint_as_float((words[i] & 0xffffu) << 16);
          } else {
            uint4 packed;
            packed.x = (words[0] & 0xffffu) | (words[1] << 16);
            packed.y = (words[2] & 0xffffu) | (words[3] << 16);
            packed.z = (words[4] & 0xffffu) | (words[5] << 16);
            packed.w = (words[6] & 0xffffu) | (words[7] << 16);
            *reinterpret_cast<uint4*>(kbuf + k_piece(length, tid - 16, a.k_swizzled)) = packed;
          }
        } else if (tid - 32 < rows) {
          unsigned w;
          for (uint32_t tries = 0;;) {
            w = load_relaxed(tv + d0 + tid - 32);
            if ((w >> 16) == tag) break;
            count_tries(tries);
          }
          own_v = __uint_as_float((w & 0xffffu) << 16);
        }
      } else {
        const bf16* q = ph.qkv + head * kHeadDim;
        const bf16* k_new = ph.qkv + heads * kHeadDim + g * kHeadDim;
        const bf16* v_new = ph.qkv + (heads + a.heads_kv) * kHeadDim + g * kHeadDim;
        if (tid < 16) {
          float f[8];
          bf16x8(load_cg16(q + tid * 8), f);
          for (int i = 0; i < 8; ++i) qs[tid * 8 + i] = f[i];
        } else if (tid < 32) {
          *reinterpret_cast<uint4*>(kbuf + k_piece(length, tid - 16, a.k_swizzled)) =
              load_cg16(k_new + (tid - 16) * 8);
        } else if (tid - 32 < rows) {
          own_v = load_cg_bf16(v_new + d0 + tid - 32);
        }
      }
      __syncwarp();
      if (warp == 0) {
        // each half warp one head vector: RMSNorm (f32; ×r rounded, ×w rounded), then the
        // rotation in f32 rounded once; rotate_half pairs element d with d ± 64: lane ± 8's slot
        float e[8];
        unsigned char* krow = kbuf + k_piece(length, lane % 16, a.k_swizzled);
        if (lane < 16) {
          for (int i = 0; i < 8; ++i) e[i] = qs[lane * 8 + i];
        } else {
          bf16x8(*reinterpret_cast<const uint4*>(krow), e);
        }
        if (ph.q_norm != nullptr) {
          float w[8];
          bf16x8(qk_w, w);
          float ss = 0;
          for (int i = 0; i < 8; ++i) ss += e[i] * e[i];
          for (int o = 8; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
          const float r = rsqrtf(ss / float(kHeadDim) + a.qk_eps);
          for (int i = 0; i < 8; ++i) e[i] = bf(bf(e[i] * r) * w[i]);
        }
        const bool low = lane % 16 < 8;  // elements 0 … 63: x·c − x[d + 64]·s
        float out[8];
        for (int i = 0; i < 8; ++i) {
          const float partner = __shfl_xor_sync(0xffffffffu, e[i], 8);
          out[i] =
              low ? e[i] * rope_c[i] - partner * rope_s[i] : e[i] * rope_c[i] + partner * rope_s[i];
        }
        if (lane < 16) {
          for (int i = 0; i < 8; ++i) qs[lane * 8 + i] = bf(out[i]);
        } else {
          uint4 packed;
          __nv_bfloat162* pk = reinterpret_cast<__nv_bfloat162*>(&packed);
          for (int i = 0; i < 4; ++i) pk[i] = __floats2bfloat162_rn(out[2 * i], out[2 * i + 1]);
          *reinterpret_cast<uint4*>(krow) = packed;
          // the step's k row into the cache: by the first block of the group's first head
          if (head % group == 0 && block == grid * head / heads)
            *reinterpret_cast<uint4*>(ph.k_cache + (int64_t(length) * a.heads_kv + g) * kHeadDim +
                                      (lane - 16) * 8) = packed;
        }
      }
      // the block's dims of the step's v row beside the cached ones and into the cache (the
      // group's heads write the same)
      if (tid >= 32 && tid - 32 < rows) {
        const bf16 v16 = __float2bfloat16_rn(own_v);  // exact: own_v was a bf16
        vpieces[length * kVRowElems + voff + tid - 32] = v16;
        ph.v_cache[(int64_t(length) * a.heads_kv + g) * kHeadDim + d0 + tid - 32] = v16;
      }
      copy_async_wait_all();
      sync();
      if constexpr (kProfile) t_inputs = clock64();
      if (tid >= rows && tid < kMaxSplitRows) xc[tid] = 0.f;  // split_k reads whole slots
      auto v_at = [&](int d, int t) {
        return __bfloat162float(vpieces[t * kVRowElems + voff + d]);
      };
      if (a.k_swizzled)
        attend_dims<kHeadDim, kConsumerWarps, true>(kbuf, qs, v_at, scores, reduce, cache_t,
                                                    key_start, a.scale, rows, xc, nullptr, sync);
      else
        attend_dims<kHeadDim, kConsumerWarps, false>(kbuf, qs, v_at, scores, reduce, cache_t,
                                                     key_start, a.scale, rows, xc, nullptr, sync);
      sync();
      if constexpr (kProfile) t_ready = clock64();
      split_k(rows, ph.acc_out, a.counters + p);
    } else {
      // the next B's K rows, 16 bytes a thread at a time (swizzled: k_piece), and its V dims
      // (kVRowBytes, a thread a cached position); the previous B is done reading them
      auto fetch_kv = [&] {
        if (tid < length) {
          const int dims = mine.attend1 - mine.attend0;
          const int first = d0 / 8, pieces = (d0 + dims + 7) / 8 - first;
          const bf16* vrow =
              ph_next.v_cache + (int64_t(tid) * a.heads_kv + g) * kHeadDim + first * 8;
          for (int c = 0; c < pieces; ++c)
            copy_async16(base + kOffV + tid * kVRowBytes + c * 16, vrow + c * 8);
        }
        for (int i = tid; i < length * kKPieces; i += kConsumers) {
          const int t = i / kKPieces, piece = i % kKPieces;
          copy_async16(base + kOffK + k_piece(t, piece, a.k_swizzled),
                       ph_next.k_cache + (int64_t(t) * a.heads_kv + g) * kHeadDim + piece * 8);
        }
        copy_async_commit();
      };
      bool kv_fetched = false;
      // v: 4 elements a thread — the embedding row (phase 0), else the residual from registers
      // plus the sums of the phase before (one round trip; polled in the deterministic form)
      float v[4];
      if (ph.acc_in == nullptr) {
        int64_t token = *const_cast<volatile int64_t*>(a.tokens);
        token = token < 0 || token >= a.vocab ? 0 : token;
        bf16x4(__ldg(reinterpret_cast<const uint2*>(a.embed + token * kHidden) + tid), v);
      } else {
        float sum[4] = {0, 0, 0, 0};
        if constexpr (kDeterministic) {
          unsigned long long e[kCopies][4] = {};
          if (a.poll == kPollCounted) wait_phase_before(a.count_slack);
          // a copy once complete is not read again (kPollCounted, kPollIncomplete, kPollSleep: 132
          // blocks reading 32 KB a round otherwise load L2 while it takes the sums; kPollSleep also
          // 64 ns between rounds), or (kPollAll) every copy is read again until all are complete in
          // one round
          const unsigned all = (1u << copies) - 1;
          unsigned pending = all;
          for (uint32_t tries = 0;;) {
#pragma unroll
            for (int c = 0; c < kCopies; ++c)
              if (pending & (1u << c)) {
                const char* at = acc_at(ph.acc_in, c, tid * 4);
                load_relaxed_2x64(at, e[c][0], e[c][1]);
                load_relaxed_2x64(at + 16, e[c][2], e[c][3]);
              }
            // (KV_ISSUE=with-reads: the K/V copies issued behind the first round's loads)
            if (tries == 0 && prefetch && a.kv_with_reads) fetch_kv(), kv_fetched = true;
#pragma unroll
            for (int c = 0; c < kCopies; ++c) {
              if (!(pending & (1u << c))) continue;
              bool complete = true;
              for (int k = 0; k < 4; ++k)
                complete = complete && unsigned(e[c][k] >> tags.shift) == copy_count(c);
              if (complete) pending &= ~(1u << c);
            }
            if (pending == 0) break;
            if (a.poll == kPollAll) pending = all;
            count_tries(tries);
            if (a.poll == kPollSleep) __nanosleep(64);
          }
          long long isum[4] = {0, 0, 0, 0};
#pragma unroll
          for (int c = 0; c < kCopies; ++c)  // (kCopies bounds the unrolled loop)
            if (c < copies)
              for (int k = 0; k < 4; ++k)
                isum[k] += static_cast<long long>(e[c][k] & ((1ull << tags.shift) - 1)) -
                           static_cast<long long>(copy_count(c)) * tags.bias;
          for (int k = 0; k < 4; ++k) sum[k] = float(double(isum[k]) * (1.0 / 4294967296.0));
        } else {
          uint4 part[kCopies];
#pragma unroll
          for (int c = 0; c < kCopies; ++c) part[c] = load_cg16(acc_at(ph.acc_in, c, tid * 4));
#pragma unroll
          for (int c = 0; c < kCopies; ++c) {
            sum[0] += __uint_as_float(part[c].x), sum[1] += __uint_as_float(part[c].y);
            sum[2] += __uint_as_float(part[c].z), sum[3] += __uint_as_float(part[c].w);
          }
        }
        for (int e = 0; e < 4; ++e) v[e] = bf(vkeep[e] + bf(sum[e]));
      }
      for (int e = 0; e < 4; ++e) vkeep[e] = v[e];
      float ss = v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3];
      for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) reduce[warp] = ss;
      sync();
      if constexpr (kProfile) t_inputs = clock64();
      float total = 0;
      for (int w = 0; w < kConsumerWarps; ++w) total += reduce[w];
      const float r = rsqrtf(total / float(kHidden) + a.eps);
      for (int e = 0; e < 4; ++e) x[tid * 4 + e] = __float2bfloat16_rn(bf(v[e] * r) * gw[e]);
      sync();
      // the next B's K and V copies after this barrier (after A's rows are stored instead they
      // lost 3 %: the copies then queue ahead of B's reads), or with the sums' reads above
      if (prefetch && !kv_fetched) fetch_kv();
      if constexpr (kProfile) t_ready = clock64();
      if (ph.kind == kQkv) {
        auto store = [&](int row, float y) {
          if constexpr (kDeterministic)
            ph.tagged[r0 + row] = __bfloat16_as_ushort(__float2bfloat16_rn(y)) | (tag << 16);
          else
            ph.qkv[r0 + row] = __float2bfloat16_rn(y);
        };
        const int chunks = (rows + kRowsPerSlot - 1) / kRowsPerSlot;
        // batched: P the first half of the chunks rounded up to pairs (rows 0 … 15 of 31 or 32),
        // Q the rest (never more chunks than P)
        const int first_chunks = min(chunks, 2 * ((chunks + 3) / 4));
        if (a.products == kProductsPairs) {
          rows_product(rows, 0, store);
        } else {
          if (a.products == kProductsBatched && slots >= first_chunks + 2) {
            const int first = min(rows, first_chunks * kRowsPerSlot);
            two_products_batched(first, part_a, rows - first, part_a, first);
          } else {
            rows_product_sliced(rows, part_a);
          }
          stage(0);
          sync();
          stage(1);
          if (tid < rows) store(tid, sum_slices(part_a, tid));
          stage(2);
        }
      } else if (ph.kind == kMlp) {
        const int chunks = (rows + kRowsPerSlot - 1) / kRowsPerSlot;
        if (a.products == kProductsPairs) {
          // up's pairs on the warps after gate's, so its products need not wait for gate's
          const int gate_pairs = (rows + 2 * kRowsPerSlot - 1) / (2 * kRowsPerSlot);
          rows_product(rows, 0, [&](int row, float y) { gate[row] = y; });
          rows_product(rows, gate_pairs, [&](int row, float y) { up[row] = y; });
        } else {
          if (a.products == kProductsBatched && slots >= chunks + 2) {
            two_products_batched(rows, part_a, rows, part_b, 0);
            stage(0);
          } else {
            rows_product_sliced(rows, part_a);
            stage(0);
            rows_product_sliced(rows, part_b);
          }
          stage(1);
          sync();
          stage(2);
          if (tid < rows) gate[tid] = sum_slices(part_a, tid), up[tid] = sum_slices(part_b, tid);
        }
        sync();
        if (tid < rows) {
          const float gg = bf(gate[tid]);
          xc[tid] = bf(bf(gg * __frcp_rn(1.0f + expf(-gg))) * bf(up[tid]));
        } else if (tid < kMaxSplitRows) {
          xc[tid] = 0.f;  // split_k reads whole slots
        }
        sync();
        split_k(rows, ph.acc_out, a.counters + p);
      } else {  // lm_head: the logits as the kernel sequence rounds them
        float* logits = a.logits_f32;
        rows_product(rows, 0, [&](int row, float y) {
          const float value = bf(y);
          if (logits != nullptr) logits[r0 + row] = value;
          better(best_v, best_i, value, int(r0 + row));
        });
      }
    }
    if constexpr (kProfile)
      if (lane == 0) reinterpret_cast<long long*>(smem + kOffWarpDone)[warp] = clock64();
    sync();
    if constexpr (kProfile) {
      if (tid == 0) {
        const long long t_end = clock64();
        const long long* done = reinterpret_cast<const long long*>(smem + kOffWarpDone);
        long long first = done[0], last = done[0];
        for (int w = 1; w < kConsumerWarps; ++w)
          first = min(first, done[w]), last = max(last, done[w]);
        unsigned long long* at = a.profile + (int64_t(block) * a.n_phases + p) * kPhaseMarks;
        at[kInputs] += static_cast<unsigned long long>(t_inputs - t_start);
        at[kChunks] += static_cast<unsigned long long>(chunk_wait);
        at[kReady] += static_cast<unsigned long long>(t_ready - t_start);
        at[kFirstDone] += static_cast<unsigned long long>(first - t_start);
        at[kLastDone] += static_cast<unsigned long long>(last - t_start);
        at[kEnd] += static_cast<unsigned long long>(t_end - t_start);
        if (t_split != 0) {
          at[kSplitStart] += static_cast<unsigned long long>(t_split - t_start);
          at[kSplitChunks] += static_cast<unsigned long long>(t_split_chunks - t_start);
        }
        t_split = 0;
        if (t_stage[2] != 0)
          for (int i = 0; i < 3; ++i) {
            at[kStage1 + i] += static_cast<unsigned long long>(t_stage[i] - t_start);
            t_stage[i] = 0;
          }
        t_loop_end = t_end;
      }
      chunk_wait = 0;
    }
    // (the barrier above ordered the block's reductions and stores before the release)
    // (the deterministic form counts too, relaxed, in every poll form: the counters then keep
    // pace with the steps whichever form a launch picks)
    if (tid == 0 && p + 1 < a.n_phases) {
      if constexpr (kDeterministic) {
        if (!counted) relaxed_add(a.counters + p);
      } else {
        release_add(a.counters + p);
      }
    }
    counted = false;
  }

  // the pick: each block's best, then the last block to finish reduces them and keeps the books
  const bool greedy = a.logits_f32 == nullptr;
  int* is_last = reinterpret_cast<int*>(reduce) + 4 * kConsumerWarps;
  if (greedy) {
    for (int o = 16; o > 0; o /= 2) {
      const float ov = __shfl_xor_sync(0xffffffffu, best_v, o);
      const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
      better(best_v, best_i, ov, oi);
    }
    if (lane == 0) {
      reduce[warp] = best_v;
      reinterpret_cast<int*>(reduce)[kConsumerWarps + warp] = best_i;
    }
    sync();
  }
  if (tid == 0) {
    if (greedy) {
      for (int w = 1; w < kConsumerWarps; ++w)
        better(best_v, best_i, reduce[w], reinterpret_cast<int*>(reduce)[kConsumerWarps + w]);
      a.best[block] = best_i < 0 ? 0ull : pack_best(best_v, best_i);
    }
    __threadfence();
    *is_last = atomicAdd(a.finish, 1u) == target - 1;
  }
  sync();
  if (!*is_last) {
    if (tid == 0) mark_exit();
    return;
  }
  __threadfence();
  unsigned long long key = 0;
  if (greedy) {
    for (int q = tid; q < grid; q += kConsumers) key = max(key, __ldcg(a.best + q));
    for (int o = 16; o > 0; o /= 2) key = max(key, __shfl_xor_sync(0xffffffffu, key, o));
    if (lane == 0) reinterpret_cast<unsigned long long*>(smem + kOffRed)[warp] = key;
    sync();
  }
  if (tid != 0) return;
  if (greedy) {
    for (int w = 0; w < kConsumerWarps; ++w)
      key = max(key, reinterpret_cast<unsigned long long*>(smem + kOffRed)[w]);
    const bool finished = *a.done != 0;
    const int64_t token = finished ? a.pad : (key == 0 ? 0 : unpack_index(key));
    if (!finished)
      for (int e = 0; e < a.num_eos; ++e)
        if (token == a.eos[e]) *a.done = 1;
    *a.tokens = token;
  }
  *a.positions += 1;
  *a.lengths += 1;
  mark_exit();
  *a.epoch = epoch + 1;
}

// ---- host ------------------------------------------------------------------------------------
struct Layout {  // the workspace
  size_t phases = 0, counters = 0, epoch = 0, finish = 0, best = 0, tagged = 0, qkv = 0, acc = 0;
  size_t profile = 0;
  size_t total = 0;
  int n_phases = 0, grid = 0;
  int64_t acc_half = 0;  // elements a parity set
};
Layout layout_of(const PersistentStepParams& p) {
  Layout l;
  l.n_phases = static_cast<int>(3 * p.layers.size() + 1);
  l.grid = device_sm_count();
  const int64_t qkv_width = (p.heads_q + 2 * p.heads_kv) * p.head_dim;
  auto take = [&](size_t bytes) {
    const size_t at = l.total;
    l.total += (bytes + 255) / 256 * 256;
    return at;
  };
  l.phases = take(sizeof(Phase) * l.n_phases);
  l.counters = take(sizeof(unsigned) * l.n_phases);
  l.epoch = take(sizeof(unsigned));
  l.finish = take(sizeof(unsigned));
  l.best = take(sizeof(unsigned long long) * l.grid);
  l.tagged = take(p.deterministic ? sizeof(unsigned) * qkv_width * p.layers.size() : 0);
  l.qkv = take(p.deterministic ? 0 : 2 * qkv_width);
  l.acc_half = int64_t(2 * p.layers.size()) * kCopies * kHidden;  // o and down, each layer
  l.acc = take(size_t(2 * l.acc_half) * (p.deterministic ? 8 : 4));
  l.profile = take(p.profile ? sizeof(unsigned long long) * l.grid *
                                   (size_t(kPhaseMarks) * l.n_phases + kBlockMarks)
                             : 0);
  return l;
}
// A count from the environment (unset or empty: `fallback`), 0 … `most`; else InvalidArgument.
int env_count(const char* name, int fallback, int most) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 0 || n > most)
    throw InvalidArgument(std::string(name) + " is '" + v + "'; use 0 to " + std::to_string(most));
  return static_cast<int>(n);
}
// Copies outstanding a block during the layers: 1 (hk_bench_split_step, thirty-second session,
// H100: 573 µs a step against 646 uncapped, 621 at 2); HK_DECODE_PERSISTENT_INFLIGHT=K overrides
// (0: uncapped), for measuring it here.
int inflight_cap() {
  static const int cap = env_count("HK_DECODE_PERSISTENT_INFLIGHT", 1, kMaxSlots);
  return cap;
}
// A switch from the environment, read at each launch (an eager step; a graph keeps what its
// capture read), so one process can compare both settings: `off` → false, `on` → true, unset or
// empty → `fallback`, else InvalidArgument naming both.
bool env_switch(const char* name, const char* off, const char* on, bool fallback = false) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  if (std::strcmp(v, off) == 0) return false;
  if (std::strcmp(v, on) == 0) return true;
  throw InvalidArgument(std::string(name) + " is '" + v + "'; use " + off + " or " + on);
}
// A choice from the environment among `names` (unset or empty: the first), read at each launch:
// its index, else InvalidArgument naming them all.
int env_choice(const char* name, std::initializer_list<const char*> names) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  int index = 0;
  std::string all;
  for (const char* n : names) {
    if (std::strcmp(v, n) == 0) return index;
    all += (index++ == 0 ? "" : ", ") + std::string(n);
  }
  throw InvalidArgument(std::string(name) + " is '" + v + "'; use one of " + all);
}
// The dynamic shared memory a block of `kernel` may have (the device's opt-in limit less the
// kernel's static shared memory, at most kMaxSmem), asked once a process and kernel.
size_t dynamic_smem_most(void (*kernel)(const StepArgs)) {
  static std::mutex mutex;
  static std::map<void (*)(const StepArgs), size_t> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto [at, added] = known.try_emplace(kernel, 0);
  if (added) {
    int device = 0, optin = 0;
    HK_CUDA_CHECK(cudaGetDevice(&device));
    HK_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    cudaFuncAttributes attributes{};
    HK_CUDA_CHECK(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernel)));
    at->second = std::min<size_t>(kMaxSmem, size_t(optin) - attributes.sharedSizeBytes);
  }
  return at->second;
}
// Chunks a block fetches into L2 ahead of its copies: 0 by default (unmeasured with the cap);
// HK_DECODE_PERSISTENT_L2_LEAD=N (up to 64) to measure it.
int l2_lead() {
  static const int lead = env_count("HK_DECODE_PERSISTENT_L2_LEAD", 0, 64);
  return lead;
}
int cache_rows(const PersistentStepParams& p) {
  return static_cast<int>(std::min<int64_t>(p.capacity, kMaxCache));
}
// Ring slots: as many as shared memory holds beside the K rows (10 for caches of up to 153
// positions, 9 up to 217, 8 at 256 — the 16 + 128 bucket), or fewer with
// HK_DECODE_PERSISTENT_SLOTS=S (≥ 4), for measuring what slots are worth.
int slots_for(const PersistentStepParams& p) {
  const int fit = std::min(kMaxSlots, (kMaxSmem - ring_offset(cache_rows(p))) / kSlotBytes);
  static const int asked = env_count("HK_DECODE_PERSISTENT_SLOTS", 0, kMaxSlots);
  return asked >= kMinSlots ? std::min(asked, fit) : fit;
}

}  // namespace

std::string persistent_step_unsupported(const PersistentStepParams& p) {
  if (!detail::device_is_sm90_or_later()) return "it needs sm_90 (bulk copies)";
  if (p.hidden != kHidden || p.head_dim != kHeadDim)
    return "it serves hidden size " + std::to_string(kHidden) + " and head dim " +
           std::to_string(kHeadDim) + ", not " + std::to_string(p.hidden) + " and " +
           std::to_string(p.head_dim);
  if (p.layers.empty()) return "the model has no layers";
  if (p.heads_kv <= 0 || p.heads_q % p.heads_kv != 0)
    return "q heads are not a multiple of kv heads";
  const int grid = device_sm_count();
  if (grid < p.heads_q * (kHeadDim / kMaxDims))
    return "a q head needs at least " + std::to_string(kHeadDim / kMaxDims) + " SMs (" +
           std::to_string(p.heads_q) + " heads, " + std::to_string(grid) + " SMs)";
  if ((p.inter + grid - 1) / grid > kMaxSplitRows)
    return "intermediate size " + std::to_string(p.inter) + " is over " +
           std::to_string(kMaxSplitRows) + " rows an SM";
  if (p.capacity < 1 || p.capacity > kMaxCache)
    return "it holds a cache of up to " + std::to_string(kMaxCache) + " positions, not " +
           std::to_string(p.capacity);
  if (p.vocab < 1 || p.vocab > (int64_t(1) << 30)) return "vocabulary size out of range";
  if (p.deterministic && !copies_fit(grid, kDefaultCopies))
    return "too many SMs for the deterministic accumulators";
  for (const PersistentLayer& l : p.layers) {
    if ((l.q_norm == nullptr) != (l.k_norm == nullptr)) return "a layer has only one of q/k norm";
    for (const void* w : {l.qkv, l.o_t, l.gate, l.up, l.down_t, l.input_norm, l.post_norm,
                          static_cast<const void*>(l.k_cache), static_cast<const void*>(l.v_cache)})
      if (w == nullptr || reinterpret_cast<uintptr_t>(w) % 16 != 0)
        return "a layer's weights or caches are missing or not 16-byte aligned";
  }
  for (const void* w : {p.embed, p.lm_head, p.final_norm})
    if (w == nullptr || reinterpret_cast<uintptr_t>(w) % 16 != 0)
      return "the embedding, lm_head or final norm is missing or not 16-byte aligned";
  if (slots_for(p) < kMinSlots) return "shared memory too small for its ring";
  return "";
}

size_t persistent_step_workspace_bytes(const PersistentStepParams& p) {
  return layout_of(p).total;
}

void persistent_step_prepare(const PersistentStepParams& p, Stream stream) {
  if (std::string why = persistent_step_unsupported(p); !why.empty())
    throw Unsupported("decode persistent step: " + why);
  if (p.workspace == nullptr)
    throw InvalidArgument("decode persistent step: no workspace (persistent_step_workspace_bytes)");
  const Layout l = layout_of(p);
  char* ws = static_cast<char*>(p.workspace);
  const int64_t qkv_width = (p.heads_q + 2 * p.heads_kv) * p.head_dim;
  const size_t acc_bytes = p.deterministic ? 8 : 4;
  auto acc = [&](size_t index) {  // accumulator `index`'s kCopies copies, parity 0
    return ws + l.acc + index * kCopies * kHidden * acc_bytes;
  };
  auto b16 = [](const void* q) { return static_cast<const bf16*>(q); };
  std::vector<Phase> phases;
  for (size_t i = 0; i < p.layers.size(); ++i) {
    const PersistentLayer& w = p.layers[i];
    unsigned* tagged =
        p.deterministic ? reinterpret_cast<unsigned*>(ws + l.tagged) + i * qkv_width : nullptr;
    bf16* qkv = p.deterministic ? nullptr : reinterpret_cast<bf16*>(ws + l.qkv);
    Phase qkv_phase, attend, mlp;
    qkv_phase.kind = kQkv, qkv_phase.n = static_cast<int>(qkv_width), qkv_phase.segments = 1;
    qkv_phase.w[0] = b16(w.qkv), qkv_phase.norm_w = b16(w.input_norm);
    qkv_phase.acc_in = i == 0 ? nullptr : acc(2 * i - 1);
    qkv_phase.tagged = tagged, qkv_phase.qkv = qkv;
    attend.kind = kAttendO, attend.n = static_cast<int>(p.heads_q * p.head_dim);
    attend.segments = 1, attend.w[0] = b16(w.o_t), attend.acc_out = acc(2 * i);
    attend.tagged = tagged, attend.qkv = qkv;
    attend.k_cache = static_cast<bf16*>(w.k_cache), attend.v_cache = static_cast<bf16*>(w.v_cache);
    attend.q_norm = b16(w.q_norm), attend.k_norm = b16(w.k_norm);
    mlp.kind = kMlp, mlp.n = static_cast<int>(p.inter), mlp.segments = 3;
    mlp.w[0] = b16(w.gate), mlp.w[1] = b16(w.up), mlp.w[2] = b16(w.down_t);
    mlp.norm_w = b16(w.post_norm), mlp.acc_in = acc(2 * i), mlp.acc_out = acc(2 * i + 1);
    phases.push_back(qkv_phase), phases.push_back(attend), phases.push_back(mlp);
  }
  Phase head;
  head.kind = kHead, head.n = static_cast<int>(p.vocab), head.segments = 1;
  head.w[0] = b16(p.lm_head), head.norm_w = b16(p.final_norm);
  head.acc_in = acc(2 * p.layers.size() - 1);
  phases.push_back(head);
  const cudaStream_t s = native(stream);
  HK_CUDA_CHECK(cudaMemsetAsync(ws, 0, l.total, s));
  HK_CUDA_CHECK(cudaMemcpyAsync(ws + l.phases, phases.data(), phases.size() * sizeof(Phase),
                                cudaMemcpyHostToDevice, s));
  HK_CUDA_CHECK(cudaStreamSynchronize(s));
}

void persistent_step(const PersistentStepParams& p, Stream stream) {
  const Layout l = layout_of(p);
  char* ws = static_cast<char*>(p.workspace);
  StepArgs a{};
  a.phases = reinterpret_cast<const Phase*>(ws + l.phases);
  a.n_phases = l.n_phases;
  a.slots = slots_for(p);
  a.ring_offset = ring_offset(cache_rows(p));
  a.inflight = inflight_cap();
  a.l2_lead = l2_lead();
  a.lazy_staging = env_switch("HK_DECODE_PERSISTENT_STAGING", "eager", "lazy");
  a.products = env_choice("HK_DECODE_PERSISTENT_PRODUCTS", {"sliced", "pairs", "batched"});
  a.ring_by_length = env_switch("HK_DECODE_PERSISTENT_RING", "bucket", "length", true);
  a.poll = env_choice("HK_DECODE_PERSISTENT_POLL", {"counted", "incomplete", "all", "sleep"});
  a.count_early = env_switch("HK_DECODE_PERSISTENT_COUNT", "late", "early", true);
  a.count_slack = std::min(env_count("HK_DECODE_PERSISTENT_COUNT_SLACK", 0, 64), l.grid - 1);
  a.b_counted = env_switch("HK_DECODE_PERSISTENT_B_WAIT", "polled", "counted");
  a.kv_with_reads = env_switch("HK_DECODE_PERSISTENT_KV_ISSUE", "after-norm", "with-reads", true);
  a.copies = kDefaultCopies + env_choice("HK_DECODE_PERSISTENT_COPIES", {"2", "3", "4"});
  if (p.deterministic && !copies_fit(l.grid, a.copies))
    throw InvalidArgument("HK_DECODE_PERSISTENT_COPIES=" + std::to_string(a.copies) +
                          " puts more than " + std::to_string(kMaxTagCountWide) +
                          " contributions on an element on " + std::to_string(l.grid) +
                          " SMs; use more copies");
  a.k_swizzled = env_switch("HK_DECODE_PERSISTENT_K_LAYOUT", "rotated", "swizzled", true);
  a.resident_weights = env_switch("HK_DECODE_PERSISTENT_WEIGHTS", "stream", "resident");
  if (a.resident_weights && !p.profile)
    throw InvalidArgument(
        "HK_DECODE_PERSISTENT_WEIGHTS=resident times the step without its weights (wrong tokens) "
        "and works in the profile build only; set HK_DECODE_PERSISTENT_PROFILE=1 too");
  a.counters = reinterpret_cast<unsigned*>(ws + l.counters);
  a.epoch = reinterpret_cast<unsigned*>(ws + l.epoch);
  a.finish = reinterpret_cast<unsigned*>(ws + l.finish);
  a.best = reinterpret_cast<unsigned long long*>(ws + l.best);
  a.acc = ws + l.acc;
  a.acc_half = l.acc_half;
  a.heads_q = static_cast<int>(p.heads_q);
  a.heads_kv = static_cast<int>(p.heads_kv);
  a.capacity = static_cast<int>(p.capacity);
  a.eps = p.eps;
  a.qk_eps = p.qk_eps;
  a.scale = p.scale > 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  a.theta = p.rope_theta;
  a.rope_scaling = p.attention_scaling;
  a.inv_freq = p.inv_freq;
  a.embed = static_cast<const bf16*>(p.embed);
  a.vocab = static_cast<int>(p.vocab);
  a.tokens = p.tokens;
  a.positions = p.positions;
  a.lengths = p.lengths;
  a.key_start = p.key_start;
  a.done = p.done;
  a.eos = p.eos;
  a.num_eos = p.num_eos;
  a.pad = p.pad_id;
  a.logits_f32 = p.logits_f32;
  a.profile = p.profile ? reinterpret_cast<unsigned long long*>(ws + l.profile) : nullptr;
  size_t smem = static_cast<size_t>(a.ring_offset) + size_t(a.slots) * kSlotBytes;
  void (*kernel)(const StepArgs) = p.profile
                                       ? (p.deterministic ? persistent_step_kernel<true, true>
                                                          : persistent_step_kernel<false, true>)
                                       : (p.deterministic ? persistent_step_kernel<true, false>
                                                          : persistent_step_kernel<false, false>);
  if (a.ring_by_length) smem = std::max(smem, dynamic_smem_most(kernel));
  a.smem_bytes = static_cast<int>(smem);
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  // blocks wait on each other's sums: all must be resident at once
  launch_cooperative(kernel, dim3(static_cast<unsigned>(l.grid)), dim3(kThreads), smem, stream, a);
}

std::string persistent_step_profile(const PersistentStepParams& p, Stream stream) {
  if (!p.profile || p.workspace == nullptr) return "";
  const Layout l = layout_of(p);
  const char* ws = static_cast<const char*>(p.workspace);
  const size_t phase_values = size_t(kPhaseMarks) * l.grid * l.n_phases;
  std::vector<unsigned long long> cycles(phase_values + size_t(kBlockMarks) * l.grid);
  unsigned steps = 0;
  const cudaStream_t s = native(stream);
  HK_CUDA_CHECK(
      cudaMemcpyAsync(cycles.data(), ws + l.profile, cycles.size() * 8, cudaMemcpyDeviceToHost, s));
  HK_CUDA_CHECK(cudaMemcpyAsync(&steps, ws + l.epoch, sizeof(steps), cudaMemcpyDeviceToHost, s));
  HK_CUDA_CHECK(cudaStreamSynchronize(s));
  if (steps == 0) return "";
  const unsigned long long* blocks = cycles.data() + phase_values;
  // the clock the cycles ran at (the blocks' cycles over their %globaltimer ns), not the rated one:
  // under a memory-bound load the SM clock sits below it
  double block_cycles = 0, block_ns = 0, prologue = 0, epilogue = 0, epilogue_slowest = 0;
  for (int b = 0; b < l.grid; ++b) {
    const unsigned long long* m = blocks + size_t(b) * kBlockMarks;
    block_cycles += double(m[kBlockCycles]), block_ns += double(m[kBlockNs]);
    prologue += double(m[kPrologue]) / l.grid, epilogue += double(m[kEpilogue]) / l.grid;
    epilogue_slowest = std::max(epilogue_slowest, double(m[kEpilogue]));
  }
  const double mhz = block_ns > 0 ? 1e3 * block_cycles / block_ns : 0;
  if (mhz <= 0) return "";
  const double us = 1.0 / (mhz * steps);  // cycles summed over the steps → µs a step
  char head[192];
  std::snprintf(head, sizeof(head),
                "persistent profile (%u steps at %.0f MHz, µs a step, mean over blocks / the block "
                "slowest in the phase kind): kernel %.1f, before the first phase %.1f, after the "
                "last %.1f/%.1f;",
                steps, mhz, block_cycles / l.grid * us, prologue * us, epilogue * us,
                epilogue_slowest * us);
  std::string out = head;
  const char* names[4] = {"q/k/v", "attention+o", "mlp", "lm_head"};
  auto kind_of = [&](int ph) { return ph == l.n_phases - 1 ? int(kHead) : ph % 3; };
  double step_mean = 0;
  double means[4][kPhaseMarks] = {};  // a kind's marks, mean over blocks
  for (int kind = 0; kind < 4; ++kind) {
    // per block, summed over the kind's phases: the marks' durations
    double(&mean)[kPhaseMarks] = means[kind];
    double slowest[kPhaseMarks] = {};
    for (int b = 0; b < l.grid; ++b) {
      double sum[kPhaseMarks] = {};
      for (int ph = 0; ph < l.n_phases; ++ph) {
        if (kind_of(ph) != kind) continue;
        for (int k = 0; k < kPhaseMarks; ++k)
          sum[k] += double(cycles[(size_t(b) * l.n_phases + ph) * kPhaseMarks + k]) * us;
      }
      for (int k = 0; k < kPhaseMarks; ++k) mean[k] += sum[k] / l.grid;
      if (sum[kEnd] > slowest[kEnd])
        for (int k = 0; k < kPhaseMarks; ++k) slowest[k] = sum[k];
    }
    step_mean += mean[kEnd];
    // a phase's least wait for its inputs, over blocks: about the block that finished last, whose
    // wait is the propagation alone (the others' adds the skew between blocks)
    double least_wait = 0;
    for (int ph = 0; ph < l.n_phases; ++ph) {
      if (kind_of(ph) != kind) continue;
      double least = 1e300;
      for (int b = 0; b < l.grid; ++b)
        least = std::min(least, double(cycles[(size_t(b) * l.n_phases + ph) * kPhaseMarks]) * us);
      least_wait += least;
    }
    char line[360];
    auto part = [&](const double(&m)[kPhaseMarks], PhaseMark to, PhaseMark from) {
      return m[to] - m[from];
    };
    std::snprintf(line, sizeof(line),
                  " %s inputs %.1f/%.1f (least a phase %.1f), to the products %.1f/%.1f, products "
                  "to the first warp "
                  "done %.1f/%.1f (chunk waits %.1f/%.1f), to the last %.1f/%.1f, barrier "
                  "%.1f/%.1f, all %.1f/%.1f;",
                  names[kind], mean[kInputs], slowest[kInputs], least_wait,
                  part(mean, kReady, kInputs), part(slowest, kReady, kInputs),
                  part(mean, kFirstDone, kReady), part(slowest, kFirstDone, kReady), mean[kChunks],
                  slowest[kChunks], part(mean, kLastDone, kFirstDone),
                  part(slowest, kLastDone, kFirstDone), part(mean, kEnd, kLastDone),
                  part(slowest, kEnd, kLastDone), mean[kEnd], slowest[kEnd]);
    out += line;
  }
  // A's and C's sliced products by stage, from the products' start (kReady)
  for (int kind : {int(kQkv), int(kMlp)}) {
    const double* m = means[kind];
    if (m[kStage3] <= 0) continue;  // the pairs form: no stages
    char line[200];
    std::snprintf(line, sizeof(line),
                  kind == kQkv
                      ? " q/k/v products: warp 0's slices %.1f, then all warps' %.1f, then "
                        "the rows stored %.1f;"
                      : " mlp products: warp 0's gate slices %.1f, then its up slices "
                        "%.1f, then all warps' %.1f;",
                  m[kStage1] - m[kReady], m[kStage2] - m[kStage1], m[kStage3] - m[kStage2]);
    out += line;
  }
  // where B's and C's products go: from the products' start to the split-K's, then its chunks
  for (int kind : {int(kAttendO), int(kMlp)}) {
    const double* m = means[kind];
    char line[160];
    std::snprintf(line, sizeof(line),
                  " %s products to the split-K %.1f, its chunks %.1f, its staging on to the first "
                  "warp done the rest;",
                  names[kind], m[kSplitStart] - m[kReady], m[kSplitChunks] - m[kSplitStart]);
    out += line;
  }
  char total[64];
  std::snprintf(total, sizeof(total), " phases %.1f", step_mean);
  return out + total;
}

}  // namespace hk::decode
