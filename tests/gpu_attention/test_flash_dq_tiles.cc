// test_flash_dq_tiles.cc — the word order of the Hopper backward's tiled dq accumulator
// (flash_attn/dq_tiles.h, the functions the kernels call), without a GPU: every element of a
// 64-column block has one place; the conversion pass's inverse finds each word's elements; and
// what the bulk reduce-adds rely on — a warp's values (as the dK/dV kernel's accumulator holds
// them) form one contiguous 4 KB run, the runs in warp order, so one copy a warp or one a
// warpgroup covers exactly its part.
#include <gtest/gtest.h>

#include <vector>

#include "flash_attn/dq_tiles.h"

namespace {

using hk_flash::dq_tile_float;
using hk_flash::dq_tile_word;
using hk_flash::dq_tile_word_place;
using hk_flash::kDqWordsPerBlock;
using hk_flash::kDqWordsPerWarp;

TEST(FlashDqTiles, EveryElementHasOnePlace) {
  std::vector<int> seen(64 * 64, 0);
  for (int row = 0; row < 64; ++row)
    for (int col = 0; col < 64; ++col) {
      const int at = dq_tile_float(row, col);
      ASSERT_GE(at, 0);
      ASSERT_LT(at, 64 * 64);
      ++seen[at];
    }
  for (int at = 0; at < 64 * 64; ++at) EXPECT_EQ(seen[at], 1) << "float " << at;
  EXPECT_EQ(kDqWordsPerBlock * 4, 64 * 64);
}

// the conversion pass reads word w as (row, col), (row, col + 1), (row + 8, col), (row + 8, col +
// 1)
TEST(FlashDqTiles, WordPlaceInvertsTheOrder) {
  for (int w = 0; w < kDqWordsPerBlock; ++w) {
    const hk_flash::DqWordPlace at = dq_tile_word_place(w);
    EXPECT_EQ(dq_tile_float(at.row, at.col), 4 * w);
    EXPECT_EQ(dq_tile_float(at.row, at.col + 1), 4 * w + 1);
    EXPECT_EQ(dq_tile_float(at.row + 8, at.col), 4 * w + 2);
    EXPECT_EQ(dq_tile_float(at.row + 8, at.col + 1), 4 * w + 3);
  }
}

// Thread 32·warp + lane of a warpgroup holds, for column group j, accumulator values 4j .. 4j + 3:
// rows 16·warp + lane / 4 and + 8, columns 8j + 2·(lane % 4) and + 1 (the wgmma m64 layout); it
// stores them as word dq_tile_word(warp, j, lane). Those words must be the elements' places, and a
// warp's must fill [warp · 1 KB floats, + 1 KB) — the run a warp's bulk reduce-add sends from
// dq_tile_word(warp, 0, 0), starting at element (16·warp, 0).
TEST(FlashDqTiles, AWarpsValuesAreOneRun) {
  for (int warp = 0; warp < 4; ++warp) {
    std::vector<int> seen(kDqWordsPerWarp, 0);
    for (int lane = 0; lane < 32; ++lane)
      for (int j = 0; j < 8; ++j) {
        const int row = 16 * warp + lane / 4, col = 8 * j + 2 * (lane % 4);
        const int word = dq_tile_word(warp, j, lane);
        EXPECT_EQ(dq_tile_float(row, col), 4 * word);
        EXPECT_EQ(dq_tile_float(row + 8, col + 1), 4 * word + 3);
        const int in_run = word - dq_tile_word(warp, 0, 0);
        ASSERT_GE(in_run, 0);
        ASSERT_LT(in_run, kDqWordsPerWarp);
        ++seen[in_run];
      }
    for (int w = 0; w < kDqWordsPerWarp; ++w) EXPECT_EQ(seen[w], 1) << "warp " << warp;
    EXPECT_EQ(dq_tile_word(warp, 0, 0), warp * kDqWordsPerWarp);
    EXPECT_EQ(dq_tile_float(16 * warp, 0), 4 * warp * kDqWordsPerWarp);
  }
}

}  // namespace
