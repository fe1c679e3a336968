// The optimizer's multi-tensor CUDA kernels: fused AdamW over every parameter in one launch, the
// master → model copy of the --bf16 recipe, and the global gradient L2 norm with the clipping
// coefficient computed on the device (torch.nn.utils.clip_grad_norm_), so a training step never
// waits for the host.
//
// Layout: one block per chunk of kChunkElements; a block finds its tensor by binary search over
// the slots' chunk_begin (a few hundred slots, L1/L2 resident). Loads go through the run-time
// dtype switch of ops/cuda_common.cuh (uniform per block). Norm: each block writes its chunk's
// f32 Σ g² to `partials`; one block then sums the partials in double in a fixed order, so the
// result is deterministic (no atomics).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "core/cuda_check.h"
#include "hk/allocator.h"
#include "ops/cuda_common.cuh"
#include "train/optim/optim_cuda.h"

namespace hk::optim::cuda {
namespace {

using ops::cuda::detail::DeviceGuard;
using ops::cuda::detail::load_f32;
using ops::cuda::detail::store_f32;

constexpr int kThreads = 256;

cudaStream_t native(Stream s) {
  return static_cast<cudaStream_t>(s.handle);
}

__device__ int find_slot(const TensorSlot* slots, int n, int64_t chunk) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {  // last slot with chunk_begin <= chunk
    const int mid = (lo + hi + 1) / 2;
    if (slots[mid].chunk_begin <= chunk)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

__global__ void adamw_kernel(const TensorSlot* slots, int num_slots, detail::AdamWScalars s,
                             const float* grad_scale) {
  const int64_t chunk = blockIdx.x;
  const TensorSlot& t = slots[find_slot(slots, num_slots, chunk)];
  if (t.grad == nullptr) return;
  const int64_t begin = (chunk - t.chunk_begin) * kChunkElements;
  const int64_t end = min(begin + kChunkElements, t.numel);
  const float scale = grad_scale ? *grad_scale : 1.0f;
  const bool decay = t.decay != 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float p = load_f32(t.param, t.param_dtype, i);
    float m = load_f32(t.exp_avg, t.state_dtype, i);
    float v = load_f32(t.exp_avg_sq, t.state_dtype, i);
    const float g = load_f32(t.grad, t.grad_dtype, i) * scale;
    detail::adamw_update(p, m, v, g, decay, s);
    store_f32(t.param, t.param_dtype, i, p);
    store_f32(t.exp_avg, t.state_dtype, i, m);
    store_f32(t.exp_avg_sq, t.state_dtype, i, v);
    if (t.model_copy) store_f32(t.model_copy, t.model_dtype, i, p);
  }
}

__global__ void copy_master_kernel(const TensorSlot* slots, int num_slots) {
  const int64_t chunk = blockIdx.x;
  const TensorSlot& t = slots[find_slot(slots, num_slots, chunk)];
  if (t.model_copy == nullptr) return;
  const int64_t begin = (chunk - t.chunk_begin) * kChunkElements;
  const int64_t end = min(begin + kChunkElements, t.numel);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    store_f32(t.model_copy, t.model_dtype, i, load_f32(t.param, t.param_dtype, i));
}

__global__ void sum_squares_kernel(const TensorSlot* slots, int num_slots, float* partials) {
  const int64_t chunk = blockIdx.x;
  const TensorSlot& t = slots[find_slot(slots, num_slots, chunk)];
  float acc = 0.0f;
  if (t.grad != nullptr) {
    const int64_t begin = (chunk - t.chunk_begin) * kChunkElements;
    const int64_t end = min(begin + kChunkElements, t.numel);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const float g = load_f32(t.grad, t.grad_dtype, i);
      acc += g * g;
    }
  }
  __shared__ float warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    partials[chunk] = total;
  }
}

__global__ void finish_norm_kernel(const float* partials, int64_t n, double max_norm, float* norm,
                                   float* coef) {
  __shared__ double sums[1024];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partials[i];
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float total_norm = static_cast<float>(sqrt(sums[0]));
    norm[0] = total_norm;
    // torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1.
    coef[0] =
        max_norm > 0 ? fminf(1.0f, static_cast<float>(max_norm) / (total_norm + 1e-6f)) : 1.0f;
  }
}

}  // namespace

bool TensorSlot::operator==(const TensorSlot& o) const {
  return std::memcmp(this, &o, sizeof(TensorSlot)) == 0;
}

TensorTable::TensorTable(Device device) : device_id_(device) {}

TensorTable::~TensorTable() {
  if (device_) device_free(device_id_, device_);
}

void TensorTable::update(std::vector<TensorSlot> slots, Stream stream) {
  int64_t chunks = 0;
  for (auto& s : slots) {
    s.chunk_begin = chunks;
    chunks += std::max<int64_t>(1, (s.numel + kChunkElements - 1) / kChunkElements);
  }
  if (slots == host_ && device_) return;
  DeviceGuard guard(device_id_);
  const size_t bytes = slots.size() * sizeof(TensorSlot);
  if (bytes > capacity_) {
    if (device_) device_free(device_id_, device_);
    device_ = static_cast<TensorSlot*>(device_alloc(device_id_, bytes, stream));
    capacity_ = bytes;
  }
  // Pageable source: the runtime stages it before returning, so `slots` may go away after this.
  if (bytes)
    HK_CUDA_CHECK(
        cudaMemcpyAsync(device_, slots.data(), bytes, cudaMemcpyHostToDevice, native(stream)));
  host_ = std::move(slots);
  num_chunks_ = chunks;
}

void adamw_step(const TensorTable& table, const detail::AdamWScalars& scalars,
                const float* grad_scale, Stream stream) {
  if (table.num_chunks() == 0) return;
  DeviceGuard guard(table.device());
  adamw_kernel<<<static_cast<unsigned>(table.num_chunks()), kThreads, 0, native(stream)>>>(
      table.device_slots(), static_cast<int>(table.num_tensors()), scalars, grad_scale);
  HK_CUDA_CHECK_LAUNCH();
}

void copy_master_to_model(const TensorTable& table, Stream stream) {
  if (table.num_chunks() == 0) return;
  DeviceGuard guard(table.device());
  copy_master_kernel<<<static_cast<unsigned>(table.num_chunks()), kThreads, 0, native(stream)>>>(
      table.device_slots(), static_cast<int>(table.num_tensors()));
  HK_CUDA_CHECK_LAUNCH();
}

void grad_norm(const TensorTable& table, float* partials, double max_norm, float* norm, float* coef,
               Stream stream) {
  DeviceGuard guard(table.device());
  if (table.num_chunks() > 0) {
    sum_squares_kernel<<<static_cast<unsigned>(table.num_chunks()), kThreads, 0, native(stream)>>>(
        table.device_slots(), static_cast<int>(table.num_tensors()), partials);
    HK_CUDA_CHECK_LAUNCH();
  }
  finish_norm_kernel<<<1, 1024, 0, native(stream)>>>(partials, table.num_chunks(), max_norm, norm,
                                                     coef);
  HK_CUDA_CHECK_LAUNCH();
}

}  // namespace hk::optim::cuda
