// test_flash_block_schedule.cc — the host model behind the Hopper backward's kv-head sections
// (flash_attn/block_schedule.h), without a GPU: the choices at issue 11's shapes on the H200's 132
// SMs (the L2-fitting section counts given as api.cu works them out from the 50 MiB of L2), and the
// model's own invariants; and the streaming forwards' jobs (flash_attn/stream_jobs.h, the same
// functions the kernels call): every query tile some block's job exactly once, no block's jobs
// past its table, and how evenly the key tiles spread in each order.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "flash_attn/block_schedule.h"
#include "flash_attn/stream_jobs.h"

namespace {

using hk_flash::backward_block_work;
using hk_flash::choose_section;
using hk_flash::schedule_tail;

constexpr int kSms = 132;

// Causal work falls with the key position: the first key block is seen by every query tile.
TEST(FlashBlockSchedule, CausalWorkFallsWithPosition) {
  const std::vector<double> w = backward_block_work(2048, 2048, 2, true);
  ASSERT_EQ(w.size(), 16u);
  EXPECT_DOUBLE_EQ(w[0], 1.0 + 2 * 32);  // 32 query tiles of 64 rows, GQA group of 2
  EXPECT_DOUBLE_EQ(w[15], 1.0 + 2 * 2);
  for (size_t n = 1; n < w.size(); ++n) EXPECT_LT(w[n], w[n - 1]);
  const std::vector<double> full = backward_block_work(300, 1030, 1, false);
  ASSERT_EQ(full.size(), 9u);
  for (double x : full) EXPECT_DOUBLE_EQ(x, 1.0 + 5);  // every key block sees all 5 query tiles
}

// Sections sized by L2 alone can start the last sections' heaviest blocks late: at S = 2048 six kv
// heads a section (32 / 6 ragged) measured the backward 345-356 TF/s against 407-411 in one
// section; eight (api.cu's 3/4 of L2 holds 9 heads' Q, dO and dq) tail 1.031 and measured faster
// than one section (the dK/dV kernel 671 against 718 µs at B8). At S8192 four kv heads a section
// end as early as one section; at S16384 one head does.
TEST(FlashBlockSchedule, SectionsAtIssueElevenShapes) {
  const auto train = backward_block_work(2048, 2048, 2, true);
  EXPECT_GT(schedule_tail(train, 32, 6, kSms), schedule_tail(train, 32, 32, kSms) + 0.1);
  EXPECT_EQ(choose_section(train, 32, 9, kSms), 8);                                     // B4×S2048
  EXPECT_EQ(choose_section(train, 64, 9, kSms), 8);                                     // B8×S2048
  EXPECT_EQ(choose_section(backward_block_work(8192, 8192, 1, true), 32, 4, kSms), 4);  // B2×S8192
  EXPECT_EQ(choose_section(backward_block_work(16384, 16384, 4, true), 8, 1, kSms), 1);
}

TEST(FlashBlockSchedule, Invariants) {
  const auto w = backward_block_work(4096, 4096, 2, true);
  for (int section : {1, 3, 16})
    EXPECT_GE(schedule_tail(w, 16, section, kSms), 1.0 - 1e-9) << section;
  // equal work: any section schedules as well as one, so the largest that fits
  EXPECT_EQ(choose_section(backward_block_work(4096, 4096, 2, false), 16, 5, kSms), 5);
  EXPECT_EQ(choose_section(w, 16, 16, kSms), 16);  // everything fits: one section
  EXPECT_EQ(choose_section(w, 16, 40, kSms), 16);
  EXPECT_EQ(choose_section(w, 16, 4, 0), 16);  // no SM count: one section
  EXPECT_DOUBLE_EQ(schedule_tail({}, 4, 1, kSms), 1.0);
}

// The streaming forwards' jobs over a grid: each block's (head, m-block) list, as the kernels
// walk it (fwd_sm90.cuh job_of: an m-block < 0 is an empty job).
std::vector<std::vector<hk_flash::StreamJob>> stream_jobs(bool pairs, int grid, int m_blocks,
                                                          int heads, int section) {
  std::vector<std::vector<hk_flash::StreamJob>> blocks(grid);
  for (int bx = 0; bx < grid; ++bx) {
    const int n = hk_flash::stream_job_count(pairs, bx, grid, m_blocks, heads);
    for (int j = 0; j < n; ++j)
      blocks[bx].push_back(hk_flash::stream_job(pairs, j, bx, grid, m_blocks, heads, section));
  }
  return blocks;
}
constexpr int kJobTable = 96;  // Sm90Config<...>::kJobTable for v4 and v5

// Every query tile of every head exactly once, over odd and even m-block counts (the middle
// m-block's empty partner), one m-block, grids of one block, a few and more than there are
// units, head sections of one, a few and all; and the launcher's grid never gives a block more
// jobs than its table holds.
TEST(FlashStreamJobs, EveryQueryTileOnceAndTablesHoldTheJobs) {
  for (bool pairs : {false, true})
    for (auto [heads, m_blocks] : std::vector<std::pair<int, int>>{
             {1, 1}, {8, 1}, {8, 5}, {3, 7}, {16, 2}, {128, 16}, {32, 64}, {32, 128}, {1, 257}})
      for (int section : {1, 3, heads})
        for (int want : {1, 3, 7, 132, 100000}) {
          SCOPED_TRACE(std::string(pairs ? "pairs" : "snake") + " heads " + std::to_string(heads) +
                       " m_blocks " + std::to_string(m_blocks) + " section " +
                       std::to_string(section) + " want " + std::to_string(want));
          const int grid =
              static_cast<int>(hk_flash::stream_grid(pairs, m_blocks, heads, kJobTable, want));
          ASSERT_GE(grid, 1);
          std::vector<int> seen(static_cast<size_t>(heads) * m_blocks, 0);
          int empty = 0;
          for (const auto& jobs : stream_jobs(pairs, grid, m_blocks, heads, section)) {
            EXPECT_LE(jobs.size(), static_cast<size_t>(kJobTable));
            for (size_t j = 0; j < jobs.size(); ++j) {
              const hk_flash::StreamJob& job = jobs[j];
              ASSERT_GE(job.head, 0);
              ASSERT_LT(job.head, heads);
              ASSERT_LT(job.m_block, m_blocks);
              if (job.m_block < 0) {
                EXPECT_TRUE(pairs && j % 2 == 1) << "an empty job is only a pair's light one";
                ++empty;
                continue;
              }
              ++seen[static_cast<size_t>(job.head) * m_blocks + job.m_block];
            }
          }
          for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "tile " << i;
          EXPECT_EQ(empty, pairs && m_blocks % 2 == 1 ? heads : 0);
        }
}

// Key tiles a block works through at S = T, causal (m-block m sees m + 1 key tiles): the heaviest
// block over the mean on 132 blocks. Pairs hold every target shape within one pair of the mean
// (3.1 %) whatever the head sections; the snake's rounds cut across the sections forward's L2
// picks (50 MiB: 50, 6 and 12 heads a section at B8 × H16(kv8) × S2048, B2 × H16 × S8192 and
// B1 × H32(kv8) × S16384), 21 % over at S8192.
double heaviest_over_mean(bool pairs, int m_blocks, int heads, int section) {
  const int grid = static_cast<int>(hk_flash::stream_grid(pairs, m_blocks, heads, kJobTable, kSms));
  std::vector<double> work;
  for (const auto& jobs : stream_jobs(pairs, grid, m_blocks, heads, section)) {
    double w = 0;
    for (const hk_flash::StreamJob& job : jobs) w += job.m_block + 1;  // empty: m_block -1
    work.push_back(w);
  }
  const double mean = std::accumulate(work.begin(), work.end(), 0.0) / work.size();
  return *std::max_element(work.begin(), work.end()) / mean;
}
TEST(FlashStreamJobs, PairsBalanceWhateverTheSections) {
  for (auto [m_blocks, heads, section] :
       std::vector<std::tuple<int, int, int>>{{16, 128, 50}, {64, 32, 6}, {128, 32, 12}}) {
    SCOPED_TRACE("m_blocks " + std::to_string(m_blocks));
    EXPECT_LT(heaviest_over_mean(true, m_blocks, heads, section), 1.035);
    EXPECT_LT(heaviest_over_mean(true, m_blocks, heads, 1), 1.035);
    EXPECT_LT(heaviest_over_mean(true, m_blocks, heads, heads), 1.035);
  }
  EXPECT_GT(heaviest_over_mean(false, 64, 32, 6), 1.15);  // the snake at S8192's sections
}

}  // namespace
