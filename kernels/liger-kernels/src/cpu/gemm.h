// cpu/gemm.h — internal: the naive row-major GEMM of the cpu variant (f32 accumulation, one
// rounding to C's dtype), shared by the gated MLP and the linear layer. A reference, not a BLAS.
#pragma once

#include "liger/args.h"
#include "liger/host_numerics.h"

namespace liger::cpu {

// C[M, N] = op(A)[M, K] · op(B)[K, N] (+ C when accumulate); op = transpose when t*.
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const Rows& a, const Rows& b,
                 const Rows& c, bool accumulate) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = accumulate ? host::at(c, i, j) : 0.0f;
      for (int64_t p = 0; p < k; ++p)
        acc += (ta ? host::at(a, p, i) : host::at(a, i, p)) *
               (tb ? host::at(b, j, p) : host::at(b, p, j));
      host::put(c, i, j, acc);
    }
}

}  // namespace liger::cpu
