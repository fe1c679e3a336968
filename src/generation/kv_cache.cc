// The static KV cache: one preallocated [B, max_length, Hkv, D] key and value tensor per layer.
// Allocation is the only cost; advancing is host bookkeeping.
#include "hk/error.h"
#include "hk/generation.h"

namespace hk {

KVCache::KVCache(int64_t num_layers, int64_t batch, int64_t max_length, int64_t num_kv_heads,
                 int64_t head_dim, DType dtype, Device device)
    : batch_(batch), max_length_(max_length) {
  HK_CHECK(num_layers > 0 && batch > 0 && max_length > 0 && num_kv_heads > 0 && head_dim > 0,
           "KVCache: every size must be positive");
  for (int64_t i = 0; i < num_layers; ++i) {
    keys_.push_back(Tensor::empty({batch, max_length, num_kv_heads, head_dim}, dtype, device));
    values_.push_back(Tensor::empty({batch, max_length, num_kv_heads, head_dim}, dtype, device));
  }
}

void KVCache::advance(int64_t n) {
  HK_CHECK(n >= 0 && checked_add(length_, n, "the KV cache length") <= max_length_,
           "KVCache: advancing by " + std::to_string(n) + " from " + std::to_string(length_) +
               " exceeds its capacity of " + std::to_string(max_length_));
  length_ += n;
}

}  // namespace hk
