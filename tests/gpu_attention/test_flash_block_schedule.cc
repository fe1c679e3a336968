// test_flash_block_schedule.cc — the host model behind the Hopper backward's kv-head sections
// (flash_attn/block_schedule.h), without a GPU: the choices at issue 11's shapes on the H200's 132
// SMs (the L2-fitting section counts given as api.cu works them out from the 50 MiB of L2), and the
// model's own invariants.
#include <gtest/gtest.h>

#include "flash_attn/block_schedule.h"

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

// Sections sized by L2 alone start the last sections' heaviest blocks late at S = 2048 (measured:
// the backward 345-356 TF/s against 407-411 in one section), so one section is kept there; at
// S8192 two kv heads a section end as early as one section, three do not; at S16384 one does.
TEST(FlashBlockSchedule, SectionsAtIssueElevenShapes) {
  const auto train = backward_block_work(2048, 2048, 2, true);
  EXPECT_GT(schedule_tail(train, 32, 6, kSms), schedule_tail(train, 32, 32, kSms) + 0.1);
  EXPECT_EQ(choose_section(train, 32, 6, kSms), 32);                                    // B4×S2048
  EXPECT_EQ(choose_section(train, 64, 6, kSms), 64);                                    // B8×S2048
  EXPECT_EQ(choose_section(backward_block_work(8192, 8192, 1, true), 32, 3, kSms), 2);  // B2×S8192
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

}  // namespace
