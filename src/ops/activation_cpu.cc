// CPU activations (SiLU/GELU/GELUTanh), their gated products (SwiGLU/GeGLU) and backward, in f32
// (f64 for f64 tensors) with one rounding of each output. act_mul rounds act(gate) to the dtype
// before the product, like Transformers' `act_fn(gate_proj(x)) * up_proj(x)`.
#include "ops/activation_math.h"
#include "ops/cpu_ops.h"
#include "ops/cpu_util.h"

namespace hk::ops::cpu {
namespace {

template <class T>
void activation_t(Activation act, const TensorView& x, const TensorView& y) {
  std::vector<T> v = load<T>(x);
  for (T& e : v) e = activate(act, e);
  store(y, v);
}

template <class T>
void activation_backward_t(Activation act, const TensorView& dy, const TensorView& x,
                           const TensorView& dx) {
  const std::vector<T> xs = load<T>(x);
  std::vector<T> g = load<T>(dy);
  for (size_t i = 0; i < g.size(); ++i) g[i] *= activate_derivative(act, xs[i]);
  store(dx, g);
}

template <class T>
void act_mul_t(Activation act, const TensorView& gate, const TensorView& up,
               const TensorView& out) {
  const std::vector<T> u = load<T>(up);
  std::vector<T> g = load<T>(gate);
  for (size_t i = 0; i < g.size(); ++i) g[i] = round_as(gate.dtype, activate(act, g[i])) * u[i];
  store(out, g);
}

template <class T>
void act_mul_backward_t(Activation act, const TensorView& dout, const TensorView& gate,
                        const TensorView& up, const TensorView& dgate, const TensorView& dup) {
  const std::vector<T> d = load<T>(dout), g = load<T>(gate), u = load<T>(up);
  std::vector<T> dg(g.size()), du(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    du[i] = d[i] * round_as(gate.dtype, activate(act, g[i]));
    dg[i] = d[i] * u[i] * activate_derivative(act, g[i]);
  }
  store(dgate, dg);
  store(dup, du);
}

}  // namespace

void activation(Activation act, const TensorView& x, const TensorView& y, Stream) {
  if (x.dtype == DType::F64)
    activation_t<double>(act, x, y);
  else
    activation_t<float>(act, x, y);
}

void activation_backward(Activation act, const TensorView& dy, const TensorView& x,
                         const TensorView& dx, Stream) {
  if (x.dtype == DType::F64)
    activation_backward_t<double>(act, dy, x, dx);
  else
    activation_backward_t<float>(act, dy, x, dx);
}

void act_mul(Activation act, const TensorView& gate, const TensorView& up, const TensorView& out,
             Stream) {
  if (gate.dtype == DType::F64)
    act_mul_t<double>(act, gate, up, out);
  else
    act_mul_t<float>(act, gate, up, out);
}

void act_mul_backward(Activation act, const TensorView& dout, const TensorView& gate,
                      const TensorView& up, const TensorView& dgate, const TensorView& dup,
                      Stream) {
  if (gate.dtype == DType::F64)
    act_mul_backward_t<double>(act, dout, gate, up, dgate, dup);
  else
    act_mul_backward_t<float>(act, dout, gate, up, dgate, dup);
}

}  // namespace hk::ops::cpu
