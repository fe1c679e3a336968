// CUDA activations (SiLU, GELU, GELU-tanh, QuickGELU), their backward, and the gated act_mul
// (SwiGLU/GeGLU) with its backward.
//
// Forward ops use the elementwise engine (16-byte vectors on dense rows). act_mul rounds act(gate)
// to the storage dtype before the product, as Transformers' `act_fn(gate) * up` does. The
// backward of act_mul (three inputs, two outputs) is a run-time-typed dense-rows kernel: inputs
// that are not dense rows are copied first, outputs that are not are written via a temporary.
#include <type_traits>

#include "ops/cuda_ops.h"
#include "ops/elementwise_cuda.cuh"

namespace hk::ops::cuda {
namespace {
using namespace detail;

// The activation is a template argument in the forward functors: no per-element switch.
template <Activation A>
struct ActOp {
  static constexpr int kInputs = 1;
  __device__ float operator()(float x, float) const { return activation_forward(A, x); }
};
// (dy, x) -> dy * act'(x)
struct ActBackwardOp {
  static constexpr int kInputs = 2;
  Activation act;
  __device__ float operator()(float dy, float x) const {
    return dy * activation_derivative(act, x);
  }
};
// (gate, up) -> round(act(gate)) * up, rounding to the gate's storage dtype.
template <Activation A>
struct ActMulOp {
  static constexpr int kInputs = 2;
  DType gate_dtype;
  __device__ float operator()(float gate, float up) const {
    return detail::round_dtype(gate_dtype, activation_forward(A, gate)) * up;
  }
};

// Calls f(std::integral_constant<Activation, A>{}) for the run-time activation `act`.
template <class F>
void with_activation(Activation act, F&& f) {
  switch (act) {
    case Activation::SiLU:
      f(std::integral_constant<Activation, Activation::SiLU>{});
      break;
    case Activation::GELU:
      f(std::integral_constant<Activation, Activation::GELU>{});
      break;
    case Activation::GELUTanh:
      f(std::integral_constant<Activation, Activation::GELUTanh>{});
      break;
    case Activation::QuickGELU:
      f(std::integral_constant<Activation, Activation::QuickGELU>{});
      break;
  }
}

__global__ void act_mul_backward_kernel(Activation act, const void* __restrict__ dout, DType dodt,
                                        int64_t do_rs, const void* __restrict__ gate, DType gdt,
                                        int64_t g_rs, const void* __restrict__ up, DType udt,
                                        int64_t u_rs, void* __restrict__ dgate, DType dgdt,
                                        int64_t dg_rs, void* __restrict__ dup, DType dudt,
                                        int64_t du_rs, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    const float d = load_f32(dout, dodt, r * do_rs + c);
    const float g = load_f32(gate, gdt, r * g_rs + c);
    const float u = load_f32(up, udt, r * u_rs + c);
    // out = round(act(g)) * u: d/du = round(act(g)); d/dg = u * act'(g) (rounding passes the
    // gradient through unchanged, as autograd's cast does).
    store_f32(dgate, dgdt, r * dg_rs + c, d * u * activation_derivative(act, g));
    store_f32(dup, dudt, r * du_rs + c, d * round_dtype(gdt, activation_forward(act, g)));
  }
}

}  // namespace

void activation(Activation act, const TensorView& x, const TensorView& y, Stream stream) {
  with_activation(act, [&](auto a) {
    run_elementwise("activation", y, x, nullptr, ActOp<decltype(a)::value>{}, stream);
  });
}

void activation_backward(Activation act, const TensorView& dy, const TensorView& x,
                         const TensorView& dx, Stream stream) {
  run_elementwise("activation_backward", dx, dy, &x, ActBackwardOp{act}, stream);
}

void act_mul(Activation act, const TensorView& gate, const TensorView& up, const TensorView& out,
             Stream stream) {
  with_activation(act, [&](auto a) {
    run_elementwise("act_mul", out, gate, &up, ActMulOp<decltype(a)::value>{gate.dtype}, stream);
  });
}

void act_mul_backward(Activation act, const TensorView& dout, const TensorView& gate,
                      const TensorView& up, const TensorView& dgate, const TensorView& dup,
                      Stream stream) {
  for (const TensorView* v : {&dout, &gate, &up, &dgate, &dup})
    require_float("act_mul_backward", v->dtype);
  if (dout.numel() == 0) return;
  DeviceGuard guard(dout.device);
  Tensor kd, kg, ku;
  const TensorView d = dense_rows_input(dout, kd, stream);
  const TensorView g = dense_rows_input(gate, kg, stream);
  const TensorView u = dense_rows_input(up, ku, stream);
  WritableOutput og(dgate, false, false, stream), ou(dup, false, false, stream);
  const Rows rd = rows_of(d), rg = rows_of(g), ru = rows_of(u), rdg = rows_of(og.view()),
             rdu = rows_of(ou.view());
  const int threads = 256;
  act_mul_backward_kernel<<<grid_for(rd.rows * rd.cols, threads, 16), threads, 0, native(stream)>>>(
      act, rd.ptr, d.dtype, rd.row_stride, rg.ptr, g.dtype, rg.row_stride, ru.ptr, u.dtype,
      ru.row_stride, rdg.ptr, dgate.dtype, rdg.row_stride, rdu.ptr, dup.dtype, rdu.row_stride,
      rd.rows, rd.cols);
  HK_CUDA_CHECK_LAUNCH();
  og.finish(stream);
  ou.finish(stream);
}

}  // namespace hk::ops::cuda
