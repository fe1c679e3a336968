// rmsnorm_cuda.cu — the cuda variant of kernels-community/rmsnorm: entry `RMSNorm`, rms_norm@1.
//
// Forward: one block per row; 16-byte vector loads when the row allows it; f32 math; the row is
// read twice (sum of squares, then normalise — the second read hits L1/L2). Backward: a grid of at
// most kMaxPartials blocks walks the rows; each block keeps its dweight partial sums for all
// columns in shared memory (f32, owned per thread, no atomics), writes them to the caller's
// workspace, and a second kernel reduces the partials into dweight. Capture-safe: no allocation,
// no host sync — scratch comes from the workspace the entry asks for. x, y, dy, dx and weight
// share one dtype (f32, bf16 or f16); dweight is f32 or that dtype. Anything else → UNSUPPORTED.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "hk/kernel_sdk.h"
#include "hk/kernel_sdk_cuda.cuh"
#include "rmsnorm_problem.h"

namespace rmsnorm {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxPartials = 256;

using hk::sdk::cuda::from_f32;
using hk::sdk::cuda::round_as;
using hk::sdk::cuda::to_f32;

template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// Sum over the block; every thread gets the total. Contains barriers: call uniformly.
__device__ float block_sum(float v, float* shared) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < static_cast<int>(blockDim.x / 32); ++i) total += shared[i];
  __syncthreads();
  return total;
}

template <class T, int N>
__device__ float row_sum_squares(const T* x, int64_t hidden) {
  float sum = 0.0f;
  for (int64_t j = threadIdx.x * N; j < hidden; j += static_cast<int64_t>(blockDim.x) * N) {
    const Vec<T, N> v = *reinterpret_cast<const Vec<T, N>*>(x + j);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float f = to_f32(v.v[k]);
      sum += f * f;
    }
  }
  return sum;
}

template <class T, int N>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ x, int64_t x_rs, const T* __restrict__ w,
                   T* __restrict__ y, int64_t y_rs, float* __restrict__ rstd, int64_t rstd_s,
                   int64_t hidden, float eps, float offset, bool llama) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * x_rs;
  T* yr = y + row * y_rs;
  const float r =
      1.0f /
      sqrtf(block_sum(row_sum_squares<T, N>(xr, hidden), red) / static_cast<float>(hidden) + eps);
  for (int64_t j = threadIdx.x * N; j < hidden; j += static_cast<int64_t>(blockDim.x) * N) {
    const Vec<T, N> xv = *reinterpret_cast<const Vec<T, N>*>(xr + j);
    const Vec<T, N> wv = *reinterpret_cast<const Vec<T, N>*>(w + j);
    Vec<T, N> out;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float n = to_f32(xv.v[k]) * r;
      if (llama) n = round_as<T>(n);
      out.v[k] = from_f32<T>(n * (offset + to_f32(wv.v[k])));
    }
    *reinterpret_cast<Vec<T, N>*>(yr + j) = out;
  }
  if (rstd != nullptr && threadIdx.x == 0) rstd[row * rstd_s] = r;
}

// Each thread owns columns j = threadIdx.x*N + k (+ multiples of blockDim.x*N) of `acc`.
template <class T, int N>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(const T* __restrict__ dy, int64_t dy_rs, const T* __restrict__ x, int64_t x_rs,
                    const T* __restrict__ w, const float* __restrict__ rstd, int64_t rstd_s,
                    T* __restrict__ dx, int64_t dx_rs, float* __restrict__ partial, int64_t rows,
                    int64_t hidden, float eps, float offset, bool llama) {
  extern __shared__ float acc[];
  __shared__ float red[32];
  const int64_t step = static_cast<int64_t>(blockDim.x) * N;
  if (partial != nullptr) {
    for (int64_t j = threadIdx.x * N; j < hidden; j += step)
#pragma unroll
      for (int k = 0; k < N; ++k) acc[j + k] = 0.0f;
  }
  const float inv_h = 1.0f / static_cast<float>(hidden);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * x_rs;
    const T* dyr = dy + row * dy_rs;
    T* dxr = dx + row * dx_rs;
    const float r =
        rstd != nullptr
            ? rstd[row * rstd_s]
            : 1.0f / sqrtf(block_sum(row_sum_squares<T, N>(xr, hidden), red) * inv_h + eps);
    float dot = 0.0f;
    for (int64_t j = threadIdx.x * N; j < hidden; j += step) {
      const Vec<T, N> xv = *reinterpret_cast<const Vec<T, N>*>(xr + j);
      const Vec<T, N> dyv = *reinterpret_cast<const Vec<T, N>*>(dyr + j);
      const Vec<T, N> wv = *reinterpret_cast<const Vec<T, N>*>(w + j);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float m = to_f32(xv.v[k]) * r;
        const float d = to_f32(dyv.v[k]);
        dot += d * (offset + to_f32(wv.v[k])) * m;
        if (partial != nullptr) acc[j + k] += d * (llama ? round_as<T>(m) : m);
      }
    }
    const float mean_dot = block_sum(dot, red) * inv_h;
    for (int64_t j = threadIdx.x * N; j < hidden; j += step) {
      const Vec<T, N> xv = *reinterpret_cast<const Vec<T, N>*>(xr + j);
      const Vec<T, N> dyv = *reinterpret_cast<const Vec<T, N>*>(dyr + j);
      const Vec<T, N> wv = *reinterpret_cast<const Vec<T, N>*>(w + j);
      Vec<T, N> out;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float g = to_f32(dyv.v[k]) * (offset + to_f32(wv.v[k]));
        out.v[k] = from_f32<T>(r * (g - to_f32(xv.v[k]) * r * mean_dot));
      }
      *reinterpret_cast<Vec<T, N>*>(dxr + j) = out;
    }
  }
  if (partial != nullptr) {
    float* mine = partial + static_cast<int64_t>(blockIdx.x) * hidden;
    for (int64_t j = threadIdx.x * N; j < hidden; j += step)
#pragma unroll
      for (int k = 0; k < N; ++k) mine[j + k] = acc[j + k];
  }
}

template <class W>
__global__ void dweight_kernel(const float* __restrict__ partial, int parts, int64_t hidden,
                               W* __restrict__ dweight, bool accumulate) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= hidden) return;
  float sum = accumulate ? to_f32(dweight[j]) : 0.0f;
  for (int p = 0; p < parts; ++p) sum += partial[static_cast<int64_t>(p) * hidden + j];
  dweight[j] = from_f32<W>(sum);
}

// ---- host side ----------------------------------------------------------------------------------

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    fail(HK_STATUS_DEVICE_ERROR, std::string(what) + ": " + cudaGetErrorString(status));
  }
}

// Makes the tensors' device current for the call and restores the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (device != previous_) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
};

bool aligned(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) % 16) == 0;
}

template <class T>
int vector_width(const Problem& p, std::initializer_list<const RowTensor*> tensors) {
  constexpr int n = static_cast<int>(16 / sizeof(T));
  if (p.hidden % n != 0) return 1;
  for (const RowTensor* t : tensors) {
    if (t->t == nullptr) continue;
    if (!aligned(t->ptr) || (p.rows > 1 && t->row_stride % n != 0)) return 1;
  }
  return n;
}

void check_same_dtype(const Problem& p, std::initializer_list<const RowTensor*> tensors) {
  for (const RowTensor* t : tensors) {
    if (t->t != nullptr && t->dtype != p.x.dtype) {
      fail(HK_STATUS_UNSUPPORTED, "the cuda RMSNorm needs x, weight, y/dy/dx in one dtype (got " +
                                      std::string(hk::sdk::dtype_code_name(t->dtype)) + " beside " +
                                      hk::sdk::dtype_code_name(p.x.dtype) + ")");
    }
  }
}

template <class T>
void launch_forward(const Problem& p, cudaStream_t stream) {
  const int n = vector_width<T>(p, {&p.x, &p.y, &p.weight});
  auto* x = static_cast<const T*>(p.x.ptr);
  auto* w = static_cast<const T*>(p.weight.ptr);
  auto* y = static_cast<T*>(p.y.ptr);
  auto* rstd = static_cast<float*>(p.rstd.ptr);
  const bool llama = p.attrs.casting_mode == hk::kRmsNormCastingLlama;
  const dim3 grid(static_cast<unsigned>(p.rows));
  if (n > 1) {
    forward_kernel<T, 16 / sizeof(T)><<<grid, kThreads, 0, stream>>>(
        x, p.x.row_stride, w, y, p.y.row_stride, rstd, p.rstd.row_stride, p.hidden, p.attrs.eps,
        p.attrs.offset, llama);
  } else {
    forward_kernel<T, 1><<<grid, kThreads, 0, stream>>>(x, p.x.row_stride, w, y, p.y.row_stride,
                                                        rstd, p.rstd.row_stride, p.hidden,
                                                        p.attrs.eps, p.attrs.offset, llama);
  }
  check_cuda(cudaGetLastError(), "RMSNorm forward launch");
}

int64_t partial_count(const Problem& p) {
  return p.rows < kMaxPartials ? p.rows : kMaxPartials;
}

size_t backward_workspace(const Problem& p) {
  if (p.dweight.t == nullptr || p.rows == 0) return 0;
  return static_cast<size_t>(partial_count(p) * p.hidden) * sizeof(float);
}

template <class T, int N>
void launch_backward_kernel(const Problem& p, float* partial, int parts, size_t shared,
                            cudaStream_t stream) {
  auto kernel = backward_kernel<T, N>;
  if (shared > 48 * 1024) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(shared)),
               "cudaFuncSetAttribute");
  }
  kernel<<<parts, kThreads, shared, stream>>>(
      static_cast<const T*>(p.dy.ptr), p.dy.row_stride, static_cast<const T*>(p.x.ptr),
      p.x.row_stride, static_cast<const T*>(p.weight.ptr), static_cast<const float*>(p.rstd.ptr),
      p.rstd.row_stride, static_cast<T*>(p.dx.ptr), p.dx.row_stride, partial, p.rows, p.hidden,
      p.attrs.eps, p.attrs.offset, p.attrs.casting_mode == hk::kRmsNormCastingLlama);
  check_cuda(cudaGetLastError(), "RMSNorm backward launch");
}

template <class T>
void launch_backward(const Problem& p, const hk_call& call, cudaStream_t stream) {
  const int parts = static_cast<int>(partial_count(p));
  float* partial = nullptr;
  size_t shared = 0;
  if (p.dweight.t != nullptr) {
    const size_t need = backward_workspace(p);
    if (call.workspace == nullptr || call.workspace_size < need) {
      fail(HK_STATUS_INVALID_ARGUMENT, "RMSNorm backward needs " + std::to_string(need) +
                                           " bytes of workspace for dweight (ask workspace_size)");
    }
    partial = static_cast<float*>(call.workspace);
    shared = static_cast<size_t>(p.hidden) * sizeof(float);
    int device = 0, optin = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
               "cudaDeviceGetAttribute");
    if (shared + 32 * sizeof(float) > static_cast<size_t>(optin)) {
      fail(HK_STATUS_UNSUPPORTED, "hidden size " + std::to_string(p.hidden) +
                                      " is too large for this kernel's dweight reduction");
    }
  }
  if (vector_width<T>(p, {&p.x, &p.dy, &p.dx, &p.weight}) > 1) {
    launch_backward_kernel<T, 16 / sizeof(T)>(p, partial, parts, shared, stream);
  } else {
    launch_backward_kernel<T, 1>(p, partial, parts, shared, stream);
  }
  if (partial == nullptr) return;
  const bool accumulate = (p.attrs.flags & hk::kAccumulateWeightGrads) != 0;
  const unsigned blocks = static_cast<unsigned>((p.hidden + kThreads - 1) / kThreads);
  if (p.dweight.dtype == HK_DTYPE_F32) {
    dweight_kernel<float><<<blocks, kThreads, 0, stream>>>(
        partial, parts, p.hidden, static_cast<float*>(p.dweight.ptr), accumulate);
  } else if (p.dweight.dtype == p.x.dtype) {
    dweight_kernel<T><<<blocks, kThreads, 0, stream>>>(partial, parts, p.hidden,
                                                       static_cast<T*>(p.dweight.ptr), accumulate);
  } else {
    fail(HK_STATUS_UNSUPPORTED, "the cuda RMSNorm writes dweight as f32 or in x's dtype");
  }
  check_cuda(cudaGetLastError(), "RMSNorm dweight launch");
}

template <template <class> class Fn, class... Args>
void dispatch(int32_t dtype, Args&&... args) {
  switch (dtype) {
    case HK_DTYPE_F32:
      Fn<float>::run(args...);
      break;
    case HK_DTYPE_BF16:
      Fn<__nv_bfloat16>::run(args...);
      break;
    case HK_DTYPE_F16:
      Fn<__half>::run(args...);
      break;
    default:
      fail(HK_STATUS_UNSUPPORTED, "the cuda RMSNorm computes in f32, bf16 or f16");
  }
}
template <class T>
struct Forward {
  static void run(const Problem& p, cudaStream_t s) { launch_forward<T>(p, s); }
};
template <class T>
struct Backward {
  static void run(const Problem& p, const hk_call& c, cudaStream_t s) {
    launch_backward<T>(p, c, s);
  }
};

void forward(const hk_call& call) {
  const Problem p = forward_problem(call, HK_DEVICE_CUDA);
  check_same_dtype(p, {&p.weight, &p.y});
  if (p.rows == 0 || p.hidden == 0) return;
  DeviceScope scope(p.x.t->device_id);
  dispatch<Forward>(p.x.dtype, p, static_cast<cudaStream_t>(call.stream));
}

void backward(const hk_call& call) {
  const Problem p = backward_problem(call, HK_DEVICE_CUDA);
  check_same_dtype(p, {&p.weight, &p.dy, &p.dx});
  if (p.rows == 0 || p.hidden == 0) return;
  DeviceScope scope(p.x.t->device_id);
  dispatch<Backward>(p.x.dtype, p, call, static_cast<cudaStream_t>(call.stream));
}

size_t workspace(const hk_call& call, uint32_t pass) {
  if (pass != HK_PASS_BACKWARD) return 0;
  return backward_workspace(backward_problem(call, HK_DEVICE_CUDA));
}

}  // namespace

// The entry functions, for the table in rmsnorm_cuda_library.cc (host C++ compiled by the C++
// compiler, so designated initialisers are available).
hk_status cuda_forward(const hk_call* call) {
  return hk::sdk::entry_point<forward>(call);
}
hk_status cuda_backward(const hk_call* call) {
  return hk::sdk::entry_point<backward>(call);
}
hk_status cuda_workspace(const hk_call* call, uint32_t pass, size_t* bytes) {
  return hk::sdk::workspace_point<workspace>(call, pass, bytes);
}

}  // namespace rmsnorm
