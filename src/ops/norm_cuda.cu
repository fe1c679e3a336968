// CUDA RMSNorm (forward, backward) and LayerNorm (forward).
//
// One block per row. RMSNorm forward is the hot path: templated on the input, weight and output
// storage types with 16-byte vector loads; the row is read twice (sum of squares, then scale), the
// second read coming from L1/L2. Semantics follow Transformers' Llama/Qwen RMSNorm: r = rsqrt(mean
// (x²) + eps) in f32, n = round_to(x.dtype, x·r), y = round_to(y.dtype, n·w). Weight/output dtype
// combinations other than (x's dtype or f32) go through f32 temporaries and a cast.
// Backward and LayerNorm are run-time-typed (scalar loads): correct, not tuned.
#include "ops/column_sum_cuda.cuh"
#include "ops/cuda_common.cuh"
#include "ops/cuda_ops.h"

namespace hk::ops::cuda {
namespace {
using namespace detail;

template <class T, class TW, class TY, int VEC>
__global__ void rms_norm_kernel(const T* __restrict__ x, int64_t x_rs, const TW* __restrict__ w,
                                TY* __restrict__ y, int64_t y_rs, float* __restrict__ rstd,
                                int64_t cols, float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * x_rs;
  TY* yr = y + row * y_rs;
  const int64_t nv = cols / VEC;
  float ss = 0.0f;
#pragma unroll 4
  for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
    const Vec<T, VEC> xv = reinterpret_cast<const Vec<T, VEC>*>(xr)[v];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float f = to_f32(xv.v[k]);
      ss += f * f;
    }
  }
  ss = block_sum(ss, scratch);
  const float r = rsqrtf(ss / static_cast<float>(cols) + eps);
  if (rstd && threadIdx.x == 0) rstd[row] = r;
  for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
    const Vec<T, VEC> xv = reinterpret_cast<const Vec<T, VEC>*>(xr)[v];
    const Vec<TW, VEC> wv = reinterpret_cast<const Vec<TW, VEC>*>(w)[v];
    Vec<TY, VEC> yv;
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      yv.v[k] = from_f32<TY>(round_as<T>(to_f32(xv.v[k]) * r) * to_f32(wv.v[k]));
    reinterpret_cast<Vec<TY, VEC>*>(yr)[v] = yv;
  }
}

// residual = round(residual + delta), then y = rms_norm(residual): the decoder's residual step in
// one pass (one read of residual and delta, one write of residual and y). In the second loop each
// thread re-reads only the vectors it wrote itself in the first, so no barrier is needed for them.
template <class T, class TW, int VEC>
__global__ void add_rms_norm_kernel(T* residual, int64_t r_rs, const T* __restrict__ delta,
                                    int64_t d_rs, const TW* __restrict__ w, T* __restrict__ y,
                                    int64_t y_rs, int64_t cols, float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  T* rr = residual + row * r_rs;
  const T* dr = delta + row * d_rs;
  T* yr = y + row * y_rs;
  const int64_t nv = cols / VEC;
  float ss = 0.0f;
  for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
    Vec<T, VEC> a = reinterpret_cast<const Vec<T, VEC>*>(rr)[v];
    const Vec<T, VEC> b = reinterpret_cast<const Vec<T, VEC>*>(dr)[v];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      a.v[k] = from_f32<T>(to_f32(a.v[k]) + to_f32(b.v[k]));
      const float f = to_f32(a.v[k]);
      ss += f * f;
    }
    reinterpret_cast<Vec<T, VEC>*>(rr)[v] = a;
  }
  ss = block_sum(ss, scratch);
  const float r = rsqrtf(ss / static_cast<float>(cols) + eps);
  for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
    const Vec<T, VEC> a = reinterpret_cast<const Vec<T, VEC>*>(rr)[v];
    const Vec<TW, VEC> wv = reinterpret_cast<const Vec<TW, VEC>*>(w)[v];
    Vec<T, VEC> yv;
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      yv.v[k] = from_f32<T>(round_as<T>(to_f32(a.v[k]) * r) * to_f32(wv.v[k]));
    reinterpret_cast<Vec<T, VEC>*>(yr)[v] = yv;
  }
}

// Threads for a row of `vecs` vector accesses: about four per thread, so a block keeps several
// independent loads in flight and an SM holds many rows at once (memory-level parallelism). A
// launch of few rows (decode: one row per sequence) gets one access per thread instead: 64 rows
// of 32 threads would leave the GPU nearly idle while each warp walks its row serially.
int vector_row_threads(int64_t vecs, int64_t rows) {
  const int64_t per_thread = rows >= 1024 ? 4 : 1;
  const int64_t t = ((vecs + per_thread - 1) / per_thread + 31) / 32 * 32;
  return static_cast<int>(std::max<int64_t>(32, std::min<int64_t>(t, 1024)));
}

int row_threads(int64_t work) {
  const int64_t t = (work + 31) / 32 * 32;
  return static_cast<int>(std::max<int64_t>(32, std::min<int64_t>(t, 512)));
}

template <class T, class TW, class TY>
void launch_rms_norm(const Rows& rx, const TensorView& w, const Rows& ry, float* rstd, float eps,
                     cudaStream_t s) {
  constexpr size_t widest = sizeof(T) > sizeof(TY)
                                ? (sizeof(T) > sizeof(TW) ? sizeof(T) : sizeof(TW))
                                : (sizeof(TY) > sizeof(TW) ? sizeof(TY) : sizeof(TW));
  constexpr int VEC = static_cast<int>(16 / widest);
  const bool wide = rx.cols % VEC == 0 && rx.row_stride % VEC == 0 && ry.row_stride % VEC == 0 &&
                    aligned_to(rx.ptr, sizeof(T) * VEC) && aligned_to(ry.ptr, sizeof(TY) * VEC) &&
                    aligned_to(w.ptr(), sizeof(TW) * VEC);
  const unsigned grid = checked_grid_x(rx.rows, "rms_norm");
  if (wide) {
    rms_norm_kernel<T, TW, TY, VEC><<<grid, vector_row_threads(rx.cols / VEC, rx.rows), 0, s>>>(
        static_cast<const T*>(rx.ptr), rx.row_stride, static_cast<const TW*>(w.ptr()),
        static_cast<TY*>(ry.ptr), ry.row_stride, rstd, rx.cols, eps);
  } else {
    rms_norm_kernel<T, TW, TY, 1><<<grid, vector_row_threads(rx.cols, rx.rows), 0, s>>>(
        static_cast<const T*>(rx.ptr), rx.row_stride, static_cast<const TW*>(w.ptr()),
        static_cast<TY*>(ry.ptr), ry.row_stride, rstd, rx.cols, eps);
  }
  HK_CUDA_CHECK_LAUNCH();
}

template <class T, class TW>
bool launch_add_rms_norm(const Rows& rr, const Rows& rd, const Rows& ry, const TensorView& w,
                         float eps, cudaStream_t s) {
  constexpr int VEC = static_cast<int>(16 / (sizeof(TW) > sizeof(T) ? sizeof(TW) : sizeof(T)));
  const bool wide = rr.cols % VEC == 0 && rr.row_stride % VEC == 0 && rd.row_stride % VEC == 0 &&
                    ry.row_stride % VEC == 0 && aligned_to(rr.ptr, sizeof(T) * VEC) &&
                    aligned_to(rd.ptr, sizeof(T) * VEC) && aligned_to(ry.ptr, sizeof(T) * VEC) &&
                    aligned_to(w.ptr(), sizeof(TW) * VEC);
  if (!wide) return false;
  add_rms_norm_kernel<T, TW, VEC><<<checked_grid_x(rr.rows, "add_rms_norm"),
                                    vector_row_threads(rr.cols / VEC, rr.rows), 0, s>>>(
      static_cast<T*>(rr.ptr), rr.row_stride, static_cast<const T*>(rd.ptr), rd.row_stride,
      static_cast<const TW*>(w.ptr()), static_cast<T*>(ry.ptr), ry.row_stride, rr.cols, eps);
  HK_CUDA_CHECK_LAUNCH();
  return true;
}

__global__ void rms_norm_backward_kernel(const void* __restrict__ dy, DType dydt, int64_t dy_rs,
                                         const void* __restrict__ x, DType xdt, int64_t x_rs,
                                         const void* __restrict__ w, DType wdt,
                                         const float* __restrict__ rstd_in,
                                         float* __restrict__ rstd_out, void* __restrict__ dx,
                                         DType dxdt, int64_t dx_rs, int64_t cols, float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  float sgx = 0.0f, sxx = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xv = load_f32(x, xdt, row * x_rs + c);
    const float g = load_f32(dy, dydt, row * dy_rs + c) * load_f32(w, wdt, c);
    sgx += g * xv;
    sxx += xv * xv;
  }
  sgx = block_sum(sgx, scratch);
  float r;
  if (rstd_in) {
    r = rstd_in[row];
  } else {
    sxx = block_sum(sxx, scratch);
    r = rsqrtf(sxx / static_cast<float>(cols) + eps);
  }
  if (rstd_out && threadIdx.x == 0) rstd_out[row] = r;
  // dx = r·(g − n·mean(g·n)), n = x·r; mean(g·n) = r·Σ(g·x)/cols.
  const float k = r * r * sgx / static_cast<float>(cols);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xv = load_f32(x, xdt, row * x_rs + c);
    const float g = load_f32(dy, dydt, row * dy_rs + c) * load_f32(w, wdt, c);
    store_f32(dx, dxdt, row * dx_rs + c, r * g - r * k * xv);
  }
}

__global__ void layer_norm_kernel(const void* __restrict__ x, DType xdt, int64_t x_rs,
                                  const void* __restrict__ w, DType wdt, const void* __restrict__ b,
                                  DType bdt, void* __restrict__ y, DType ydt, int64_t y_rs,
                                  int64_t cols, float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += load_f32(x, xdt, row * x_rs + c);
  const float mean = block_sum(sum, scratch) / static_cast<float>(cols);
  float sq = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = load_f32(x, xdt, row * x_rs + c) - mean;
    sq += d * d;
  }
  const float r = rsqrtf(block_sum(sq, scratch) / static_cast<float>(cols) + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = (load_f32(x, xdt, row * x_rs + c) - mean) * r * load_f32(w, wdt, c);
    if (b) v += load_f32(b, bdt, c);
    store_f32(y, ydt, row * y_rs + c, v);
  }
}

}  // namespace

void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& y,
              const TensorView* rstd, Stream stream) {
  require_float("rms_norm", x.dtype);
  require_float("rms_norm", weight.dtype);
  require_float("rms_norm", y.dtype);
  if (x.numel() == 0) return;
  DeviceGuard guard(x.device);
  const cudaStream_t s = native(stream);
  Tensor keep_x, keep_w, keep_rstd, y_f32;
  const TensorView xv = dense_rows_input(x, keep_x, stream);
  // Weight in x's dtype or f32; anything else becomes an f32 copy.
  TensorView wv = contiguous_input(weight, keep_w, stream);
  if (wv.dtype != x.dtype && wv.dtype != DType::F32) {
    Tensor wf = Tensor::empty(weight.sizes(), DType::F32, weight.device, stream);
    cast(wv, wf.view(), stream);
    keep_w = wf;
    wv = keep_w.view();
  }
  // Output in x's dtype or f32 directly; anything else via an f32 temporary and one cast (still
  // a single rounding of the f32 product).
  const bool direct_dtype = y.dtype == x.dtype || y.dtype == DType::F32;
  WritableOutput out(y, false, false, stream);
  TensorView yv = out.view();
  if (!direct_dtype) {
    y_f32 = Tensor::empty(y.sizes(), DType::F32, y.device, stream);
    yv = y_f32.view();
  }
  float* rstd_ptr = nullptr;
  if (rstd) {
    if (rstd->is_contiguous() && rstd->dtype == DType::F32) {
      rstd_ptr = rstd->data_as<float>();
    } else {
      keep_rstd = Tensor::empty(rstd->sizes(), DType::F32, rstd->device, stream);
      rstd_ptr = keep_rstd.data_as<float>();
    }
  }
  const Rows rx = rows_of(xv), ry = rows_of(yv);
  dispatch_float(x.dtype, "rms_norm", [&](auto xtag) {
    using T = decltype(xtag);
    const bool w_same = wv.dtype == x.dtype, y_same = yv.dtype == x.dtype;
    if (w_same && y_same)
      launch_rms_norm<T, T, T>(rx, wv, ry, rstd_ptr, eps, s);
    else if (w_same)
      launch_rms_norm<T, T, float>(rx, wv, ry, rstd_ptr, eps, s);
    else if (y_same)
      launch_rms_norm<T, float, T>(rx, wv, ry, rstd_ptr, eps, s);
    else
      launch_rms_norm<T, float, float>(rx, wv, ry, rstd_ptr, eps, s);
  });
  if (!direct_dtype) cast(y_f32.view(), out.view(), stream);
  out.finish(stream);
  if (keep_rstd.defined()) cast(keep_rstd.view(), *rstd, stream);
}

void add_rms_norm(const TensorView& residual, const TensorView& delta, const TensorView& weight,
                  float eps, const TensorView& y, Stream stream) {
  if (residual.numel() == 0) return;
  // The fused kernel covers the decoder's case: dense aligned rows, y in the residual's dtype,
  // weight in that dtype or f32. Anything else runs the two ops it stands for.
  const DType t = residual.dtype;
  bool done = false;
  if (residual.rows_are_dense() && delta.rows_are_dense() && y.rows_are_dense() && y.dtype == t &&
      (weight.dtype == t || weight.dtype == DType::F32) && weight.is_contiguous()) {
    DeviceGuard guard(residual.device);
    const Rows rr = rows_of(residual), rd = rows_of(delta), ry = rows_of(y);
    dispatch_float(t, "add_rms_norm", [&](auto tag) {
      using T = decltype(tag);
      done = weight.dtype == t
                 ? launch_add_rms_norm<T, T>(rr, rd, ry, weight, eps, native(stream))
                 : launch_add_rms_norm<T, float>(rr, rd, ry, weight, eps, native(stream));
    });
  }
  if (!done) {
    add(residual, delta, residual, 1.0f, stream);
    rms_norm(residual, weight, eps, y, nullptr, stream);
  }
}

void rms_norm_backward(const TensorView& dy, const TensorView& x, const TensorView& weight,
                       float eps, const TensorView* rstd, const TensorView& dx,
                       const TensorView* dweight, bool accumulate_dweight, Stream stream) {
  for (const TensorView* v : {&dy, &x, &weight, &dx}) require_float("rms_norm_backward", v->dtype);
  if (x.numel() == 0) {
    if (dweight && !accumulate_dweight) fill(*dweight, 0.0, stream);
    return;
  }
  DeviceGuard guard(x.device);
  Tensor keep_dy, keep_x, keep_w, keep_rstd_in, rstd_buf;
  const TensorView dyv = dense_rows_input(dy, keep_dy, stream);
  const TensorView xv = dense_rows_input(x, keep_x, stream);
  const TensorView wv = contiguous_input(weight, keep_w, stream);
  const Rows rdy = rows_of(dyv), rx = rows_of(xv);
  const float* rstd_in = nullptr;
  if (rstd) {
    TensorView rv = *rstd;
    if (rv.dtype != DType::F32) {
      keep_rstd_in = Tensor::empty(rv.sizes(), DType::F32, rv.device, stream);
      cast(rv, keep_rstd_in.view(), stream);
      rv = keep_rstd_in.view();
    }
    rstd_in = contiguous_input(rv, keep_rstd_in, stream).data_as<float>();
  }
  float* rstd_out = nullptr;
  if (!rstd_in && dweight) {
    rstd_buf = Tensor::empty({rx.rows}, DType::F32, x.device, stream);
    rstd_out = rstd_buf.data_as<float>();
  }
  WritableOutput out(dx, false, false, stream);
  const Rows rdx = rows_of(out.view());
  rms_norm_backward_kernel<<<checked_grid_x(rx.rows, "rms_norm_backward"), row_threads(rx.cols), 0,
                             native(stream)>>>(rdy.ptr, dy.dtype, rdy.row_stride, rx.ptr, x.dtype,
                                               rx.row_stride, wv.ptr(), wv.dtype, rstd_in, rstd_out,
                                               rdx.ptr, dx.dtype, rdx.row_stride, rx.cols, eps);
  HK_CUDA_CHECK_LAUNCH();
  out.finish(stream);
  if (dweight) {
    ColumnSumTerms terms;
    terms.a = rdy.ptr;
    terms.a_dtype = dy.dtype;
    terms.a_row_stride = rdy.row_stride;
    terms.b = rx.ptr;
    terms.b_dtype = x.dtype;
    terms.b_row_stride = rx.row_stride;
    terms.row_scale = rstd_in ? rstd_in : rstd_out;
    terms.round_dtype = x.dtype;
    column_sum(terms, rx.rows, rx.cols, *dweight, accumulate_dweight, stream);
  }
}

void layer_norm(const TensorView& x, const TensorView& weight, const TensorView* bias, float eps,
                const TensorView& y, Stream stream) {
  require_float("layer_norm", x.dtype);
  require_float("layer_norm", weight.dtype);
  require_float("layer_norm", y.dtype);
  if (bias) require_float("layer_norm", bias->dtype);
  if (x.numel() == 0) return;
  DeviceGuard guard(x.device);
  Tensor keep_x, keep_w, keep_b;
  const TensorView xv = dense_rows_input(x, keep_x, stream);
  const TensorView wv = contiguous_input(weight, keep_w, stream);
  const TensorView bv = bias ? contiguous_input(*bias, keep_b, stream) : TensorView{};
  WritableOutput out(y, false, false, stream);
  const Rows rx = rows_of(xv), ry = rows_of(out.view());
  layer_norm_kernel<<<checked_grid_x(rx.rows, "layer_norm"), row_threads(rx.cols), 0,
                      native(stream)>>>(rx.ptr, x.dtype, rx.row_stride, wv.ptr(), wv.dtype,
                                        bias ? bv.ptr() : nullptr, bias ? bv.dtype : DType::F32,
                                        ry.ptr, y.dtype, ry.row_stride, rx.cols, eps);
  HK_CUDA_CHECK_LAUNCH();
  out.finish(stream);
}

}  // namespace hk::ops::cuda
