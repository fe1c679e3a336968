// cpu/linear.cc — the linear layer (LigerLinear, linear@1), forward and backward, with the naive
// GEMM of cpu/gemm.h: f32 accumulation, the bias added before the one rounding; db summed in
// double. The portable reference for the cuda variant, not fast.
#include <vector>

#include "cpu/gemm.h"
#include "liger/cpu_ops.h"
#include "liger/host_numerics.h"

namespace liger::cpu {

void linear_fwd(const LinearArgs& a) {
  const int64_t rows = a.x.rows, k = a.x.cols, n = a.w.rows;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = a.b.data ? host::load(a.b.data, a.b.dt, j) : 0.0f;
      for (int64_t p = 0; p < k; ++p) acc += host::at(a.x, i, p) * host::at(a.w, j, p);
      host::put(a.y, i, j, acc);
    }
}

void linear_bwd(const LinearArgs& a) {
  const int64_t rows = a.dy.rows, n = a.dy.cols, k = a.w.cols;
  if (a.dx.data) gemm(false, false, rows, k, n, a.dy, a.w, a.dx, false);
  if (a.dw.data) gemm(true, false, n, k, rows, a.dy, a.x, a.dw, a.accumulate);
  if (a.db.data)
    for (int64_t j = 0; j < n; ++j) {
      double sum = a.accumulate ? host::load(a.db.data, a.db.dt, j) : 0.0;
      for (int64_t i = 0; i < rows; ++i) sum += host::at(a.dy, i, j);
      host::store(a.db.data, a.db.dt, j, static_cast<float>(sum));
    }
}

}  // namespace liger::cpu
