// hk/allocator.h — memory for tensors: 64-byte aligned host memory and a CUDA caching allocator.
//
// CUDA memory is cudaMalloc'd in blocks that are cached and reused after free, stream-ordered: a
// block freed on one stream is reused only by allocations on the same stream (no host syncs). The
// allocator never uses managed memory. Statistics let benchmarks report peak memory.
//
// CUDA-graph capture: a captured graph replays the addresses its kernels were recorded with, so
// the blocks it used must stay out of the shared cache for its whole life. A GraphPool is a
// private set of blocks for one graph (or a family of graphs sharing buffers); while a
// GraphPoolScope is active on a thread, that thread's CUDA allocations come from the pool and
// their frees go back to it. A warm-up pass with device mallocs allowed sizes the pool; the capture
// then runs with them forbidden, and the pool matches sizes exactly, so the capture's allocation
// sequence (the warm-up's) is served without a cudaMalloc. A miss during capture throws instead of
// calling cudaMalloc. This header does not expose the pool layout, only what users can act on.
#pragma once

#include <cstddef>
#include <cstdint>

#include "hk/device.h"
#include "hk/stream.h"

namespace hk {

struct MemoryStats {
  size_t allocated = 0;       // bytes handed out to live tensors (rounded block sizes)
  size_t reserved = 0;        // bytes obtained from cudaMalloc and not yet returned
  size_t peak_allocated = 0;  // high-water mark of `allocated` since the last reset
  size_t peak_reserved = 0;
  size_t num_allocs = 0;          // allocation calls since start
  size_t num_device_mallocs = 0;  // cudaMalloc calls since start (cache misses)
};

// Allocates `bytes` (may be 0) on `device`; for CUDA the block belongs to `stream`.
void* device_alloc(Device device, size_t bytes, Stream stream = {});
// Frees memory from device_alloc. CUDA blocks return to the cache.
void device_free(Device device, void* ptr);

MemoryStats memory_stats(Device device);
void reset_peak_memory_stats(Device device);
// Returns cached, unused CUDA blocks to the driver.
void empty_cache(Device device);

// A private pool of CUDA blocks (see above). Destroying it frees its cached blocks (the owner
// first makes sure no graph using them still runs); blocks still held by tensors are freed to the
// driver when those tensors go.
class GraphPool {
 public:
  explicit GraphPool(Device device);
  ~GraphPool();
  GraphPool(const GraphPool&) = delete;
  GraphPool& operator=(const GraphPool&) = delete;
  Device device() const { return device_; }
  size_t reserved_bytes() const;  // bytes of blocks this pool obtained from cudaMalloc
  size_t num_device_mallocs() const;

 private:
  friend class GraphPoolScope;
  Device device_;
  void* key_;  // the pool's identity in the allocator's free lists
};

// Routes this thread's allocations on the pool's device to `pool` until destroyed (scopes nest;
// the innermost wins). With `allow_device_malloc` false a request the pool cannot serve from its
// free blocks throws hk::RuntimeFailure naming the size, instead of calling cudaMalloc.
class GraphPoolScope {
 public:
  GraphPoolScope(GraphPool& pool, bool allow_device_malloc);
  ~GraphPoolScope();
  GraphPoolScope(const GraphPoolScope&) = delete;
  GraphPoolScope& operator=(const GraphPoolScope&) = delete;

  void* pool_key() const { return key_; }
  int device_index() const { return device_index_; }
  bool allows_device_malloc() const { return allow_device_malloc_; }
  // The innermost scope active on this thread, or null.
  static const GraphPoolScope* current();

 private:
  void* key_;
  int device_index_;
  bool allow_device_malloc_;
  const GraphPoolScope* previous_;
};

}  // namespace hk
