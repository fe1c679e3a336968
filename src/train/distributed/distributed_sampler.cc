// DistributedSampler's split of an epoch (hk/distributed.h: shard_order), as
// torch.utils.data.DistributedSampler does it with drop_last=False: pad the order to a multiple
// of the world size by repeating it from the start, then rank r takes every W-th position from r.
// The order itself (shuffled from seed and epoch, or file order) is the caller's: the same on
// every rank. Not here: drop_last=True (it would drop blocks the single-process run trains on).
#include "hk/distributed.h"
#include "hk/error.h"

namespace hk::dist {

int64_t shard_length(int64_t n, int world_size) {
  HK_CHECK(world_size >= 1, "shard_length: world size must be >= 1");
  return (n + world_size - 1) / world_size;
}

std::vector<int64_t> shard_order(const std::vector<int64_t>& order, int rank, int world_size) {
  HK_CHECK(world_size >= 1 && rank >= 0 && rank < world_size,
           "shard_order: rank " + std::to_string(rank) + " is outside a world of " +
               std::to_string(world_size));
  HK_CHECK(!order.empty(), "shard_order: the epoch has no samples");
  const int64_t n = static_cast<int64_t>(order.size());
  const int64_t per_rank = shard_length(n, world_size);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank));
  for (int64_t k = 0; k < per_rank; ++k) {
    const int64_t position = rank + k * world_size;  // in the padded order
    mine.push_back(order[static_cast<size_t>(position % n)]);
  }
  return mine;
}

}  // namespace hk::dist
