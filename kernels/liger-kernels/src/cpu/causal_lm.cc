// cpu/causal_lm.cc — the causal-LM label shift (position t predicts token t + 1).
#include "liger/cpu_ops.h"
#include "liger/host_numerics.h"

namespace liger::cpu {

void shift_labels(const void* labels, IndexDt dt, int64_t batch, int64_t seq, int64_t batch_stride,
                  int64_t ignore_index, int64_t* out) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq; ++t)
      out[b * seq + t] =
          t + 1 < seq ? host::load_index(labels, dt, b * batch_stride + t + 1) : ignore_index;
}

}  // namespace liger::cpu
