// The Linear layer and its built-in implementation (hk::ops::linear, f32 accumulation) with its
// backward: dx = dy·W by one GEMM (beta 1 when the caller sums several projections' dx into one
// buffer), dW += dyᵀ·x and db += Σ dy into the parameters' gradients (ops::linear_backward).
#include "hk/error.h"
#include "hk/layers.h"
#include "nn/param_grad.h"

namespace hk::nn {
namespace {

class BuiltinLinear final : public LinearImpl {
 public:
  std::string name() const override { return "builtin"; }
  void forward(const Linear& layer, const TensorView& x, const TensorView& y,
               Stream stream) const override {
    const Tensor* bias = layer.bias();
    ops::linear(x, layer.weight(), bias ? &bias->view() : nullptr, y, stream);
  }
  bool supports_training() const override { return true; }
  void forward_train(const Linear& layer, const Tensor& x, const Tensor& y, LayerContext&,
                     Stream stream) const override {
    forward(layer, x, y, stream);
  }
  void backward(const Linear& layer, const Tensor& x, LayerContext&, const Tensor& dy,
                const Tensor* dx, bool accumulate_dx, Stream stream) const override {
    const Tensor& w = layer.weight();
    const int64_t n = layer.out_features(), k = layer.in_features();
    const Tensor g = dy.is_contiguous() ? dy : dy.contiguous(stream);
    if (dx) {
      HK_CHECK(dx->is_contiguous() && dx->numel() == x.numel(),
               "Linear backward: dx " + dx->view().str() + " must be contiguous, x's shape");
      ops::MatmulOptions mo;
      mo.beta = accumulate_dx ? 1.0f : 0.0f;
      ops::matmul(g.reshape({g.numel() / n, n}), w, dx->reshape({dx->numel() / k, k}), mo, stream);
    }
    ParamGradWriter dw(layer, "weight", {w.dtype()}, false, stream);
    if (dw.active()) {
      ops::linear_backward(g, x, w, nullptr, dw.view(), nullptr, dw.accumulate(), stream);
      dw.commit();
    }
    if (layer.has_bias()) {
      ParamGradWriter db(layer, "bias", {w.dtype()}, false, stream);
      if (db.active()) {
        ops::linear_backward(g, x, w, nullptr, nullptr, db.view(), db.accumulate(), stream);
        db.commit();
      }
    }
  }
};

}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : LayerModule("Linear", "Linear", std::make_shared<BuiltinLinear>()),
      in_(in_features),
      out_(out_features),
      bias_(bias) {
  HK_CHECK(in_features > 0 && out_features > 0,
           "Linear: features must be positive, got in=" + std::to_string(in_features) +
               " out=" + std::to_string(out_features));
  register_parameter("weight", {out_features, in_features});
  if (bias) register_parameter("bias", {out_features});
}

const Tensor* Linear::bias() const {
  return bias_ ? &param("bias") : nullptr;
}

// ---- sibling Linears (q/k/v, gate/up): one call for a fused group, else one per Linear
// -----------

void LinearGroupImpl::forward_train(const Tensor&, const std::vector<Tensor>&, LayerContext&,
                                    Stream) const {
  throw Unsupported(
      "this fused Linear group has no training forward/backward (its kernel has no backward); "
      "kernelize with Mode::Training, which binds only kernels with a backward");
}
void LinearGroupImpl::backward(const Tensor& x, LayerContext& ctx, const std::vector<Tensor>&,
                               const Tensor*, bool, Stream stream) const {
  forward_train(x, {}, ctx, stream);  // the same refusal
}

namespace {

// The group that calls[i..] start, when all its members follow in order; else null.
std::shared_ptr<const LinearGroupImpl> group_at(const std::vector<LinearCall>& calls, size_t i) {
  auto group = calls[i].layer->typed_impl().group();
  if (!group) return nullptr;
  const auto& members = group->members();
  if (i + members.size() > calls.size()) return nullptr;
  for (size_t m = 0; m < members.size(); ++m)
    if (calls[i + m].layer != members[m]) return nullptr;
  return group;
}

// `b` starts where `a` (`a_elems` elements of a's dtype) ends.
bool follows(const TensorView& a, int64_t a_elems, const TensorView& b) {
  return static_cast<const char*>(a.ptr()) + a_elems * static_cast<int64_t>(dtype_size(a.dtype)) ==
         b.ptr();
}

// How many built-in Linears from calls[i] on can run as one product: their weights (and biases)
// are adjacent rows of one buffer (the loader stores siblings so, see state_dict.cc) and their
// outputs adjacent columns of one buffer (a caller that wants one product lays them out so, e.g.
// the decode step's q/k/v). 1 when not: each runs alone.
size_t fusable_run(const std::vector<LinearCall>& calls, size_t i) {
  const Linear& first = *calls[i].layer;
  if (!first.uses_builtin()) return 1;
  const TensorView& w0 = first.weight().view();
  if (!w0.is_contiguous()) return 1;
  size_t n = 1;
  for (size_t j = i + 1; j < calls.size(); ++j, ++n) {
    const Linear& prev = *calls[j - 1].layer;
    const Linear& cur = *calls[j].layer;
    const TensorView& yp = calls[j - 1].y.view();
    const TensorView& y = calls[j].y.view();
    bool ok = cur.uses_builtin() && cur.in_features() == first.in_features() &&
              cur.has_bias() == first.has_bias() && cur.weight().dtype() == w0.dtype &&
              weights_adjacent(prev, cur) && y.ndim == yp.ndim && y.dtype == yp.dtype &&
              y.strides[y.ndim - 1] == 1 && yp.strides[yp.ndim - 1] == 1 &&
              follows(yp, prev.out_features(), y);
    for (int d = 0; ok && d + 1 < y.ndim; ++d)
      ok = y.shape[d] == yp.shape[d] && y.strides[d] == yp.strides[d];
    if (ok && first.has_bias())
      ok = follows(prev.bias()->view(), prev.out_features(), cur.bias()->view());
    if (!ok) break;
  }
  return n;
}

}  // namespace

bool weights_adjacent(const Linear& a, const Linear& b) {
  const TensorView& wa = a.weight().view();
  return wa.is_contiguous() && b.weight().view().is_contiguous() &&
         follows(wa, a.out_features() * a.in_features(), b.weight().view());
}

void forward_linears(const TensorView& x, const std::vector<LinearCall>& calls, Stream stream) {
  for (size_t i = 0; i < calls.size();) {
    if (auto group = group_at(calls, i)) {
      std::vector<TensorView> ys;
      for (size_t m = 0; m < group->members().size(); ++m) ys.push_back(calls[i + m].y.view());
      group->forward(x, ys, stream);
      i += ys.size();
    } else if (const size_t n = fusable_run(calls, i); n > 1) {
      // One product over the run's rows of weights into its columns of output: the same
      // per-element dot products as n separate ones, in one launch (decode at 17+ rows is
      // latency-bound: three cuBLASLt products of ~6 µs each against one of ~8 on the H200).
      int64_t out = 0;
      for (size_t m = 0; m < n; ++m) out += calls[i + m].layer->out_features();
      TensorView w = calls[i].layer->weight().view();
      w.shape[0] = out;
      TensorView y = calls[i].y.view();
      y.shape[y.ndim - 1] = out;
      TensorView b;
      if (calls[i].layer->has_bias()) {
        b = calls[i].layer->bias()->view();
        b.shape[0] = out;
      }
      ops::linear(x, w, calls[i].layer->has_bias() ? &b : nullptr, y, stream);
      i += n;
    } else {
      calls[i].layer->forward(x, calls[i].y, stream);
      ++i;
    }
  }
}

void forward_train_linears(const Tensor& x, const std::vector<LinearCall>& calls, LayerContext& ctx,
                           Stream stream) {
  for (size_t i = 0; i < calls.size();) {
    if (auto group = group_at(calls, i)) {
      std::vector<Tensor> ys;
      for (size_t m = 0; m < group->members().size(); ++m) ys.push_back(calls[i + m].y);
      group->forward_train(x, ys, ctx.child(calls[i].name), stream);
      i += ys.size();
    } else {
      calls[i].layer->forward_train(x, calls[i].y, ctx.child(calls[i].name), stream);
      ++i;
    }
  }
}

void backward_linears(const Tensor& x, LayerContext& ctx, const std::vector<LinearCall>& calls,
                      const Tensor& dx, Stream stream) {
  for (size_t i = 0; i < calls.size();) {
    const bool accumulate = i > 0;
    if (auto group = group_at(calls, i)) {
      std::vector<Tensor> dys;
      for (size_t m = 0; m < group->members().size(); ++m) dys.push_back(calls[i + m].y);
      group->backward(x, ctx.child(calls[i].name), dys, &dx, accumulate, stream);
      i += dys.size();
    } else {
      calls[i].layer->backward(x, ctx.child(calls[i].name), calls[i].y, &dx, accumulate, stream);
      ++i;
    }
  }
}

}  // namespace hk::nn
