// liger/chunking.cc — the default token-chunk size of the fused linear cross-entropy, shared by
// the cpu and cuda variants (so both report the same workspace plan).
#include "liger/args.h"

namespace liger {

int64_t default_chunk_tokens(int64_t n, int64_t vocab) {
  const int64_t budget = int64_t{256} << 20;  // bytes of bf16 logits per chunk
  int64_t rows = budget / (2 * (vocab > 0 ? vocab : 1));
  rows = rows / 128 * 128;
  if (rows < 128) rows = 128;
  if (rows > 4096) rows = 4096;
  const int64_t n_up = (n + 127) / 128 * 128;
  return rows < n_up ? rows : (n_up > 0 ? n_up : 128);
}

}  // namespace liger
