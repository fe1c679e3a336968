// cuda/causal_lm.cu — the label shift of the causal-LM loss: position t is scored against token
// t + 1 of the same sequence; the last position of each sequence is ignored.
#include "cuda/common.cuh"
#include "liger/cuda_ops.h"

namespace liger::cuda {
namespace {
__global__ void shift_kernel(const void* labels, IndexDt dt, int64_t batch, int64_t seq,
                             int64_t batch_stride, int64_t ignore, int64_t* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < batch * seq;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / seq, t = i % seq;
    out[i] = t + 1 < seq ? load_index(labels, dt, b * batch_stride + t + 1) : ignore;
  }
}
}  // namespace

int shift_labels(const void* labels, IndexDt dt, int64_t batch, int64_t seq, int64_t batch_stride,
                 int64_t ignore_index, int64_t* out, void* stream) {
  const int64_t n = batch * seq;
  if (n == 0) return 0;
  const int64_t blocks = (n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024;
  shift_kernel<<<static_cast<unsigned>(blocks), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      labels, dt, batch, seq, batch_stride, ignore_index, out);
  return last_error();
}

}  // namespace liger::cuda
