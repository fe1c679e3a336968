// Internal helpers shared by the CUDA built-in ops: float conversion of the storage types,
// run-time-typed loads/stores, dtype dispatch, strided index layouts, dense-row views, block
// reductions, launch sizing and a device guard.
//
// Deliberately small: the built-in kernels are "eager PyTorch", correct and simple. Hot paths
// (elementwise, rms_norm, rotary) are templated on the storage type and use 16-byte vectors;
// everything else loads through `load_f32(ptr, dtype, i)`, a uniform switch that keeps compile
// time and binary size down. Only included by src/ops/*_cuda.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/cuda_check.h"
#include "hk/error.h"
#include "hk/kernel_sdk_cuda.cuh"
#include "hk/ops.h"
#include "hk/tensor.h"

namespace hk::ops::cuda::detail {

inline cudaStream_t native(Stream stream) {
  return static_cast<cudaStream_t>(stream.handle);
}

// ---- storage types ------------------------------------------------------------------------------
using hk::sdk::cuda::from_f32;
using hk::sdk::cuda::round_as;
using hk::sdk::cuda::to_f32;

// Run-time-typed access for the floating dtypes f32/bf16/f16 (the switch is warp-uniform).
__device__ __forceinline__ float load_f32(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::BF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::F16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}
__device__ __forceinline__ void store_f32(void* p, DType dt, int64_t i, float v) {
  switch (dt) {
    case DType::BF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    case DType::F16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
      break;
  }
}
__device__ __forceinline__ float round_dtype(DType dt, float v) {
  switch (dt) {
    case DType::BF16:
      return __bfloat162float(__float2bfloat16_rn(v));
    case DType::F16:
      return __half2float(__float2half_rn(v));
    default:
      return v;
  }
}
// Integer ids/labels stored as i32 or i64.
__device__ __forceinline__ int64_t load_index(const void* p, bool is_i64, int64_t i) {
  return is_i64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

// A vector of N storage elements moved with one 16/8/4-byte access.
template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

inline bool is_float_dtype(DType dt) {
  return dt == DType::F32 || dt == DType::BF16 || dt == DType::F16;
}

[[noreturn]] inline void unsupported_dtype(const char* op, DType dt) {
  throw Unsupported(std::string(op) + ": dtype " + dtype_name(dt) +
                    " is not supported on CUDA; use f32, bf16 or f16");
}
inline void require_float(const char* op, DType dt) {
  if (!is_float_dtype(dt)) unsupported_dtype(op, dt);
}

// Calls f(T{}) with T the storage type of `dt` (float, __nv_bfloat16, __half).
template <class F>
void dispatch_float(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::F32:
      f(float{});
      break;
    case DType::BF16:
      f(__nv_bfloat16{});
      break;
    case DType::F16:
      f(__half{});
      break;
    default:
      unsupported_dtype(op, dt);
  }
}

// ---- launch sizing ------------------------------------------------------------------------------
inline int current_device() {
  int d = 0;
  HK_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}
inline int sm_count() {
  static int cached[64] = {};
  const int d = current_device();
  if (d < 0 || d >= 64) return 132;
  if (cached[d] == 0) {
    int n = 0;
    HK_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, d));
    cached[d] = n > 0 ? n : 1;
  }
  return cached[d];
}
// Blocks for a grid-stride loop over `work` items: enough to fill the device, no more.
inline unsigned grid_for(int64_t work, int threads, int blocks_per_sm = 8) {
  const int64_t needed = (work + threads - 1) / threads;
  const int64_t cap = int64_t(sm_count()) * blocks_per_sm;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(needed, cap)));
}
inline unsigned checked_grid_x(int64_t blocks, const char* op) {
  if (blocks > 2147483647LL)
    throw Unsupported(std::string(op) + ": tensor too large for one launch");
  return static_cast<unsigned>(std::max<int64_t>(blocks, 1));
}

// Makes the tensor's device current for the duration of an op (multi-GPU processes).
class DeviceGuard {
 public:
  explicit DeviceGuard(const Device& device) {
    HK_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device.is_cuda() && device.index != previous_) {
      HK_CUDA_CHECK(cudaSetDevice(device.index));
      changed_ = true;
    }
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// ---- layouts ------------------------------------------------------------------------------------
// Shape plus up to three operands' strides (elements), for generic strided kernels. Offsets are
// computed from the linear index of the first operand's shape (the output's).
struct Layout3 {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[3][kMaxDims] = {};
};
inline Layout3 make_layout(const TensorView& out, const TensorView* a = nullptr,
                           const TensorView* b = nullptr) {
  Layout3 l;
  l.ndim = out.ndim;
  for (int d = 0; d < out.ndim; ++d) {
    l.shape[d] = out.shape[d];
    l.stride[0][d] = out.strides[d];
    l.stride[1][d] = a ? a->strides[d] : 0;
    l.stride[2][d] = b ? b->strides[d] : 0;
  }
  return l;
}
__device__ __forceinline__ void layout_offsets(const Layout3& l, int64_t i, int64_t& o0,
                                               int64_t& o1, int64_t& o2) {
  o0 = o1 = o2 = 0;
  for (int d = l.ndim - 1; d >= 0; --d) {
    const int64_t n = l.shape[d];
    const int64_t idx = n == 1 ? 0 : i % n;
    i = n == 1 ? i : i / n;
    o0 += idx * l.stride[0][d];
    o1 += idx * l.stride[1][d];
    o2 += idx * l.stride[2][d];
  }
}

// A view seen as [rows, cols] with cols contiguous and a fixed row stride (hk's rows_are_dense).
struct Rows {
  void* ptr = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;
};
inline Rows rows_of(const TensorView& v) {
  Rows r;
  r.ptr = v.ptr();
  r.cols = v.ndim == 0 ? 1 : v.shape[v.ndim - 1];
  r.rows = r.cols == 0 ? 0 : v.numel() / r.cols;
  r.row_stride = r.cols;
  for (int d = v.ndim - 2; d >= 0; --d) {
    if (v.shape[d] != 1) {
      r.row_stride = v.strides[d];
      break;
    }
  }
  return r;
}

// An input usable as dense rows: the view itself, or a contiguous copy kept alive by `keep`.
inline TensorView dense_rows_input(const TensorView& v, Tensor& keep, Stream stream) {
  if (v.rows_are_dense()) return v;
  keep = Tensor::wrap(v).contiguous(stream);
  return keep.view();
}
inline TensorView contiguous_input(const TensorView& v, Tensor& keep, Stream stream) {
  if (v.is_contiguous()) return v;
  keep = Tensor::wrap(v).contiguous(stream);
  return keep.view();
}

// An output a kernel can write as dense rows (or contiguously): the target itself when its layout
// allows, else a contiguous temporary that finish() copies back. `load_existing` copies the
// target's current values in first (for accumulating outputs).
class WritableOutput {
 public:
  WritableOutput(const TensorView& target, bool need_contiguous, bool load_existing, Stream stream)
      : target_(target) {
    const bool ok = need_contiguous ? target.is_contiguous() : target.rows_are_dense();
    if (ok) {
      work_ = target;
      return;
    }
    temp_ = Tensor::empty(target.sizes(), target.dtype, target.device, stream);
    if (load_existing) copy_view(temp_.view(), target, stream);
    work_ = temp_.view();
  }
  const TensorView& view() const { return work_; }
  void finish(Stream stream) {
    if (temp_.defined()) copy_view(target_, temp_.view(), stream);
  }

 private:
  TensorView target_;
  TensorView work_;
  Tensor temp_;
};

inline bool aligned_to(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// ---- block reductions ---------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, ≤ 1024); every thread gets the result.
// `scratch` is 32 floats of shared memory; the trailing barrier makes it reusable at once.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  float t = lane < warps ? scratch[lane] : 0.0f;
  t = warp_sum(t);
  __syncthreads();
  return t;
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  float t = lane < warps ? scratch[lane] : -INFINITY;
  t = warp_max(t);
  __syncthreads();
  return t;
}

// Online log-sum-exp state (max, sum of exp(x - max)); merges are safe with -inf maxima.
struct MaxSum {
  float m;
  float s;
};
__device__ __forceinline__ MaxSum maxsum_add(MaxSum a, float x) {
  if (x > a.m) {
    a.s = a.s * expf(a.m - x) + 1.0f;  // expf(-inf) = 0 when a.m was -inf
    a.m = x;
  } else if (x != -INFINITY) {
    a.s += expf(x - a.m);
  }
  return a;
}
__device__ __forceinline__ MaxSum maxsum_merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}
__device__ __forceinline__ MaxSum block_maxsum(MaxSum v, float* scratch_m, float* scratch_s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = maxsum_merge(v, other);
  }
  if (lane == 0) {
    scratch_m[warp] = v.m;
    scratch_s[warp] = v.s;
  }
  __syncthreads();
  const int warps = blockDim.x >> 5;
  MaxSum t = lane < warps ? MaxSum{scratch_m[lane], scratch_s[lane]} : MaxSum{-INFINITY, 0.0f};
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, t.m, o), __shfl_xor_sync(0xffffffffu, t.s, o)};
    t = maxsum_merge(t, other);
  }
  __syncthreads();
  return t;
}

// ---- activations (f32 math, the formulas of torch.nn.functional) -----------------------------
__device__ __forceinline__ float activation_forward(Activation act, float x) {
  switch (act) {
    // x·(1/(1+e^-x)) with a correctly rounded reciprocal instead of an IEEE division: within
    // 1.5 ulp of x/(1+e^-x) and cheap enough that SiLU stays memory-bound on bf16 tensors.
    case Activation::SiLU:
      return x * __frcp_rn(1.0f + expf(-x));
    case Activation::GELU:
      return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case Activation::QuickGELU:
      return x * __frcp_rn(1.0f + expf(-1.702f * x));
    default: {
      const float u = 0.79788456080286536f * (x + 0.044715f * x * x * x);
      return 0.5f * x * (1.0f + tanhf(u));
    }
  }
}
__device__ __forceinline__ float activation_derivative(Activation act, float x) {
  switch (act) {
    case Activation::SiLU: {
      const float s = 1.0f / (1.0f + expf(-x));
      return s * (1.0f + x * (1.0f - s));
    }
    case Activation::GELU: {
      const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
      const float pdf = 0.39894228040143268f * expf(-0.5f * x * x);
      return cdf + x * pdf;
    }
    case Activation::QuickGELU: {
      const float s = 1.0f / (1.0f + expf(-1.702f * x));
      return s * (1.0f + 1.702f * x * (1.0f - s));
    }
    default: {
      const float k = 0.79788456080286536f, c = 0.044715f;
      const float t = tanhf(k * (x + c * x * x * x));
      return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x * x);
    }
  }
}

}  // namespace hk::ops::cuda::detail
