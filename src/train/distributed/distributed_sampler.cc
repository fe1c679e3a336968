// torch.utils.data.DistributedSampler (hk/distributed.h), index for index: the epoch's order
// (torch.randperm from seed + epoch, or 0..n-1), padded by repeating its start (drop_last=False)
// or cut to a multiple of the world size (drop_last=True), then every W-th position from the
// rank. tests/unit/train/test_distributed.cc checks it against torch's own output
// (tests/fixtures/train/distributed_sampler.json, tools/fixtures/make_distributed_sampler.py).
//
// The Trainer uses only the split (shard_order) over its own epoch order (hk::epoch_order), so
// that N ranks train on exactly what one process with the global batch trains on.
#include <random>

#include "hk/distributed.h"
#include "hk/error.h"

namespace hk::dist {

int64_t shard_length(int64_t n, int world_size, bool drop_last) {
  HK_CHECK(world_size >= 1, "shard_length: world size must be >= 1");
  // torch: drop_last and n % W != 0 → ceil((n - W) / W), which is floor(n / W).
  return drop_last ? n / world_size : (n + world_size - 1) / world_size;
}

std::vector<int64_t> shard_order(const std::vector<int64_t>& order, int rank, int world_size,
                                 bool drop_last) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw InvalidArgument("DistributedSampler: rank " + std::to_string(rank) +
                          " is outside a world of " + std::to_string(world_size) +
                          " replicas (ranks 0 to " + std::to_string(world_size - 1) + ")");
  if (order.empty())
    throw InvalidArgument("DistributedSampler: the dataset has no samples to split across " +
                          std::to_string(world_size) + " ranks");
  const int64_t n = static_cast<int64_t>(order.size());
  const int64_t per_rank = shard_length(n, world_size, drop_last);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank));
  for (int64_t k = 0; k < per_rank; ++k) {
    // Position in the padded order; padding repeats the order from its start (as often as needed
    // when the world is larger than the dataset).
    const int64_t position = rank + k * world_size;
    mine.push_back(order[static_cast<size_t>(position % n)]);
  }
  return mine;
}

std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed) {
  HK_CHECK(n >= 0, "torch_randperm: n must be >= 0");
  if (n >= static_cast<int64_t>(UINT32_MAX / 20))
    throw Unsupported("torch_randperm: n = " + std::to_string(n) +
                      " uses torch's large-n algorithm, which hk does not reproduce");
  std::vector<int64_t> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[static_cast<size_t>(i)] = i;
  // torch's CPU generator is an mt19937 seeded with the low 32 bits of the seed; randperm's
  // small-n path swaps position i with i + (32-bit draw mod (n − i)).
  std::mt19937 engine(static_cast<uint32_t>(seed));
  for (int64_t i = 0; i + 1 < n; ++i) {
    const int64_t z = static_cast<int64_t>(engine() % static_cast<uint64_t>(n - i));
    std::swap(r[static_cast<size_t>(i)], r[static_cast<size_t>(z + i)]);
  }
  return r;
}

std::vector<int64_t> distributed_sampler_indices(int64_t num_samples,
                                                 const DistributedSamplerOptions& o,
                                                 int64_t epoch) {
  std::vector<int64_t> order;
  if (o.shuffle) {
    order = torch_randperm(num_samples, o.seed + static_cast<uint64_t>(epoch));
  } else {
    order.resize(static_cast<size_t>(std::max<int64_t>(num_samples, 0)));
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  }
  return shard_order(order, o.rank, o.num_replicas, o.drop_last);
}

}  // namespace hk::dist
