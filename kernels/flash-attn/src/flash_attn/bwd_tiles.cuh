// flash_attn/bwd_tiles.cuh — the memory-bound passes around the Hopper backward's dK/dV kernel,
// a 64-row tile of one (batch, head) a block, over its tiled dq accumulator (dq_tiled_index):
//   flash_bwd_preprocess_tiles_kernel: Di = Σ_d dO·O for the tile's rows, and the tile of the
//     accumulator cleared (rows past S too: the kernel's bulk reduce-adds write whole tiles);
//   flash_bwd_convert_dq_tiles_kernel: dq = scale · accumulator, the tile regrouped into rows
//     through shared memory.
// Why a tile a block: the row-a-warp passes (bwd_sm80.cuh) read and write 4- and 8-byte words,
// and the accumulator was cleared by a memset launch of its own; here every global access is a
// 16-byte word (8-byte dq stores), consecutive across a warp.
// Needs 16-byte aligned O and dO rows and 8-byte aligned dq rows (the launcher checks, and takes
// the row passes otherwise). Not here: varlen or the row-major accumulator (the mma.sync
// backward's and the atomic dq's), the deterministic dq kernel.
#pragma once

#include "flash_attn/device_common.cuh"

namespace hk_flash {

// 256 threads; row r of the tile is read by D/8 consecutive threads, a 16-byte chunk each.
template <class T, int D>
__global__ void __launch_bounds__(256)
    flash_bwd_preprocess_tiles_kernel(const BackwardParams p, float* di, float* dq_accum) {
  constexpr int kChunks = D / 8, kRowsPerPass = 256 / kChunks;
  const int m0 = blockIdx.x * kDqTileRows, h = blockIdx.y, b = blockIdx.z;
  const int c = threadIdx.x % kChunks, r_in_pass = threadIdx.x / kChunks;
  const SeqInfo seq = seq_info(p, b);
  const T* o = static_cast<const T*>(p.out);
  const T* dout = static_cast<const T*>(p.dout);
  float dots[kDqTileRows / kRowsPerPass];
  // every load issued before any is used: the pass is bound by how many bytes are in flight
  uint4 ov[kDqTileRows / kRowsPerPass], dov[kDqTileRows / kRowsPerPass];
#pragma unroll
  for (int i = 0; i < kDqTileRows / kRowsPerPass; ++i) {
    const int s = m0 + r_in_pass + i * kRowsPerPass;
    ov[i] = dov[i] = make_uint4(0, 0, 0, 0);
    if (s < seq.S) {
      ov[i] = __ldg(reinterpret_cast<const uint4*>(
          o + row_offset(p.out_strides, b, seq.q_row0, s, h) + 8 * c));
      dov[i] = __ldg(reinterpret_cast<const uint4*>(
          dout + row_offset(p.dout_strides, b, seq.q_row0, s, h) + 8 * c));
    }
  }
  float4* tile = reinterpret_cast<float4*>(dq_accum + dq_tiled_index(p, b, m0, h, 0));
#pragma unroll
  for (int i = threadIdx.x; i < kDqTileRows * D / 4; i += 256) tile[i] = make_float4(0, 0, 0, 0);
#pragma unroll
  for (int i = 0; i < kDqTileRows / kRowsPerPass; ++i) {
    const uint32_t* ow = reinterpret_cast<const uint32_t*>(&ov[i]);
    const uint32_t* dw = reinterpret_cast<const uint32_t*>(&dov[i]);
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float2 a = unpack2<T>(ow[w]), d = unpack2<T>(dw[w]);
      acc = fmaf(a.x, d.x, fmaf(a.y, d.y, acc));
    }
#pragma unroll
    for (int off = kChunks / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    dots[i] = acc;
  }
  if (c == 0) {
#pragma unroll
    for (int i = 0; i < kDqTileRows / kRowsPerPass; ++i) {
      const int s = m0 + r_in_pass + i * kRowsPerPass;
      if (s < seq.S) di[di_offset(p, b, seq.q_row0, s, h)] = dots[i];
    }
  }
}

// 256 threads: the tile's float4 words (rows r and r + 8, two adjacent columns each, in the order
// of dq_tiles.h) are scattered into a [64][D + 8] f32 tile in shared memory, then each thread
// writes 4 columns of a row at a time (8-byte stores; 16 threads cover 128 contiguous bytes of a
// row at head dim 128).
template <class T, int D>
__global__ void __launch_bounds__(256)
    flash_bwd_convert_dq_tiles_kernel(const BackwardParams p, const float* dq_accum, float scale) {
  // D + 8: a half-warp's 8-byte stores (rows g = 0..3 of its quarter, columns 2·t4) land on 32
  // different banks
  constexpr int kStride = D + 8;
  __shared__ float rows[kDqTileRows * kStride];
  const int m0 = blockIdx.x * kDqTileRows, h = blockIdx.y, b = blockIdx.z;
  const SeqInfo seq = seq_info(p, b);
  const float4* tile = reinterpret_cast<const float4*>(dq_accum + dq_tiled_index(p, b, m0, h, 0));
#pragma unroll 4
  for (int f = threadIdx.x; f < kDqTileRows * D / 4; f += 256) {
    const float4 v = __ldg(tile + f);
    const DqWordPlace at = dq_tile_word_place(f % kDqWordsPerBlock);
    const int r = at.row, col = 64 * (f / kDqWordsPerBlock) + at.col;
    *reinterpret_cast<float2*>(&rows[r * kStride + col]) = make_float2(v.x, v.y);
    *reinterpret_cast<float2*>(&rows[(r + 8) * kStride + col]) = make_float2(v.z, v.w);
  }
  __syncthreads();
  T* dq = static_cast<T*>(p.dq);
  constexpr int kQuads = D / 4;
#pragma unroll 4
  for (int i = threadIdx.x; i < kDqTileRows * kQuads; i += 256) {
    const int r = i / kQuads, q = i % kQuads, s = m0 + r;
    if (s >= seq.S) continue;
    const float4 v = *reinterpret_cast<const float4*>(&rows[r * kStride + 4 * q]);
    uint2 out;
    out.x = pack2<T>(v.x * scale, v.y * scale);
    out.y = pack2<T>(v.z * scale, v.w * scale);
    *reinterpret_cast<uint2*>(dq + row_offset(p.dq_strides, b, seq.q_row0, s, h) + 4 * q) = out;
  }
}

}  // namespace hk_flash
