// flash_attn/stream_jobs.h — which (head, position) a block of a Hopper kernel's 1-D grid takes,
// and which query tiles ("jobs") a block of the streaming forwards (v4, v5) works through, as
// host+device functions: the kernels call them, and the CPU tests check on the host that every
// query tile is some block's job exactly once, that no block's jobs overflow its table and how
// evenly the work spreads. Not here: anything of the kernels' copies or barriers.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define HK_FLASH_HD __host__ __device__ __forceinline__
#else
#define HK_FLASH_HD inline
#endif

namespace hk_flash {

// Blocks start in launch order as SMs free up, so the order is the schedule: heads (batch-major,
// GQA groups adjacent) go in sections whose streamed tensors fit in L2 together
// (forward_heads_per_section, backward_heads_per_section), and inside a section every head's
// heaviest position comes first, then the next, the lightest last. Under causal masks a block's
// work grows with its position; the order by head (every position of one head, then the next)
// left the last heads' heaviest blocks to start among the last, with the other SMs idle while
// they ran: a list-scheduling model of 132 SMs puts that tail at 5-7 % of the forward's run at
// B8 × H16 × S2048 and B2 × H16 × S8192, under 1 % longest-first. Measured on the H200 (same
// call): the forward's v2 at B2 × H16 × S8192 608-609 TF/s against 580 by head, B1 × H32 ×
// S16384 645 against 626-643, B8 × H16 × S2048 450-452 against 448-449; every head in one section
// (no L2 grouping) gained nothing (577-582, 625-640, 456). One section of every head is
// position-major order across all heads.
struct BlockOrder {
  int head, x;  // head: b · heads + h; x: 0 = the heaviest position
};
// (of the block, or v4/v5 unit, with launch index `index`)
HK_FLASH_HD BlockOrder block_order_of(int index, int heads, int positions, int heads_per_section) {
  const int per_section = heads_per_section * positions;
  const int section = index / per_section;
  const int r = index - section * per_section;
  const int first = section * heads_per_section;
  const int here = heads_per_section < heads - first ? heads_per_section : heads - first;
  const int x = r / here;
  return {first + (r - x * here), x};
}

// The streaming forwards' jobs. A block takes a unit of each round of the order (`grid` units):
// - the snake (v4's default): units are query tiles (m-block M-1-x), forwards in even rounds and
//   backwards in odd ones — heavy tiles come first, so a plain stride would hand block 0 the
//   heaviest tile of every round (at S = 16384, ~17 % more key tiles than the last block); the
//   snake evens that out over pairs of rounds, but its rounds cut across the head sections (the
//   heaviest block 21 % over the mean at S = 8192);
// - pairs (v5's default): units are v3's pairs of m-blocks M-1-x and x (equal work under causal
//   masks) in a plain stride, each two jobs (heavy, then light; the middle m-block of an odd
//   count has an empty partner), so the blocks balance to one pair whatever the sections.
struct StreamJob {
  int head;     // b · heads + h
  int m_block;  // < 0: an empty job (no rows, no keys)
};
// Positions of pairs of m-blocks a head (v3's blocks, v5's units): the middle one of an odd count
// alone.
HK_FLASH_HD int stream_pair_positions(int m_blocks) {
  return (m_blocks + 1) / 2;
}
// How many jobs block bx of `grid` has.
HK_FLASH_HD int stream_job_count(bool pairs, int bx, int grid, int m_blocks, int heads) {
  if (pairs) {
    const int units = stream_pair_positions(m_blocks) * heads;
    return bx < units ? 2 * ((units - 1 - bx) / grid + 1) : 0;
  }
  const int units = m_blocks * heads;
  const int rounds = units / grid, rest = units % grid;
  const int last = rounds * grid + ((rounds & 1) ? grid - 1 - bx : bx);
  return rounds + (rest > 0 && last < units ? 1 : 0);
}
// Job j of block bx.
HK_FLASH_HD StreamJob stream_job(bool pairs, int j, int bx, int grid, int m_blocks, int heads,
                                 int heads_per_section) {
  if (!pairs) {
    const int index = j * grid + ((j & 1) ? grid - 1 - bx : bx);
    const BlockOrder o = block_order_of(index, heads, m_blocks, heads_per_section);
    return {o.head, m_blocks - 1 - o.x};
  }
  const BlockOrder o = block_order_of((j / 2) * grid + bx, heads, stream_pair_positions(m_blocks),
                                      heads_per_section);
  const int heavy = m_blocks - 1 - o.x;
  if ((j & 1) == 0) return {o.head, heavy};
  return {o.head, o.x < heavy ? o.x : -1};
}
// The streaming forwards' grid: `want` blocks (the SM count), no more than there are units, and
// enough that no block has more than `job_table` jobs.
inline int64_t stream_grid(bool pairs, int m_blocks, int heads, int job_table, int want) {
  const int64_t units =
      static_cast<int64_t>(pairs ? stream_pair_positions(m_blocks) : m_blocks) * heads;
  const int64_t per_table = pairs ? job_table / 2 : job_table;
  const int64_t table_blocks = (units + per_table - 1) / per_table;
  const int64_t blocks = units < want ? units : want;
  const int64_t grid = blocks > table_blocks ? blocks : table_blocks;
  return grid > 0 ? grid : 1;  // nothing to do: one block that returns at once
}

}  // namespace hk_flash
