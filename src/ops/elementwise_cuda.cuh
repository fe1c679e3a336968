// Internal: the elementwise engine behind add/mul/scale/cast/activation/act_mul on CUDA.
//
// An op is a functor `float operator()(float a, float b) const` with `kInputs` 1 or 2. Three paths:
//  1. all operands dense rows of one storage type (or two, for cast) → a grid-stride kernel moving
//     16 bytes per operand per step (VEC elements), 8-byte... or 1 element when alignment or the
//     row length forbids wider accesses;
//  2. anything else (broadcast stride-0 views, transposes, mixed dtypes) → a run-time-typed
//     strided kernel that computes each operand's offset from the output's linear index.
// Math is f32; each output element is rounded once to the output dtype. The output may alias an
// input with the same layout (each element is read before it is written, by the same thread).
// Not here: reductions, anything that needs more than two inputs or one output.
#pragma once

#include "ops/cuda_common.cuh"

namespace hk::ops::cuda::detail {

template <class Op, class TO, class TA, class TB, int VEC>
__global__ void elementwise_rows_kernel(TO* __restrict__ out, int64_t out_rs,
                                        const TA* __restrict__ a, int64_t a_rs,
                                        const TB* __restrict__ b, int64_t b_rs, int64_t rows,
                                        int64_t vecs_per_row, Op op) {
  const int64_t total = rows * vecs_per_row;
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < total;
       v += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = 0, c = v;
    if (rows != 1) {
      r = v / vecs_per_row;
      c = v - r * vecs_per_row;
    }
    c *= VEC;
    const Vec<TA, VEC> va = *reinterpret_cast<const Vec<TA, VEC>*>(a + r * a_rs + c);
    Vec<TB, VEC> vb;
    if constexpr (Op::kInputs == 2) vb = *reinterpret_cast<const Vec<TB, VEC>*>(b + r * b_rs + c);
    Vec<TO, VEC> vo;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      float y;
      if constexpr (Op::kInputs == 2) {
        y = op(to_f32(va.v[k]), to_f32(vb.v[k]));
      } else {
        y = op(to_f32(va.v[k]), 0.0f);
      }
      vo.v[k] = from_f32<TO>(y);
    }
    *reinterpret_cast<Vec<TO, VEC>*>(out + r * out_rs + c) = vo;
  }
}

template <class Op>
__global__ void elementwise_strided_kernel(void* __restrict__ out, DType odt,
                                           const void* __restrict__ a, DType adt,
                                           const void* __restrict__ b, DType bdt, int64_t n,
                                           Layout3 layout, Op op) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t oo, oa, ob;
    layout_offsets(layout, i, oo, oa, ob);
    const float x = load_f32(a, adt, oa);
    const float y = Op::kInputs == 2 ? load_f32(b, bdt, ob) : 0.0f;
    store_f32(out, odt, oo, op(x, y));
  }
}

inline void launch_elementwise_strided_common(int64_t n, unsigned& grid, int& threads) {
  threads = 256;
  grid = grid_for(n, threads, 16);
}

template <class Op>
void launch_elementwise_strided(const TensorView& out, const TensorView& a, const TensorView* b,
                                const Op& op, cudaStream_t stream) {
  const int64_t n = out.numel();
  unsigned grid;
  int threads;
  launch_elementwise_strided_common(n, grid, threads);
  const Layout3 layout = make_layout(out, &a, b);
  elementwise_strided_kernel<Op>
      <<<grid, threads, 0, stream>>>(out.ptr(), out.dtype, a.ptr(), a.dtype, b ? b->ptr() : nullptr,
                                     b ? b->dtype : a.dtype, n, layout, op);
  HK_CUDA_CHECK_LAUNCH();
}

// True when all views are dense rows of the same shape; fills their Rows. Fully contiguous views
// collapse to a single row so the kernel skips the row division.
inline bool dense_rows_all(const TensorView& out, const TensorView& a, const TensorView* b,
                           Rows& ro, Rows& ra, Rows& rb) {
  if (!out.rows_are_dense() || !a.rows_are_dense() || (b && !b->rows_are_dense())) return false;
  if (!same_shape(out, a) || (b && !same_shape(out, *b))) return false;
  const bool contiguous = out.is_contiguous() && a.is_contiguous() && (!b || b->is_contiguous());
  if (contiguous) {
    const int64_t n = out.numel();
    ro = {out.ptr(), 1, n, n};
    ra = {a.ptr(), 1, n, n};
    rb = {b ? b->ptr() : nullptr, 1, n, n};
    return true;
  }
  ro = rows_of(out);
  ra = rows_of(a);
  rb = b ? rows_of(*b) : Rows{};
  return true;
}

template <int VEC, class T>
bool vec_ok(const Rows& r, bool used = true) {
  if (!used) return true;
  return r.cols % VEC == 0 && r.row_stride % VEC == 0 && aligned_to(r.ptr, sizeof(T) * VEC);
}

// Typed dense path; returns false when the operands do not qualify (caller goes strided).
template <class Op, class TO, class TA, class TB>
bool launch_elementwise_dense(const TensorView& out, const TensorView& a, const TensorView* b,
                              const Op& op, cudaStream_t stream) {
  Rows ro, ra, rb;
  if (!dense_rows_all(out, a, b, ro, ra, rb)) return false;
  constexpr size_t widest = sizeof(TO) > sizeof(TA)
                                ? (sizeof(TO) > sizeof(TB) ? sizeof(TO) : sizeof(TB))
                                : (sizeof(TA) > sizeof(TB) ? sizeof(TA) : sizeof(TB));
  constexpr int VEC = static_cast<int>(16 / widest);
  const int threads = 256;
  const bool wide = vec_ok<VEC, TO>(ro) && vec_ok<VEC, TA>(ra) && vec_ok<VEC, TB>(rb, b != nullptr);
  const TB* bp = b ? static_cast<const TB*>(rb.ptr) : nullptr;
  if (wide) {
    const int64_t vpr = ro.cols / VEC;
    elementwise_rows_kernel<Op, TO, TA, TB, VEC>
        <<<grid_for(ro.rows * vpr, threads, 16), threads, 0, stream>>>(
            static_cast<TO*>(ro.ptr), ro.row_stride, static_cast<const TA*>(ra.ptr), ra.row_stride,
            bp, rb.row_stride, ro.rows, vpr, op);
  } else {
    elementwise_rows_kernel<Op, TO, TA, TB, 1>
        <<<grid_for(ro.rows * ro.cols, threads, 16), threads, 0, stream>>>(
            static_cast<TO*>(ro.ptr), ro.row_stride, static_cast<const TA*>(ra.ptr), ra.row_stride,
            bp, rb.row_stride, ro.rows, ro.cols, op);
  }
  HK_CUDA_CHECK_LAUNCH();
  return true;
}

// out = op(a[, b]) for float dtypes: typed dense path when all share one dtype, else strided.
template <class Op>
void run_elementwise(const char* name, const TensorView& out, const TensorView& a,
                     const TensorView* b, const Op& op, Stream stream) {
  require_float(name, out.dtype);
  require_float(name, a.dtype);
  if (b) require_float(name, b->dtype);
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device);
  const cudaStream_t s = native(stream);
  const bool one_dtype = a.dtype == out.dtype && (!b || b->dtype == out.dtype);
  bool done = false;
  if (one_dtype) {
    dispatch_float(out.dtype, name, [&](auto tag) {
      using T = decltype(tag);
      done = launch_elementwise_dense<Op, T, T, T>(out, a, b, op, s);
    });
  }
  if (!done) launch_elementwise_strided(out, a, b, op, s);
}

}  // namespace hk::ops::cuda::detail
