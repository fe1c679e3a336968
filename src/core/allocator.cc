// Host allocator (64-byte aligned) and the CUDA caching allocator.
//
// The CUDA cache keeps freed blocks in per-(device, stream) free lists keyed by size and hands the
// smallest block that fits within 25% (+1 MiB) of the request. Blocks are never split or merged:
// simple and good enough for the steady-state shapes of inference and training, where the same
// sizes recur every step. On cudaMalloc failure the cache is emptied and the call retried once.
//
// Graph pools (hk/allocator.h) keep their own free lists, apart from the per-stream ones, and match
// sizes exactly: the capture replays the warm-up's sequence of requests, so every request finds the
// block the warm-up freed. Emptying the cache never touches them; a pool's blocks go back to the
// driver when the pool is destroyed (or, for blocks still live then, when their tensor goes).
#include "hk/allocator.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>

#include "hk/error.h"
#ifdef HK_HAVE_CUDA
#include "core/cuda_check.h"
#endif

namespace hk {
namespace {

constexpr size_t kHostAlignment = 64;

thread_local const GraphPoolScope* t_scope = nullptr;

size_t round_up(size_t n, size_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

struct HostPool {
  std::mutex mutex;
  std::unordered_map<void*, size_t> sizes;
  MemoryStats stats;
};
HostPool& host_pool() {
  static HostPool pool;
  return pool;
}

void note_alloc(MemoryStats& s, size_t bytes) {
  s.allocated += bytes;
  s.num_allocs++;
  if (s.allocated > s.peak_allocated) s.peak_allocated = s.allocated;
}

#ifdef HK_HAVE_CUDA
struct CudaBlock {
  size_t size;
  void* stream;     // or the graph pool's key
  bool graph_pool;  // true: `stream` is a GraphPool key
};
struct GraphPoolInfo {
  std::multimap<size_t, void*> free_blocks;
  size_t reserved = 0;
  size_t mallocs = 0;
};
struct CudaPool {
  std::mutex mutex;
  std::unordered_map<void*, CudaBlock> live;
  // free blocks: stream -> (size -> ptr)
  std::map<void*, std::multimap<size_t, void*>> free_blocks;
  // live graph pools by key (a destroyed pool's key is absent)
  std::map<void*, GraphPoolInfo> graph_pools;
  MemoryStats stats;
};
constexpr int kMaxCudaDevices = 64;
CudaPool& cuda_pool(int device) {
  static CudaPool pools[kMaxCudaDevices];
  if (device < 0 || device >= kMaxCudaDevices) throw InvalidArgument("bad CUDA device index");
  return pools[device];
}
size_t cuda_round(size_t bytes) {
  if (bytes < (1u << 20)) return round_up(bytes ? bytes : 1, 512);
  return round_up(bytes, 1u << 20);  // ≥1 MiB: whole MiB, so recurring sizes share blocks
}
void release_free_blocks(CudaPool& pool) {
  for (auto& [stream, blocks] : pool.free_blocks) {
    for (auto& [size, ptr] : blocks) {
      cudaFree(ptr);
      pool.stats.reserved -= size;
    }
  }
  pool.free_blocks.clear();
}
#endif

}  // namespace

void* device_alloc(Device device, size_t bytes, Stream stream) {
  if (device.is_cpu()) {
    const size_t size = round_up(bytes ? bytes : 1, kHostAlignment);
    void* p = std::aligned_alloc(kHostAlignment, size);
    if (!p)
      throw RuntimeFailure("out of host memory allocating " + std::to_string(bytes) + " bytes");
    auto& pool = host_pool();
    std::lock_guard lock(pool.mutex);
    pool.sizes[p] = size;
    note_alloc(pool.stats, size);
    pool.stats.reserved = pool.stats.allocated;
    pool.stats.peak_reserved = pool.stats.peak_allocated;
    return p;
  }
#ifdef HK_HAVE_CUDA
  if (device.is_cuda()) {
    const size_t size = cuda_round(bytes);
    auto& pool = cuda_pool(device.index);
    std::lock_guard lock(pool.mutex);
    const GraphPoolScope* scope = t_scope;
    if (scope && scope->device_index() != device.index) scope = nullptr;
    GraphPoolInfo* graph = nullptr;
    if (scope) {
      auto found = pool.graph_pools.find(scope->pool_key());
      if (found == pool.graph_pools.end())
        throw InvalidArgument("allocation inside a GraphPoolScope whose pool was destroyed");
      graph = &found->second;
      auto it = graph->free_blocks.find(size);
      if (it != graph->free_blocks.end()) {
        void* p = it->second;
        graph->free_blocks.erase(it);
        pool.live[p] = {size, scope->pool_key(), true};
        note_alloc(pool.stats, size);
        return p;
      }
      if (!scope->allows_device_malloc())
        throw RuntimeFailure(
            "CUDA-graph capture asked for " + std::to_string(bytes) + " bytes on " + device.str() +
            " that its warm-up pass did not allocate; an operation in the captured region "
            "allocates differently on each call, so it cannot be captured");
    } else {
      auto& blocks = pool.free_blocks[stream.handle];
      auto it = blocks.lower_bound(size);
      // A cached block at most a quarter larger than the request: a small tensor never takes a
      // large block (its tensor would hold, and the stats count, the whole block).
      if (it != blocks.end() && it->first <= size + size / 4) {
        void* p = it->second;
        const size_t got = it->first;
        blocks.erase(it);
        pool.live[p] = {got, stream.handle, false};
        note_alloc(pool.stats, got);
        return p;
      }
    }
    int previous = 0;
    cudaGetDevice(&previous);
    if (previous != device.index) HK_CUDA_CHECK(cudaSetDevice(device.index));
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation && !scope) {
      cudaGetLastError();
      // Other streams' cached blocks may be in flight; sync before returning them to the driver.
      cudaDeviceSynchronize();
      release_free_blocks(pool);
      err = cudaMalloc(&p, size);
    }
    if (previous != device.index) cudaSetDevice(previous);
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw RuntimeFailure("CUDA out of memory allocating " + std::to_string(bytes) + " bytes on " +
                           device.str() + " (" + std::to_string(pool.stats.allocated) +
                           " bytes in use); reduce the batch or sequence length");
    }
    pool.stats.num_device_mallocs++;
    pool.stats.reserved += size;
    if (pool.stats.reserved > pool.stats.peak_reserved)
      pool.stats.peak_reserved = pool.stats.reserved;
    if (graph) {
      graph->reserved += size;
      graph->mallocs++;
      pool.live[p] = {size, scope->pool_key(), true};
    } else {
      pool.live[p] = {size, stream.handle, false};
    }
    note_alloc(pool.stats, size);
    return p;
  }
#endif
  throw Unsupported("no allocator for device " + device.str() +
                    (device.is_cuda() ? "; hk was built without CUDA" : ""));
}

void device_free(Device device, void* ptr) {
  if (!ptr) return;
  if (device.is_cpu()) {
    auto& pool = host_pool();
    {
      std::lock_guard lock(pool.mutex);
      auto it = pool.sizes.find(ptr);
      if (it != pool.sizes.end()) {
        pool.stats.allocated -= it->second;
        pool.stats.reserved = pool.stats.allocated;
        pool.sizes.erase(it);
      }
    }
    std::free(ptr);
    return;
  }
#ifdef HK_HAVE_CUDA
  if (device.is_cuda()) {
    auto& pool = cuda_pool(device.index);
    std::lock_guard lock(pool.mutex);
    auto it = pool.live.find(ptr);
    if (it == pool.live.end()) return;  // not ours: ignore rather than corrupt the pool
    const CudaBlock block = it->second;
    pool.live.erase(it);
    pool.stats.allocated -= block.size;
    if (!block.graph_pool) {
      pool.free_blocks[block.stream].emplace(block.size, ptr);
    } else if (auto g = pool.graph_pools.find(block.stream); g != pool.graph_pools.end()) {
      g->second.free_blocks.emplace(block.size, ptr);
    } else {  // its pool is gone (and with it every graph that used the block)
      cudaFree(ptr);
      pool.stats.reserved -= block.size;
    }
  }
#endif
}

MemoryStats memory_stats(Device device) {
  if (device.is_cpu()) {
    std::lock_guard lock(host_pool().mutex);
    return host_pool().stats;
  }
#ifdef HK_HAVE_CUDA
  if (device.is_cuda()) {
    auto& pool = cuda_pool(device.index);
    std::lock_guard lock(pool.mutex);
    return pool.stats;
  }
#endif
  return {};
}

void reset_peak_memory_stats(Device device) {
  if (device.is_cpu()) {
    std::lock_guard lock(host_pool().mutex);
    host_pool().stats.peak_allocated = host_pool().stats.allocated;
    host_pool().stats.peak_reserved = host_pool().stats.reserved;
    return;
  }
#ifdef HK_HAVE_CUDA
  if (device.is_cuda()) {
    auto& pool = cuda_pool(device.index);
    std::lock_guard lock(pool.mutex);
    pool.stats.peak_allocated = pool.stats.allocated;
    pool.stats.peak_reserved = pool.stats.reserved;
  }
#endif
}

void empty_cache(Device device) {
#ifdef HK_HAVE_CUDA
  if (device.is_cuda()) {
    auto& pool = cuda_pool(device.index);
    std::lock_guard lock(pool.mutex);
    cudaDeviceSynchronize();
    release_free_blocks(pool);
  }
#endif
  (void)device;
}

// ---- graph pools --------------------------------------------------------------------------------

GraphPool::GraphPool(Device device) : device_(device), key_(new char(0)) {
  if (!device.is_cuda())
    throw InvalidArgument("GraphPool: " + device.str() + " is not a CUDA device");
#ifdef HK_HAVE_CUDA
  auto& pool = cuda_pool(device.index);
  std::lock_guard lock(pool.mutex);
  pool.graph_pools[key_];
#else
  throw Unsupported("hk was built without CUDA; graph pools need a CUDA build");
#endif
}

GraphPool::~GraphPool() {
#ifdef HK_HAVE_CUDA
  auto& pool = cuda_pool(device_.index);
  {
    std::lock_guard lock(pool.mutex);
    auto it = pool.graph_pools.find(key_);
    if (it != pool.graph_pools.end()) {
      for (auto& [size, ptr] : it->second.free_blocks) {
        cudaFree(ptr);
        pool.stats.reserved -= size;
      }
      pool.graph_pools.erase(it);
    }
  }
#endif
  delete static_cast<char*>(key_);
}

#ifdef HK_HAVE_CUDA
namespace {
// One counter of a live graph pool (0 once it is gone).
size_t graph_pool_count(Device device, void* key, size_t GraphPoolInfo::*field) {
  auto& pool = cuda_pool(device.index);
  std::lock_guard lock(pool.mutex);
  auto it = pool.graph_pools.find(key);
  return it == pool.graph_pools.end() ? 0 : it->second.*field;
}
}  // namespace

size_t GraphPool::reserved_bytes() const {
  return graph_pool_count(device_, key_, &GraphPoolInfo::reserved);
}
size_t GraphPool::num_device_mallocs() const {
  return graph_pool_count(device_, key_, &GraphPoolInfo::mallocs);
}
#else
size_t GraphPool::reserved_bytes() const {
  return 0;
}
size_t GraphPool::num_device_mallocs() const {
  return 0;
}
#endif

GraphPoolScope::GraphPoolScope(GraphPool& pool, bool allow_device_malloc)
    : key_(pool.key_),
      device_index_(pool.device().index),
      allow_device_malloc_(allow_device_malloc),
      previous_(t_scope) {
  t_scope = this;
}

GraphPoolScope::~GraphPoolScope() {
  t_scope = previous_;
}

const GraphPoolScope* GraphPoolScope::current() {
  return t_scope;
}

}  // namespace hk
