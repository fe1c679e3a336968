// The optimizer's multi-tensor CUDA kernels: fused AdamW over every parameter, the master → model
// copy of the --bf16 recipe, and the global gradient L2 norm with the clipping coefficient
// computed on the device (torch.nn.utils.clip_grad_norm_), so a training step never waits for the
// host.
//
// Layout: one block per chunk of kChunkElements; a block finds its tensor by binary search over
// its group's slots (a few hundred, L1/L2 resident). AdamW is memory-bound (a bf16 model moves
// 14 bytes per parameter: p, g, m, v read, p, m, v written), so the kernels are compiled per
// dtype combination (TensorTable's groups: f32, bf16, f16 throughout, f32 masters with a bf16 or
// f16 model copy) and move 8 elements per thread per access (16-byte loads and stores of 16-bit
// data, two of f32) when every pointer of the tensor is 16-byte aligned; a tensor that is not, and
// each tensor's last (numel mod 8) elements, go element by element with the same arithmetic. Any
// other dtype mix runs the generic kernel (a run-time dtype switch per access, uniform per block).
// The element update is adamw_math.h's, shared with the CPU loop.
//
// Norm: each block writes its chunk's f32 Σ g² to `partials`; one block then sums the partials in
// double in a fixed order, so the result is deterministic (no atomics).
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
using ops::cuda::detail::from_f32;
using ops::cuda::detail::load_f32;
using ops::cuda::detail::store_f32;
using ops::cuda::detail::to_f32;

constexpr int kThreads = 256;
constexpr int kVec = 8;  // elements per thread per vector access

// Group kinds: the dtype combinations with compiled kernels, then the generic one.
enum Kind : uint8_t {
  kF32 = 0,         // f32 param, grad, moments
  kBF16 = 1,        // bf16 param, grad, moments (a bf16 model trained in its dtype)
  kF16 = 2,         // f16 throughout
  kMasterBF16 = 3,  // f32 master, grad and moments; bf16 model copy
  kMasterF16 = 4,   // f32 master, grad and moments; f16 model copy
  kGeneric = 5,
};

uint8_t kind_of(const TensorSlot& s) {
  // A slot without a gradient is skipped by every kernel: group it by its other dtypes. A
  // gradient-only table (hk::optim::clip_grad_norm) groups by the gradients' dtype.
  const DType p = s.param ? s.param_dtype : s.grad_dtype;
  const DType g = s.grad ? s.grad_dtype : p;
  const DType state = s.param ? s.state_dtype : p;
  if (g != p || state != p) return kGeneric;
  if (s.model_copy == nullptr) {
    if (p == DType::F32) return kF32;
    if (p == DType::BF16) return kBF16;
    if (p == DType::F16) return kF16;
    return kGeneric;
  }
  if (p != DType::F32) return kGeneric;
  if (s.model_dtype == DType::BF16) return kMasterBF16;
  if (s.model_dtype == DType::F16) return kMasterF16;
  return kGeneric;
}

__host__ __device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

cudaStream_t native(Stream s) {
  return static_cast<cudaStream_t>(s.handle);
}

// The slot (within slots[0, n)) whose chunks contain `chunk`: the last with chunk_begin <= chunk.
__device__ const TensorSlot& find_slot(const TensorSlot* slots, int n, int64_t chunk) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (slots[mid].chunk_begin <= chunk)
      lo = mid;
    else
      hi = mid - 1;
  }
  return slots[lo];
}

// The chunk this block handles: its slot and the element range [begin, end) within it.
struct Chunk {
  const TensorSlot* t;
  int64_t begin, end;
};
__device__ __forceinline__ Chunk this_chunk(const TensorSlot* slots, int num_slots,
                                            int64_t first_chunk) {
  const int64_t chunk = first_chunk + blockIdx.x;
  const TensorSlot& t = find_slot(slots, num_slots, chunk);
  const int64_t begin = (chunk - t.chunk_begin) * kChunkElements;
  return {&t, begin, min(begin + kChunkElements, t.numel)};
}

// 8 consecutive elements of storage type T, 16-byte aligned (one access for 16-bit types, two
// for f32).
template <class T>
struct alignas(16) Pack8 {
  T v[kVec];
};
template <class T>
__device__ __forceinline__ void load8(const void* base, int64_t i, float (&out)[kVec]) {
  const Pack8<T> p = *reinterpret_cast<const Pack8<T>*>(static_cast<const T*>(base) + i);
#pragma unroll
  for (int k = 0; k < kVec; ++k) out[k] = to_f32(p.v[k]);
}
template <class T>
__device__ __forceinline__ void store8(void* base, int64_t i, const float (&in)[kVec]) {
  Pack8<T> p;
#pragma unroll
  for (int k = 0; k < kVec; ++k) p.v[k] = from_f32<T>(in[k]);
  *reinterpret_cast<Pack8<T>*>(static_cast<T*>(base) + i) = p;
}

// Typed AdamW: P = param (or master) storage, G = grad, S = moments, M = model copy (only read
// when kCopy).
template <class P, class G, class S, class M, bool kCopy>
__device__ __forceinline__ void adamw_one(const TensorSlot& t, int64_t i, float scale, bool decay,
                                          const detail::AdamWScalars& s) {
  float p = to_f32(static_cast<const P*>(t.param)[i]);
  float m = to_f32(static_cast<const S*>(t.exp_avg)[i]);
  float v = to_f32(static_cast<const S*>(t.exp_avg_sq)[i]);
  const float g = to_f32(static_cast<const G*>(t.grad)[i]) * scale;
  detail::adamw_update(p, m, v, g, decay, s);
  static_cast<P*>(t.param)[i] = from_f32<P>(p);
  static_cast<S*>(t.exp_avg)[i] = from_f32<S>(m);
  static_cast<S*>(t.exp_avg_sq)[i] = from_f32<S>(v);
  if constexpr (kCopy) static_cast<M*>(t.model_copy)[i] = from_f32<M>(p);
}

template <class P, class G, class S, class M, bool kCopy>
__global__ void __launch_bounds__(kThreads)
    adamw_typed_kernel(const TensorSlot* slots, int num_slots, int64_t first_chunk,
                       detail::AdamWScalars s, const float* grad_scale) {
  const Chunk ch = this_chunk(slots, num_slots, first_chunk);
  if (ch.t->grad == nullptr) return;
  const TensorSlot& t = *ch.t;
  const float scale = grad_scale ? *grad_scale : 1.0f;
  const bool decay = t.decay != 0;
  const int64_t begin = ch.begin, end = ch.end;
  int64_t scalar_from = begin;
  if (t.vector_ok) {
    const int64_t vend = begin + ((end - begin) / kVec) * kVec;
    for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * kVec; i < vend;
         i += static_cast<int64_t>(kThreads) * kVec) {
      float p[kVec], g[kVec], m[kVec], v[kVec];
      load8<P>(t.param, i, p);
      load8<G>(t.grad, i, g);
      load8<S>(t.exp_avg, i, m);
      load8<S>(t.exp_avg_sq, i, v);
#pragma unroll
      for (int k = 0; k < kVec; ++k) detail::adamw_update(p[k], m[k], v[k], g[k] * scale, decay, s);
      store8<P>(t.param, i, p);
      store8<S>(t.exp_avg, i, m);
      store8<S>(t.exp_avg_sq, i, v);
      if constexpr (kCopy) store8<M>(t.model_copy, i, p);
    }
    scalar_from = vend;
  }
  for (int64_t i = scalar_from + threadIdx.x; i < end; i += kThreads)
    adamw_one<P, G, S, M, kCopy>(t, i, scale, decay, s);
}

// Any dtype mix: a run-time switch per access (uniform per block).
__global__ void adamw_generic_kernel(const TensorSlot* slots, int num_slots, int64_t first_chunk,
                                     detail::AdamWScalars s, const float* grad_scale) {
  const Chunk ch = this_chunk(slots, num_slots, first_chunk);
  if (ch.t->grad == nullptr) return;
  const TensorSlot& t = *ch.t;
  const float scale = grad_scale ? *grad_scale : 1.0f;
  for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
    float p = load_f32(t.param, t.param_dtype, i);
    float m = load_f32(t.exp_avg, t.state_dtype, i);
    float v = load_f32(t.exp_avg_sq, t.state_dtype, i);
    const float g = load_f32(t.grad, t.grad_dtype, i) * scale;
    detail::adamw_update(p, m, v, g, t.decay != 0, s);
    store_f32(t.param, t.param_dtype, i, p);
    store_f32(t.exp_avg, t.state_dtype, i, m);
    store_f32(t.exp_avg_sq, t.state_dtype, i, v);
    if (t.model_copy) store_f32(t.model_copy, t.model_dtype, i, p);
  }
}

__global__ void copy_master_kernel(const TensorSlot* slots, int num_slots) {
  const int64_t chunk = blockIdx.x;
  const TensorSlot& t = find_slot(slots, num_slots, chunk);
  if (t.model_copy == nullptr) return;
  const int64_t begin = (chunk - t.chunk_begin) * kChunkElements;
  const int64_t end = min(begin + kChunkElements, t.numel);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    store_f32(t.model_copy, t.model_dtype, i, load_f32(t.param, t.param_dtype, i));
}

// This block's Σ acc (every thread's value) into *out, in a fixed order.
__device__ __forceinline__ void block_sum_to(float acc, float* out) {
  __shared__ float warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    *out = total;
  }
}

// Σ g² of one chunk, G = the gradient's storage type (every slot of the group has it).
template <class G>
__global__ void __launch_bounds__(kThreads)
    sum_squares_typed_kernel(const TensorSlot* slots, int num_slots, int64_t first_chunk,
                             float* partials) {
  const Chunk ch = this_chunk(slots, num_slots, first_chunk);
  const TensorSlot& t = *ch.t;
  float acc = 0.0f;
  if (t.grad != nullptr) {
    const int64_t begin = ch.begin, end = ch.end;
    int64_t scalar_from = begin;
    if (aligned16(t.grad)) {
      const int64_t vend = begin + ((end - begin) / kVec) * kVec;
      for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * kVec; i < vend;
           i += static_cast<int64_t>(kThreads) * kVec) {
        float g[kVec];
        load8<G>(t.grad, i, g);
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc += g[k] * g[k];
      }
      scalar_from = vend;
    }
    for (int64_t i = scalar_from + threadIdx.x; i < end; i += kThreads) {
      const float g = to_f32(static_cast<const G*>(t.grad)[i]);
      acc += g * g;
    }
  }
  block_sum_to(acc, &partials[first_chunk + blockIdx.x]);
}

__global__ void sum_squares_generic_kernel(const TensorSlot* slots, int num_slots,
                                           int64_t first_chunk, float* partials) {
  const Chunk ch = this_chunk(slots, num_slots, first_chunk);
  const TensorSlot& t = *ch.t;
  float acc = 0.0f;
  if (t.grad != nullptr) {
    const int64_t begin = ch.begin, end = ch.end;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const float g = load_f32(t.grad, t.grad_dtype, i);
      acc += g * g;
    }
  }
  block_sum_to(acc, &partials[first_chunk + blockIdx.x]);
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

// The gradient dtype every slot of the group shares (U8 for the generic group's mix).
DType group_grad_dtype(const SlotGroup& g) {
  switch (g.kind) {
    case kBF16:
      return DType::BF16;
    case kF16:
      return DType::F16;
    case kGeneric:
      return DType::U8;  // mixed: the generic kernel
    default:
      return DType::F32;
  }
}

template <class K, class... Args>
void launch_group(K kernel, const SlotGroup& g, cudaStream_t stream, const TensorSlot* slots,
                  Args... args) {
  kernel<<<static_cast<unsigned>(g.num_chunks), kThreads, 0, stream>>>(
      slots + g.first_slot, g.num_slots, g.first_chunk, args...);
  HK_CUDA_CHECK_LAUNCH();
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
  for (auto& s : slots) {
    s.kind = kind_of(s);
    s.vector_ok = aligned16(s.param) && aligned16(s.grad) && aligned16(s.exp_avg) &&
                  aligned16(s.exp_avg_sq) && aligned16(s.model_copy);
  }
  std::stable_sort(slots.begin(), slots.end(),
                   [](const TensorSlot& a, const TensorSlot& b) { return a.kind < b.kind; });
  int64_t chunks = 0;
  std::vector<SlotGroup> groups;
  for (size_t i = 0; i < slots.size(); ++i) {
    TensorSlot& s = slots[i];
    if (groups.empty() || groups.back().kind != s.kind) {
      SlotGroup g;
      g.first_slot = static_cast<int>(i);
      g.first_chunk = chunks;
      g.kind = s.kind;
      groups.push_back(g);
    }
    s.chunk_begin = chunks;
    const int64_t n = std::max<int64_t>(1, (s.numel + kChunkElements - 1) / kChunkElements);
    chunks += n;
    groups.back().num_slots++;
    groups.back().num_chunks += n;
  }
  if (slots == host_ && device_) return;
  DeviceGuard guard(device_id_);
  const size_t bytes = slots.size() * sizeof(TensorSlot);
  if (bytes > capacity_) {
    if (device_) device_free(device_id_, device_);
    device_ = static_cast<TensorSlot*>(device_alloc(device_id_, bytes, stream));
    capacity_ = bytes;
  }
  // Pageable source: the runtime stages it before returning (and host_ keeps it alive anyway).
  if (bytes)
    HK_CUDA_CHECK(
        cudaMemcpyAsync(device_, slots.data(), bytes, cudaMemcpyHostToDevice, native(stream)));
  host_ = std::move(slots);
  groups_ = std::move(groups);
  num_chunks_ = chunks;
}

void adamw_step(const TensorTable& table, const detail::AdamWScalars& scalars,
                const float* grad_scale, Stream stream) {
  if (table.num_chunks() == 0) return;
  DeviceGuard guard(table.device());
  const cudaStream_t s = native(stream);
  const TensorSlot* slots = table.device_slots();
  for (const SlotGroup& g : table.groups()) {
    switch (g.kind) {
      case kF32:
        launch_group(adamw_typed_kernel<float, float, float, float, false>, g, s, slots, scalars,
                     grad_scale);
        break;
      case kBF16:
        launch_group(adamw_typed_kernel<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, float, false>,
                     g, s, slots, scalars, grad_scale);
        break;
      case kF16:
        launch_group(adamw_typed_kernel<__half, __half, __half, float, false>, g, s, slots, scalars,
                     grad_scale);
        break;
      case kMasterBF16:
        launch_group(adamw_typed_kernel<float, float, float, __nv_bfloat16, true>, g, s, slots,
                     scalars, grad_scale);
        break;
      case kMasterF16:
        launch_group(adamw_typed_kernel<float, float, float, __half, true>, g, s, slots, scalars,
                     grad_scale);
        break;
      default:
        launch_group(adamw_generic_kernel, g, s, slots, scalars, grad_scale);
    }
  }
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
  const cudaStream_t s = native(stream);
  const TensorSlot* slots = table.device_slots();
  for (const SlotGroup& g : table.groups()) {
    switch (group_grad_dtype(g)) {
      case DType::F32:
        launch_group(sum_squares_typed_kernel<float>, g, s, slots, partials);
        break;
      case DType::BF16:
        launch_group(sum_squares_typed_kernel<__nv_bfloat16>, g, s, slots, partials);
        break;
      case DType::F16:
        launch_group(sum_squares_typed_kernel<__half>, g, s, slots, partials);
        break;
      default:
        launch_group(sum_squares_generic_kernel, g, s, slots, partials);
    }
  }
  finish_norm_kernel<<<1, 1024, 0, s>>>(partials, table.num_chunks(), max_norm, norm, coef);
  HK_CUDA_CHECK_LAUNCH();
}

}  // namespace hk::optim::cuda
