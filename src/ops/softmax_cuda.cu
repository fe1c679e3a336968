// CUDA softmax (forward, backward) and cross-entropy (forward, backward).
//
// One block per row, f32 math, online max/sum (one pass for the statistics, one for the output).
// Cross-entropy: per-row loss = lse − logit[label] (0 for ignore_index; NaN for a label outside
// [0, V), which the CPU path rejects but the GPU cannot report without a sync). Mean/Sum reduce
// the per-row losses in a single block on the device (fixed order: deterministic); Mean divides
// by the device-side count of non-ignored labels, and 0 targets give 0. Backward reads dloss and
// the count on the device too, so nothing here synchronises the host.
// Not here: label smoothing, z-loss, softcapping (Liger's fused loss in kernels/ covers those).
#include <initializer_list>
#include <type_traits>

#include "ops/cuda_common.cuh"
#include "ops/cuda_ops.h"

namespace hk::ops::cuda {
namespace {
using namespace detail;

constexpr int kRowThreads = 256;
constexpr int kCeThreads = 512;  // long rows (vocabularies): more loads in flight per row

__global__ void softmax_kernel(const void* __restrict__ x, DType xdt, int64_t x_rs,
                               void* __restrict__ y, DType ydt, int64_t y_rs, int64_t cols) {
  __shared__ float sm[32], ss[32];
  const int64_t row = blockIdx.x;
  MaxSum st{-INFINITY, 0.0f};
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    st = maxsum_add(st, load_f32(x, xdt, row * x_rs + c));
  st = block_maxsum(st, sm, ss);
  const float inv = 1.0f / st.s;
  const bool empty = st.m == -INFINITY;  // every input -inf: zeros, like the CPU path (not NaN)
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    store_f32(y, ydt, row * y_rs + c,
              empty ? 0.0f : expf(load_f32(x, xdt, row * x_rs + c) - st.m) * inv);
}

__global__ void softmax_backward_kernel(const void* __restrict__ dy, DType dydt, int64_t dy_rs,
                                        const void* __restrict__ y, DType ydt, int64_t y_rs,
                                        void* __restrict__ dx, DType dxdt, int64_t dx_rs,
                                        int64_t cols) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    dot += load_f32(dy, dydt, row * dy_rs + c) * load_f32(y, ydt, row * y_rs + c);
  dot = block_sum(dot, scratch);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float yv = load_f32(y, ydt, row * y_rs + c);
    store_f32(dx, dxdt, row * dx_rs + c, yv * (load_f32(dy, dydt, row * dy_rs + c) - dot));
  }
}

// Per-thread (max, Σexp) over a row of T, VEC elements per 16-byte load: one rescale per vector,
// one exp per element. The caller merges threads with block_maxsum.
template <class T, int VEC>
__device__ __forceinline__ MaxSum row_maxsum(const T* __restrict__ row, int64_t cols) {
  MaxSum st{-INFINITY, 0.0f};
  const int64_t nv = cols / VEC;
#pragma unroll 2
  for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
    const Vec<T, VEC> x = reinterpret_cast<const Vec<T, VEC>*>(row)[v];
    float f[VEC];
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      f[k] = to_f32(x.v[k]);
      m = fmaxf(m, f[k]);
    }
    if (m > st.m) {
      st.s *= expf(st.m - m);
      st.m = m;
    }
    if (st.m != -INFINITY) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) st.s += expf(f[k] - st.m);
    }
  }
  for (int64_t c = nv * VEC + threadIdx.x; c < cols; c += blockDim.x)
    st = maxsum_add(st, to_f32(row[c]));
  return st;
}

// Per row: lse (optional), loss (0 when ignored), valid flag (1/0).
template <class T, int VEC>
__global__ void cross_entropy_rows_kernel(const T* __restrict__ logits, int64_t l_rs, int64_t cols,
                                          const void* __restrict__ labels, bool labels_i64,
                                          int64_t labels_stride, int64_t ignore_index,
                                          float* __restrict__ loss, float* __restrict__ valid,
                                          float* __restrict__ lse_out) {
  __shared__ float sm[32], ss[32];
  const int64_t row = blockIdx.x;
  const T* r = logits + row * l_rs;
  const MaxSum st = block_maxsum(row_maxsum<T, VEC>(r, cols), sm, ss);
  const float lse = st.m + logf(st.s);
  if (threadIdx.x != 0) return;
  if (lse_out) lse_out[row] = lse;
  const int64_t label = load_index(labels, labels_i64, row * labels_stride);
  float l = 0.0f, v = 0.0f;
  if (label != ignore_index) {
    v = 1.0f;
    l = (label < 0 || label >= cols) ? NAN : lse - to_f32(r[label]);
  }
  loss[row] = l;
  if (valid) valid[row] = v;
}

// out[0] = Σ loss (Sum) or Σ loss / Σ valid (Mean; 0 when nothing is valid). One block.
__global__ void reduce_loss_kernel(const float* __restrict__ loss, const float* __restrict__ valid,
                                   int64_t n, bool mean, float* __restrict__ out) {
  __shared__ float scratch[32];
  float s = 0.0f, c = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    s += loss[i];
    c += valid[i];
  }
  s = block_sum(s, scratch);
  c = block_sum(c, scratch);
  if (threadIdx.x == 0) out[0] = mean ? (c > 0.0f ? s / c : 0.0f) : s;
}

// count[0] = number of labels != ignore_index. One block.
__global__ void count_valid_kernel(const void* __restrict__ labels, bool labels_i64,
                                   int64_t labels_stride, int64_t n, int64_t ignore_index,
                                   float* __restrict__ count) {
  __shared__ float scratch[32];
  float c = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    c += load_index(labels, labels_i64, i * labels_stride) != ignore_index ? 1.0f : 0.0f;
  c = block_sum(c, scratch);
  if (threadIdx.x == 0) count[0] = c;
}

// dlogits = g·(softmax − onehot), g = dloss[row] (None), dloss[0] (Sum) or dloss[0]/count (Mean).
template <class T, int VEC>
__global__ void cross_entropy_backward_kernel(
    const float* __restrict__ dloss, int mode /*0 none, 1 sum, 2 mean*/,
    const float* __restrict__ count, const T* __restrict__ logits, int64_t l_rs, int64_t cols,
    const void* __restrict__ labels, bool labels_i64, int64_t labels_stride, int64_t ignore_index,
    const float* __restrict__ lse_in, T* __restrict__ dlogits, int64_t d_rs) {
  __shared__ float sm[32], ss[32];
  const int64_t row = blockIdx.x;
  const T* r = logits + row * l_rs;
  T* d = dlogits + row * d_rs;
  const int64_t nv = cols / VEC;
  const int64_t label = load_index(labels, labels_i64, row * labels_stride);
  if (label == ignore_index) {  // uniform over the block
    Vec<T, VEC> zero;
#pragma unroll
    for (int k = 0; k < VEC; ++k) zero.v[k] = from_f32<T>(0.0f);
    for (int64_t v = threadIdx.x; v < nv; v += blockDim.x)
      reinterpret_cast<Vec<T, VEC>*>(d)[v] = zero;
    for (int64_t c = nv * VEC + threadIdx.x; c < cols; c += blockDim.x) d[c] = from_f32<T>(0.0f);
    return;
  }
  float g;
  if (mode == 0)
    g = dloss[row];
  else if (mode == 1)
    g = dloss[0];
  else
    g = count[0] > 0.0f ? dloss[0] / count[0] : 0.0f;
  if (label < 0 || label >= cols) g = NAN;
  float lse;
  if (lse_in) {
    lse = lse_in[row];
  } else {
    const MaxSum st = block_maxsum(row_maxsum<T, VEC>(r, cols), sm, ss);
    lse = st.m + logf(st.s);
  }
#pragma unroll 2
  for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
    const Vec<T, VEC> x = reinterpret_cast<const Vec<T, VEC>*>(r)[v];
    Vec<T, VEC> o;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float p = expf(to_f32(x.v[k]) - lse);
      o.v[k] = from_f32<T>(g * (p - (v * VEC + k == label ? 1.0f : 0.0f)));
    }
    reinterpret_cast<Vec<T, VEC>*>(d)[v] = o;
  }
  for (int64_t c = nv * VEC + threadIdx.x; c < cols; c += blockDim.x)
    d[c] = from_f32<T>(g * (expf(to_f32(r[c]) - lse) - (c == label ? 1.0f : 0.0f)));
}

// Calls f(T{}, std::integral_constant<int, VEC>{}) with VEC = 16/sizeof(T) when every row of the
// given dense-row views starts 16-byte aligned, else VEC = 1.
template <class F>
void dispatch_rows_vec(DType dt, const char* op, std::initializer_list<Rows> rows, F&& f) {
  dispatch_float(dt, op, [&](auto tag) {
    using T = decltype(tag);
    constexpr int VEC = static_cast<int>(16 / sizeof(T));
    bool wide = true;
    for (const Rows& r : rows) wide = wide && r.row_stride % VEC == 0 && aligned_to(r.ptr, 16);
    if (wide)
      f(tag, std::integral_constant<int, VEC>{});
    else
      f(tag, std::integral_constant<int, 1>{});
  });
}

const float* f32_contiguous(const TensorView& v, Tensor& keep, Stream stream) {
  if (v.dtype == DType::F32 && v.is_contiguous()) return v.data_as<float>();
  keep = Tensor::empty(v.sizes(), DType::F32, v.device, stream);
  cast(v, keep.view(), stream);
  return keep.data_as<float>();
}

}  // namespace

void softmax(const TensorView& x, const TensorView& y, Stream stream) {
  require_float("softmax", x.dtype);
  require_float("softmax", y.dtype);
  if (x.numel() == 0) return;
  DeviceGuard guard(x.device);
  Tensor keep_x;
  const TensorView xv = dense_rows_input(x, keep_x, stream);
  WritableOutput out(y, false, false, stream);
  const Rows rx = rows_of(xv), ry = rows_of(out.view());
  softmax_kernel<<<checked_grid_x(rx.rows, "softmax"), kRowThreads, 0, native(stream)>>>(
      rx.ptr, x.dtype, rx.row_stride, ry.ptr, y.dtype, ry.row_stride, rx.cols);
  HK_CUDA_CHECK_LAUNCH();
  out.finish(stream);
}

void softmax_backward(const TensorView& dy, const TensorView& y, const TensorView& dx,
                      Stream stream) {
  for (const TensorView* v : {&dy, &y, &dx}) require_float("softmax_backward", v->dtype);
  if (dx.numel() == 0) return;
  DeviceGuard guard(dx.device);
  Tensor keep_dy, keep_y;
  const TensorView dyv = dense_rows_input(dy, keep_dy, stream);
  const TensorView yv = dense_rows_input(y, keep_y, stream);
  WritableOutput out(dx, false, false, stream);
  const Rows rdy = rows_of(dyv), ry = rows_of(yv), rdx = rows_of(out.view());
  softmax_backward_kernel<<<checked_grid_x(ry.rows, "softmax_backward"), kRowThreads, 0,
                            native(stream)>>>(rdy.ptr, dy.dtype, rdy.row_stride, ry.ptr, y.dtype,
                                              ry.row_stride, rdx.ptr, dx.dtype, rdx.row_stride,
                                              ry.cols);
  HK_CUDA_CHECK_LAUNCH();
  out.finish(stream);
}

void cross_entropy(const TensorView& logits, const TensorView& labels, const TensorView& loss,
                   const CrossEntropyOptions& options, const TensorView* lse, Stream stream) {
  require_float("cross_entropy", logits.dtype);
  if (labels.dtype != DType::I32 && labels.dtype != DType::I64)
    throw InvalidArgument("cross_entropy: labels must be i32 or i64");
  if (loss.dtype != DType::F32) throw InvalidArgument("cross_entropy: loss must be f32");
  DeviceGuard guard(logits.device);
  const cudaStream_t s = native(stream);
  const int64_t N =
      logits.ndim == 0 ? 1 : logits.numel() / std::max<int64_t>(1, logits.shape[logits.ndim - 1]);
  const bool reduce = options.reduction != Reduction::None;
  if (N == 0) {
    if (reduce) fill(loss, 0.0, stream);
    return;
  }
  Tensor keep_l, rows_loss, valid, lse_tmp;
  const TensorView lv = dense_rows_input(logits, keep_l, stream);
  const Rows rl = rows_of(lv);
  const int64_t labels_stride = labels.ndim ? labels.strides[labels.ndim - 1] : 1;
  if (labels.ndim > 1 && !labels.is_contiguous())
    throw InvalidArgument("cross_entropy: labels must be 1-D or contiguous");
  float* loss_ptr;
  WritableOutput none_out(loss, true, false, stream);
  if (reduce) {
    rows_loss = Tensor::empty({N}, DType::F32, logits.device, stream);
    valid = Tensor::empty({N}, DType::F32, logits.device, stream);
    loss_ptr = rows_loss.data_as<float>();
  } else {
    loss_ptr = none_out.view().data_as<float>();
  }
  float* lse_ptr = nullptr;
  if (lse) {
    if (lse->dtype == DType::F32 && lse->is_contiguous()) {
      lse_ptr = lse->data_as<float>();
    } else {
      lse_tmp = Tensor::empty({N}, DType::F32, logits.device, stream);
      lse_ptr = lse_tmp.data_as<float>();
    }
  }
  dispatch_rows_vec(logits.dtype, "cross_entropy", {rl}, [&](auto tag, auto vec) {
    using T = decltype(tag);
    cross_entropy_rows_kernel<T, decltype(vec)::value>
        <<<checked_grid_x(N, "cross_entropy"), kCeThreads, 0, s>>>(
            static_cast<const T*>(rl.ptr), rl.row_stride, rl.cols, labels.ptr(),
            labels.dtype == DType::I64, labels_stride, options.ignore_index, loss_ptr,
            reduce ? valid.data_as<float>() : nullptr, lse_ptr);
  });
  HK_CUDA_CHECK_LAUNCH();
  if (reduce) {
    WritableOutput scalar(loss, true, false, stream);
    reduce_loss_kernel<<<1, 1024, 0, s>>>(rows_loss.data_as<float>(), valid.data_as<float>(), N,
                                          options.reduction == Reduction::Mean,
                                          scalar.view().data_as<float>());
    HK_CUDA_CHECK_LAUNCH();
    scalar.finish(stream);
  } else {
    none_out.finish(stream);
  }
  if (lse_tmp.defined()) cast(lse_tmp.view().reshape(lse->sizes()), *lse, stream);
}

void cross_entropy_backward(const TensorView& dloss, const TensorView& logits,
                            const TensorView& labels, const TensorView& dlogits,
                            const CrossEntropyOptions& options, const TensorView* lse,
                            Stream stream) {
  require_float("cross_entropy_backward", logits.dtype);
  require_float("cross_entropy_backward", dlogits.dtype);
  if (labels.dtype != DType::I32 && labels.dtype != DType::I64)
    throw InvalidArgument("cross_entropy_backward: labels must be i32 or i64");
  if (dlogits.numel() == 0) return;
  DeviceGuard guard(logits.device);
  const cudaStream_t s = native(stream);
  Tensor keep_l, keep_dloss, keep_lse, count;
  const TensorView lv = dense_rows_input(logits, keep_l, stream);
  const Rows rl = rows_of(lv);
  const int64_t N = rl.rows;
  const int64_t labels_stride = labels.ndim ? labels.strides[labels.ndim - 1] : 1;
  if (labels.ndim > 1 && !labels.is_contiguous())
    throw InvalidArgument("cross_entropy_backward: labels must be 1-D or contiguous");
  const float* dloss_ptr = f32_contiguous(dloss, keep_dloss, stream);
  const int mode = options.reduction == Reduction::None  ? 0
                   : options.reduction == Reduction::Sum ? 1
                                                         : 2;
  if (mode == 2) {
    count = Tensor::empty({1}, DType::F32, logits.device, stream);
    count_valid_kernel<<<1, 1024, 0, s>>>(labels.ptr(), labels.dtype == DType::I64, labels_stride,
                                          N, options.ignore_index, count.data_as<float>());
    HK_CUDA_CHECK_LAUNCH();
  }
  const float* lse_ptr = lse ? f32_contiguous(*lse, keep_lse, stream) : nullptr;
  // Gradients in the logits' dtype (the usual case); any other dtype via a temporary and a cast.
  WritableOutput out(dlogits, false, false, stream);
  Tensor d_tmp;
  TensorView dv = out.view();
  if (dlogits.dtype != logits.dtype) {
    d_tmp = Tensor::empty(dlogits.sizes(), logits.dtype, dlogits.device, stream);
    dv = d_tmp.view();
  }
  const Rows rd = rows_of(dv);
  dispatch_rows_vec(logits.dtype, "cross_entropy_backward", {rl, rd}, [&](auto tag, auto vec) {
    using T = decltype(tag);
    cross_entropy_backward_kernel<T, decltype(vec)::value>
        <<<checked_grid_x(N, "cross_entropy_backward"), kCeThreads, 0, s>>>(
            dloss_ptr, mode, mode == 2 ? count.data_as<float>() : nullptr,
            static_cast<const T*>(rl.ptr), rl.row_stride, rl.cols, labels.ptr(),
            labels.dtype == DType::I64, labels_stride, options.ignore_index, lse_ptr,
            static_cast<T*>(rd.ptr), rd.row_stride);
  });
  HK_CUDA_CHECK_LAUNCH();
  if (d_tmp.defined()) cast(d_tmp.view(), out.view(), stream);
  out.finish(stream);
}

}  // namespace hk::ops::cuda
