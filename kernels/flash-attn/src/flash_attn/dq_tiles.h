// flash_attn/dq_tiles.h — the word order inside one 64-row tile of the Hopper backward's tiled dq
// accumulator, as host+device functions: the dK/dV kernel stages its dQ in this order and sends it
// by flat bulk reduce-adds, the conversion pass (bwd_tiles.cuh) and the row passes (bwd_sm80.cuh,
// through dq_tiled_index) read it back, and a CPU test checks that the order is a bijection and
// that each warp's part is one contiguous run. Not here: where a tile lies in the accumulator
// (dq_tiled_index, device_common.cuh) or anything of the kernels' barriers.
#pragma once

#if defined(__CUDACC__)
#define HK_FLASH_DQ_HD __host__ __device__ __forceinline__
#else
#define HK_FLASH_DQ_HD inline
#endif

namespace hk_flash {

constexpr int kDqTileRows = 64;
// A tile is D/64 column blocks of 64 × 64 floats (16 KB, one warpgroup's dQ part), each as 1,024
// 16-byte words. A warpgroup's thread 32·warp + lane (g = lane / 4, t4 = lane % 4) holds, in
// accumulator order, rows 16·warp + g and + 8 of columns 8j + 2·t4 and + 1 for column groups
// j = 0..7: its word (warp, j, lane) = {row r: col, col + 1; row r + 8: col, col + 1}. Words go
// [warp][j][lane], so a warp's 16 rows are 4 KB in a row and a warp can send its own part by one
// bulk reduce-add, without a barrier across the warpgroup.
constexpr int kDqWordsPerWarp = 8 * 32;
constexpr int kDqWordsPerBlock = 4 * kDqWordsPerWarp;

HK_FLASH_DQ_HD int dq_tile_word(int warp, int j, int lane) {
  return (warp * 8 + j) * 32 + lane;
}

// The float offset, within its 64-column block, of element (row, col) of a tile (row < 64,
// col < 64): the word that holds it times 4, plus its place in the word.
HK_FLASH_DQ_HD int dq_tile_float(int row, int col) {
  const int warp = row / 16, g = row % 8, t4 = (col % 8) / 2;
  return dq_tile_word(warp, col / 8, 4 * g + t4) * 4 + 2 * ((row / 8) & 1) + (col & 1);
}

// Row and first column of word `word` (< kDqWordsPerBlock) of a 64-column block: the word holds
// (row, col), (row, col + 1), (row + 8, col), (row + 8, col + 1).
struct DqWordPlace {
  int row, col;
};
HK_FLASH_DQ_HD DqWordPlace dq_tile_word_place(int word) {
  const int lane = word % 32, j = (word / 32) % 8, warp = word / kDqWordsPerWarp;
  return {16 * warp + lane / 4, 8 * j + 2 * (lane % 4)};
}

}  // namespace hk_flash
