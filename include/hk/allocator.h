// hk/allocator.h — memory for tensors: 64-byte aligned host memory and a CUDA caching allocator.
//
// CUDA memory is cudaMalloc'd in blocks that are cached and reused after free, stream-ordered: a
// block freed on one stream is reused only by allocations on the same stream (no host syncs). The
// allocator never uses managed memory. Statistics let benchmarks report peak memory. This header
// does not expose the pool layout, only what users can act on.
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

}  // namespace hk
