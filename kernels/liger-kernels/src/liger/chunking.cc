// liger/chunking.cc — the default token-chunk size of the fused linear cross-entropy (see
// liger/args.h), shared by the workspace planner and the launcher so both agree.
#include "liger/args.h"

namespace liger {

int64_t default_chunk_tokens(int64_t n, int64_t vocab, int64_t hidden, size_t logit_bytes,
                             bool f32_dweight_buffer) {
  const double budget = 1.28e9 - (f32_dweight_buffer ? 4.0 * vocab * hidden : 0.0) - (32 << 20);
  const double row_bytes = static_cast<double>(vocab > 0 ? vocab : 1) * logit_bytes;
  int64_t rows = budget > 0 ? static_cast<int64_t>(budget / row_bytes) : 0;
  rows = rows / 128 * 128;
  if (rows < 128) rows = 128;
  if (rows > 8192) rows = 8192;
  const int64_t n_up = n > 0 ? (n + 127) / 128 * 128 : 128;
  if (rows >= n_up) return n_up;
  const int64_t chunks = (n + rows - 1) / rows;  // even them out
  const int64_t even = ((n + chunks - 1) / chunks + 127) / 128 * 128;
  return even < rows ? even : rows;
}

}  // namespace liger
