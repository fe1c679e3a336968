// CUDA add, mul, scale, cast and fill (see hk/ops.h for the semantics).
//
// add/mul/scale and float-to-float casts go through the elementwise engine (16-byte vectors on
// dense rows, a strided kernel for broadcasts and other views). Casts that involve f64 or integer
// dtypes, and fill, use small run-time-typed strided kernels: they are not on any hot path.
#include <cstring>

#include "hk/dtype.h"
#include "ops/cuda_ops.h"
#include "ops/elementwise_cuda.cuh"

namespace hk::ops::cuda {
namespace {
using namespace detail;

struct AddOp {
  static constexpr int kInputs = 2;
  float alpha;
  __device__ float operator()(float a, float b) const { return a + alpha * b; }
};
struct MulOp {
  static constexpr int kInputs = 2;
  __device__ float operator()(float a, float b) const { return a * b; }
};
struct ScaleOp {
  static constexpr int kInputs = 1;
  float factor;
  __device__ float operator()(float a, float) const { return a * factor; }
};
struct IdentityOp {
  static constexpr int kInputs = 1;
  __device__ float operator()(float a, float) const { return a; }
};

// ---- casts between any dtypes (through double) -------------------------------------------------
__device__ double load_any(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::F32:
      return static_cast<const float*>(p)[i];
    case DType::F16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case DType::BF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::F64:
      return static_cast<const double*>(p)[i];
    case DType::I32:
      return static_cast<const int32_t*>(p)[i];
    case DType::I64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::U8:
      return static_cast<const uint8_t*>(p)[i];
    case DType::Bool:
      return static_cast<const uint8_t*>(p)[i] != 0 ? 1.0 : 0.0;
  }
  return 0.0;
}
__device__ void store_any(void* p, DType dt, int64_t i, double v) {
  switch (dt) {
    case DType::F32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DType::F16:
      static_cast<__half*>(p)[i] = __float2half_rn(static_cast<float>(v));
      break;
    case DType::BF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(static_cast<float>(v));
      break;
    case DType::F64:
      static_cast<double*>(p)[i] = v;
      break;
    case DType::I32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DType::I64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case DType::U8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(static_cast<int64_t>(v));
      break;
    case DType::Bool:
      static_cast<uint8_t*>(p)[i] = v != 0.0 ? 1 : 0;
      break;
  }
}
__global__ void cast_any_kernel(void* __restrict__ out, DType odt, const void* __restrict__ x,
                                DType xdt, int64_t n, Layout3 layout) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t oo, ox, unused;
    layout_offsets(layout, i, oo, ox, unused);
    store_any(out, odt, oo, load_any(x, xdt, ox));
  }
}

template <class U>
__global__ void fill_kernel(U* __restrict__ out, U value, int64_t n, Layout3 layout,
                            bool contiguous) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t oo = i, u1, u2;
    if (!contiguous) layout_offsets(layout, i, oo, u1, u2);
    out[oo] = value;
  }
}

template <class U>
void launch_fill(const TensorView& out, U value, cudaStream_t s) {
  const int64_t n = out.numel();
  const int threads = 256;
  fill_kernel<U><<<grid_for(n, threads, 16), threads, 0, s>>>(
      static_cast<U*>(out.ptr()), value, n, make_layout(out), out.is_contiguous());
  HK_CUDA_CHECK_LAUNCH();
}

}  // namespace

void add(const TensorView& a, const TensorView& b, const TensorView& out, float alpha,
         Stream stream) {
  run_elementwise("add", out, a, &b, AddOp{alpha}, stream);
}

void mul(const TensorView& a, const TensorView& b, const TensorView& out, Stream stream) {
  run_elementwise("mul", out, a, &b, MulOp{}, stream);
}

void scale(const TensorView& x, float factor, const TensorView& out, Stream stream) {
  run_elementwise("scale", out, x, nullptr, ScaleOp{factor}, stream);
}

void cast(const TensorView& x, const TensorView& out, Stream stream) {
  if (out.numel() == 0) return;
  if (x.dtype == out.dtype) {
    copy_view(out, x, stream);
    return;
  }
  DeviceGuard guard(out.device);
  const cudaStream_t s = native(stream);
  bool done = false;
  if (is_float_dtype(x.dtype) && is_float_dtype(out.dtype)) {
    dispatch_float(out.dtype, "cast", [&](auto otag) {
      using TO = decltype(otag);
      dispatch_float(x.dtype, "cast", [&](auto xtag) {
        using TX = decltype(xtag);
        done = launch_elementwise_dense<IdentityOp, TO, TX, TX>(out, x, nullptr, IdentityOp{}, s);
      });
    });
  }
  if (done) return;
  const int64_t n = out.numel();
  const int threads = 256;
  cast_any_kernel<<<grid_for(n, threads, 16), threads, 0, s>>>(out.ptr(), out.dtype, x.ptr(),
                                                               x.dtype, n, make_layout(out, &x));
  HK_CUDA_CHECK_LAUNCH();
}

void fill(const TensorView& out, double value, Stream stream) {
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device);
  const cudaStream_t s = native(stream);
  switch (out.dtype) {
    case DType::F32:
      launch_fill<uint32_t>(
          out,
          [&] {
            float f = static_cast<float>(value);
            uint32_t u;
            std::memcpy(&u, &f, 4);
            return u;
          }(),
          s);
      break;
    case DType::F64:
      launch_fill<uint64_t>(
          out,
          [&] {
            uint64_t u;
            std::memcpy(&u, &value, 8);
            return u;
          }(),
          s);
      break;
    case DType::BF16:
      launch_fill<uint16_t>(out, float_to_bf16(static_cast<float>(value)).bits, s);
      break;
    case DType::F16:
      launch_fill<uint16_t>(out, float_to_f16(static_cast<float>(value)).bits, s);
      break;
    case DType::I32:
      launch_fill<uint32_t>(out, static_cast<uint32_t>(static_cast<int32_t>(value)), s);
      break;
    case DType::I64:
      launch_fill<uint64_t>(out, static_cast<uint64_t>(static_cast<int64_t>(value)), s);
      break;
    case DType::U8:
      launch_fill<uint8_t>(out, static_cast<uint8_t>(static_cast<int64_t>(value)), s);
      break;
    case DType::Bool:
      launch_fill<uint8_t>(out, value != 0.0 ? 1 : 0, s);
      break;
  }
}

}  // namespace hk::ops::cuda
