// device_emulation.h — a CPU emulation of the CUDA device, enough to run kernels-community/
// megablocks' cuda variant (kernels/megablocks/src/cuda) as host C++ and check its logic on a
// machine without a GPU: tile scheduling, the permutation, fragment layouts of ldmatrix/mma.sync,
// epilogues, workspace carving, every index. Included through MEGABLOCKS_DEVICE_EMULATION (see
// device_compat.cuh) before the kernels' sources.
//
// Model: a launch runs its blocks one after another; each block's threads are fibers scheduled
// round-robin on the calling thread, switching only at __syncthreads and warp collectives (which
// are real rendezvous: a thread that skips one deadlocks the block, and that is reported);
// "device" memory is host memory; cp.async completes at issue (a legal schedule of an async copy);
// shared memory is one static buffer (blocks never overlap). Warp-collective PTX (ldmatrix,
// mma.m16n8k16, shfl.xor) is computed from every lane's operands per the PTX ISA fragment layouts.
// It says nothing about timing, occupancy, races between blocks or the memory model: only the GPU
// run checks those. Runtime entry points the kernels call (cudaGetDevice, occupancy, ...) are
// defined in device_emulation.cc with small fixed answers (3 SMs, 1 block per SM) so that
// persistent kernels loop over several tiles per block.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <ucontext.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <vector>

// The CUDA qualifiers, as plain C++.
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__ static  // one block at a time: a function-local static is the block's
#define __forceinline__ inline
#define __launch_bounds__(...)

namespace emu {

struct Idx {
  unsigned x = 0, y = 0, z = 0;
};
inline Idx g_thread, g_block, g_grid, g_block_dim;  // of the running emulated thread
alignas(16) inline unsigned char g_shared[232448];  // the largest sm_90 block allocation

// One block: its threads as fibers (ucontext) scheduled round-robin on the calling OS thread. A
// fiber runs until it waits at a barrier; the scheduler then resumes the next one.
struct Block {
  struct Fiber {
    ucontext_t ctx;
    std::unique_ptr<char[]> stack;
    unsigned index = 0;
    bool done = false;
  };
  struct Barrier {
    int arrived = 0;
    uint64_t generation = 0;
  };
  struct Warp {
    Barrier bar;
    uint64_t slot[2][32][8] = {};  // double-buffered by barrier generation
  };
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  Barrier all;
  ucontext_t scheduler;
  int current = 0;
  int threads = 0;
  const std::function<void()>* body = nullptr;
};
inline Block* g_running = nullptr;

inline void yield_to_scheduler() {
  Block& b = *g_running;
  swapcontext(&b.fibers[b.current].ctx, &b.scheduler);
}
inline void barrier(Block::Barrier& bar, int participants) {
  const uint64_t mine = bar.generation;
  if (++bar.arrived == participants) {
    bar.arrived = 0;
    ++bar.generation;
    return;
  }
  while (bar.generation == mine) yield_to_scheduler();
}

inline void fiber_main() {
  Block& b = *g_running;
  (*b.body)();
  b.fibers[b.current].done = true;
  // returning resumes uc_link: the scheduler
}

inline int lane() {
  return static_cast<int>(g_thread.x % 32);
}
inline Block::Warp& warp() {
  return g_running->warps[g_thread.x / 32];
}

// Runs `body` on every thread of every block of the grid (blocks in order).
inline void run_grid(dim3 grid, dim3 block_dim, const std::function<void()>& body) {
  constexpr size_t kStack = 64 * 1024;
  const int threads = static_cast<int>(block_dim.x * block_dim.y * block_dim.z);
  g_grid = {grid.x, grid.y, grid.z};
  g_block_dim = {block_dim.x, block_dim.y, block_dim.z};
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        Block b;
        b.threads = threads;
        b.body = &body;
        b.fibers.resize(threads);
        b.warps.resize((threads + 31) / 32);
        g_running = &b;
        g_block = {bx, by, bz};
        for (int t = 0; t < threads; ++t) {
          Block::Fiber& f = b.fibers[t];
          f.index = static_cast<unsigned>(t);
          f.stack.reset(new char[kStack]);
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = f.stack.get();
          f.ctx.uc_stack.ss_size = kStack;
          f.ctx.uc_link = &b.scheduler;
          makecontext(&f.ctx, fiber_main, 0);
        }
        for (int remaining = threads; remaining > 0;) {
          const uint64_t before = b.all.generation;
          uint64_t warp_before = 0;
          for (const auto& w : b.warps) warp_before += w.bar.generation;
          const int was = remaining;
          for (int t = 0; t < threads; ++t) {
            if (b.fibers[t].done) continue;
            b.current = t;
            g_thread = {static_cast<unsigned>(t), 0, 0};
            swapcontext(&b.scheduler, &b.fibers[t].ctx);
            if (b.fibers[t].done) --remaining;
          }
          uint64_t warp_after = 0;
          for (const auto& w : b.warps) warp_after += w.bar.generation;
          if (remaining == was && b.all.generation == before && warp_after == warp_before) {
            std::fprintf(stderr,
                         "device emulation: block deadlocked (a barrier some threads "
                         "never reach)\n");
            std::abort();
          }
        }
        g_running = nullptr;
      }
}

template <class... P>
struct Launch {
  void (*kernel)(P...);
  dim3 grid, block;
  template <class... A>
  void operator()(A&&... args) const {
    auto k = kernel;
    std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);  // by value, as a launch
    run_grid(grid, block, [&] { std::apply(k, params); });
  }
};
template <class... P>
Launch<P...> launch_of(void (*kernel)(P...), dim3 grid, dim3 block) {
  return {kernel, grid, block};
}

// Every lane publishes `mine` (up to 8 words) and reads all lanes' once everyone has. The slots
// alternate by barrier generation, so the next exchange cannot overwrite what a slow lane reads.
template <class F>
void warp_exchange(const uint64_t* mine, int words, F&& read_all) {
  Block::Warp& w = warp();
  const int buffer = static_cast<int>(w.bar.generation % 2);
  std::memcpy(w.slot[buffer][lane()], mine, words * sizeof(uint64_t));
  barrier(w.bar, 32);
  read_all(w.slot[buffer]);
}

inline uint16_t load16(const void* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// ldmatrix .x4: lane l gives the address of row l % 8 of matrix l / 8; a lane gets, per matrix,
// the two 16-bit elements of row lane/4 at columns 2·(lane%4) (+ .trans: of the transpose).
inline void ldmatrix(uint32_t (&r)[4], const void* address, bool trans) {
  const uint64_t mine = reinterpret_cast<uint64_t>(address);
  warp_exchange(&mine, 1, [&](const uint64_t(*slot)[8]) {
    const int l = lane();
    for (int m = 0; m < 4; ++m) {
      uint16_t e[2];
      for (int q = 0; q < 2; ++q) {
        const int row = trans ? 2 * (l % 4) + q : l / 4;
        const int col = trans ? l / 4 : 2 * (l % 4) + q;
        const auto* base = reinterpret_cast<const unsigned char*>(slot[m * 8 + row][0]);
        e[q] = load16(base + 2 * col);
      }
      r[m] = static_cast<uint32_t>(e[0]) | (static_cast<uint32_t>(e[1]) << 16);
    }
  });
}

inline float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
inline float to_float(__half v) {
  return __half2float(v);
}
template <class T>
float half_to_f32(uint32_t reg, int q) {
  const uint16_t bits = static_cast<uint16_t>(q ? reg >> 16 : reg & 0xffffu);
  T v;
  std::memcpy(&v, &bits, 2);
  return to_float(v);
}

// mma.m16n8k16 row.col, f32 accumulate: A 16×16 (a0: rows g, k 2c..; a1: rows g+8; a2: k+8;
// a3: both), B 16×8 (b0: k 2c.., n g; b1: k+8), D 16×8 (d0,d1: row g, cols 2c..; d2,d3: g+8),
// with g = lane/4, c = lane%4.
template <class T>
void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const uint64_t mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
  warp_exchange(mine, 6, [&](const uint64_t(*slot)[8]) {
    auto A = [&](int row, int k) {
      const int owner = (row % 8) * 4 + (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
      return half_to_f32<T>(static_cast<uint32_t>(slot[owner][reg]), k % 2);
    };
    auto B = [&](int k, int n) {
      const int owner = n * 4 + (k % 8) / 2, reg = k >= 8 ? 5 : 4;
      return half_to_f32<T>(static_cast<uint32_t>(slot[owner][reg]), k % 2);
    };
    const int g = lane() / 4, c = lane() % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = g + (i >= 2 ? 8 : 0), col = 2 * c + (i % 2);
      float acc = d[i];
      for (int k = 0; k < 16; ++k) acc += A(row, k) * B(k, col);
      d[i] = acc;
    }
  });
}

}  // namespace emu

// ---- what the kernels call ---------------------------------------------------------------------
#undef threadIdx
#undef blockIdx
#undef gridDim
#undef blockDim
#define threadIdx (::emu::g_thread)
#define blockIdx (::emu::g_block)
#define gridDim (::emu::g_grid)
#define blockDim (::emu::g_block_dim)
#define MB_LAUNCH(kernel, grid, block, smem, stream) \
  ::emu::launch_of(kernel, dim3(grid), dim3(block))
#define MB_EXTERN_SHARED(type, name) type* name = reinterpret_cast<type*>(::emu::g_shared)

inline void __syncthreads() {
  ::emu::barrier(::emu::g_running->all, ::emu::g_running->threads);
}
inline float __shfl_xor_sync(unsigned, float v, int mask) {
  uint64_t mine;
  std::memcpy(&mine, &v, sizeof v);
  float out = 0.0f;
  ::emu::warp_exchange(&mine, 1, [&](const uint64_t(*slot)[8]) {
    std::memcpy(&out, &slot[::emu::lane() ^ mask][0], sizeof out);
  });
  return out;
}
inline int atomicAdd(int* p, int v) {  // one OS thread: no contention
  const int old = *p;
  *p += v;
  return old;
}

namespace megablocks::cuda {

inline void cp_async16(void* smem, const void* gmem, bool valid) {
  if (valid)
    std::memcpy(smem, gmem, 16);
  else
    std::memset(smem, 0, 16);
}
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}
inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  ::emu::ldmatrix(r, smem, false);
}
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  ::emu::ldmatrix(r, smem, true);
}
template <class T>
inline void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  ::emu::mma16816<T>(d, a, b0, b1);
}

}  // namespace megablocks::cuda
