// cuda/activation.cu — elementwise activations: unary act and gated act·up (SwiGLU, GeGLU),
// forward and backward.
//
// One pass, 16-byte packs when every operand allows it (else scalar), a grid-stride loop over
// columns and rows (operands whose rows are dense are treated as one long row, so the common
// contiguous case has no per-row tail). Math in f32 (liger/act_math.h), one rounding per output
// plus act(gate) rounded to the dtype before the product, as Transformers computes it.
#include "cuda/common.cuh"
#include "liger/act_math.h"
#include "liger/cuda_ops.h"

namespace liger::cuda {
namespace {

enum class Op { UnaryFwd, UnaryBwd, GatedFwd, GatedBwd };

// Up to three inputs and two outputs sharing one shape.
struct EwP {
  const void* in[3];
  void* out[2];
  int64_t in_stride[3], out_stride[2];
  int64_t rows, cols;
  Act act;
};

template <class T, int N, Op kOp>
__global__ void __launch_bounds__(256) ew_kernel(EwP p) {
  constexpr int kIn = kOp == Op::UnaryFwd ? 1 : kOp == Op::GatedBwd ? 3 : 2;
  constexpr int kOut = kOp == Op::GatedBwd ? 2 : 1;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x * N;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    for (int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * N; c < p.cols;
         c += step) {
      Pack<T, N> v[kIn], o[kOut];
#pragma unroll
      for (int k = 0; k < kIn; ++k)
        v[k] = ld<T, N>(static_cast<const T*>(p.in[k]) + r * p.in_stride[k] + c);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        if constexpr (kOp == Op::UnaryFwd) {
          o[0].e[i] = from_f32<T>(act_fwd(p.act, to_f32(v[0].e[i])));
        } else if constexpr (kOp == Op::UnaryBwd) {  // in: dy, x
          o[0].e[i] = from_f32<T>(to_f32(v[0].e[i]) * act_grad(p.act, to_f32(v[1].e[i])));
        } else if constexpr (kOp == Op::GatedFwd) {  // in: gate, up
          const float g = round_as<T>(act_fwd(p.act, to_f32(v[0].e[i])));
          o[0].e[i] = from_f32<T>(g * to_f32(v[1].e[i]));
        } else {  // in: dout, gate, up → out: dgate, dup
          const float d = to_f32(v[0].e[i]), x = to_f32(v[1].e[i]), u = to_f32(v[2].e[i]);
          o[0].e[i] = from_f32<T>(d * u * act_grad(p.act, x));
          o[1].e[i] = from_f32<T>(d * round_as<T>(act_fwd(p.act, x)));
        }
      }
#pragma unroll
      for (int k = 0; k < kOut; ++k)
        st<T, N>(static_cast<T*>(p.out[k]) + r * p.out_stride[k] + c, o[k]);
    }
  }
}

template <Op kOp>
int launch(EwP p, int nin, int nout, Dt dt, cudaStream_t s) {
  if (p.rows == 0 || p.cols == 0) return 0;
  bool dense = true;
  for (int k = 0; k < nin; ++k) dense &= p.rows == 1 || p.in_stride[k] == p.cols;
  for (int k = 0; k < nout; ++k) dense &= p.rows == 1 || p.out_stride[k] == p.cols;
  if (dense) {
    p.cols *= p.rows;
    p.rows = 1;
  }
  LIGER_DISPATCH_FLOAT(dt, T, {
    constexpr int N = 16 / sizeof(T);
    bool vec = p.cols % N == 0;
    for (int k = 0; k < nin; ++k)
      vec &= aligned16(p.in[k]) && (p.rows == 1 || p.in_stride[k] % N == 0);
    for (int k = 0; k < nout; ++k)
      vec &= aligned16(p.out[k]) && (p.rows == 1 || p.out_stride[k] % N == 0);
    const int n = vec ? N : 1;
    const int64_t packs = (p.cols + n - 1) / n;
    const int64_t most_x = 16LL * sm_count();  // enough resident blocks to fill the chip
    const unsigned gx =
        static_cast<unsigned>((packs + 255) / 256 < most_x ? (packs + 255) / 256 : most_x);
    const unsigned gy = static_cast<unsigned>(p.rows < 65535 ? p.rows : 65535);
    const dim3 grid(gx, gy);
    if (vec)
      ew_kernel<T, N, kOp><<<grid, 256, 0, s>>>(p);
    else
      ew_kernel<T, 1, kOp><<<grid, 256, 0, s>>>(p);
    return last_error();
  });
}

void set_in(EwP& p, int k, const Rows& m) {
  p.in[k] = m.data;
  p.in_stride[k] = m.row_stride;
}
void set_out(EwP& p, int k, const Rows& m) {
  p.out[k] = m.data;
  p.out_stride[k] = m.row_stride;
}

}  // namespace

int unary_act_fwd(const UnaryAct& a, void* stream) {
  EwP p{};
  set_in(p, 0, a.x);
  set_out(p, 0, a.y);
  p.rows = a.x.rows, p.cols = a.x.cols, p.act = a.act;
  return launch<Op::UnaryFwd>(p, 1, 1, a.x.dt, static_cast<cudaStream_t>(stream));
}

int unary_act_bwd(const UnaryAct& a, void* stream) {
  EwP p{};
  set_in(p, 0, a.dy);
  set_in(p, 1, a.x);
  set_out(p, 0, a.dx);
  p.rows = a.x.rows, p.cols = a.x.cols, p.act = a.act;
  return launch<Op::UnaryBwd>(p, 2, 1, a.x.dt, static_cast<cudaStream_t>(stream));
}

int gated_act_fwd(const GatedAct& a, void* stream) {
  EwP p{};
  set_in(p, 0, a.gate);
  set_in(p, 1, a.up);
  set_out(p, 0, a.out);
  p.rows = a.gate.rows, p.cols = a.gate.cols, p.act = a.act;
  return launch<Op::GatedFwd>(p, 2, 1, a.gate.dt, static_cast<cudaStream_t>(stream));
}

int gated_act_bwd(const GatedAct& a, void* stream) {
  EwP p{};
  set_in(p, 0, a.dout);
  set_in(p, 1, a.gate);
  set_in(p, 2, a.up);
  set_out(p, 0, a.dgate);
  set_out(p, 1, a.dup);
  p.rows = a.gate.rows, p.cols = a.gate.cols, p.act = a.act;
  return launch<Op::GatedBwd>(p, 3, 2, a.gate.dt, static_cast<cudaStream_t>(stream));
}

}  // namespace liger::cuda
