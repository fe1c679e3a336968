// CPU cross-entropy (forward/backward, ignore_index, None/Mean/Sum) and argmax.
//
// f32 math (f64 for f64 logits) whatever the logits dtype, like PyTorch's upcast in Transformers'
// loss. Mean divides by the number of non-ignored targets; with none, the loss is 0 and the
// gradients are zero (never NaN). A label outside [0, V) that is not ignore_index throws.
#include <cmath>
#include <limits>

#include "hk/error.h"
#include "ops/cpu_ops.h"
#include "ops/cpu_util.h"

namespace hk::ops::cpu {
namespace {

std::vector<int64_t> checked_labels(const char* op, const TensorView& labels, int64_t vocab,
                                    int64_t ignore_index) {
  std::vector<int64_t> l = load_ints(labels);
  for (size_t i = 0; i < l.size(); ++i)
    if (l[i] != ignore_index && (l[i] < 0 || l[i] >= vocab))
      throw InvalidArgument(std::string(op) + ": label " + std::to_string(l[i]) + " at row " +
                            std::to_string(i) + " is outside [0, " + std::to_string(vocab) +
                            ") and is not ignore_index " + std::to_string(ignore_index));
  return l;
}

template <class T>
std::vector<T> log_sum_exp(const std::vector<T>& x, int64_t n, int64_t v) {
  std::vector<T> lse(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const T* r = &x[i * v];
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < v; ++j) m = std::max(m, r[j]);
    T s = 0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(r[j] - m);
    lse[i] = m + std::log(s);
  }
  return lse;
}

int64_t count_targets(const std::vector<int64_t>& labels, int64_t ignore_index) {
  int64_t c = 0;
  for (int64_t l : labels) c += l != ignore_index;
  return c;
}

template <class T>
void cross_entropy_t(const TensorView& logits, const TensorView& labels, const TensorView& loss,
                     const CrossEntropyOptions& o, const TensorView* lse_out) {
  const int64_t n = logits.shape[0], v = logits.shape[1];
  const std::vector<int64_t> l = checked_labels("cross_entropy", labels, v, o.ignore_index);
  const std::vector<T> x = load<T>(logits);
  const std::vector<T> lse = log_sum_exp(x, n, v);
  std::vector<T> per_row(static_cast<size_t>(n), T{0});
  T total = 0;
  for (int64_t i = 0; i < n; ++i)
    if (l[i] != o.ignore_index) total += (per_row[i] = lse[i] - x[i * v + l[i]]);
  if (o.reduction == Reduction::None) {
    store(loss, per_row);
  } else {
    const int64_t count = count_targets(l, o.ignore_index);
    T value = total;
    if (o.reduction == Reduction::Mean) value = count ? total / static_cast<T>(count) : T{0};
    store(loss, &value);
  }
  if (lse_out) store(*lse_out, lse);
}

template <class T>
void cross_entropy_backward_t(const TensorView& dloss, const TensorView& logits,
                              const TensorView& labels, const TensorView& dlogits,
                              const CrossEntropyOptions& o, const TensorView* lse_in) {
  const int64_t n = logits.shape[0], v = logits.shape[1];
  const std::vector<int64_t> l =
      checked_labels("cross_entropy_backward", labels, v, o.ignore_index);
  const std::vector<T> x = load<T>(logits);
  const std::vector<T> lse = lse_in ? load<T>(*lse_in) : log_sum_exp(x, n, v);
  const std::vector<T> dl = load<T>(dloss);
  const int64_t count = count_targets(l, o.ignore_index);
  std::vector<T> g(x.size(), T{0});
  for (int64_t i = 0; i < n; ++i) {
    if (l[i] == o.ignore_index) continue;
    T w = o.reduction == Reduction::None ? dl[i] : dl[0];
    if (o.reduction == Reduction::Mean) w /= static_cast<T>(count);
    for (int64_t j = 0; j < v; ++j) g[i * v + j] = w * std::exp(x[i * v + j] - lse[i]);
    g[i * v + l[i]] -= w;
  }
  store(dlogits, g);
}

template <class T>
void argmax_t(const TensorView& x, const TensorView& out) {
  const int64_t n = x.shape[x.ndim - 1], rows = out.numel();
  const std::vector<T> v = load<T>(x);
  std::vector<int64_t> idx(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    int64_t best = 0;
    for (int64_t j = 1; j < n && !std::isnan(v[r * n + best]); ++j)
      if (v[r * n + j] > v[r * n + best] || std::isnan(v[r * n + j])) best = j;
    idx[r] = best;  // first maximum; a NaN counts as the maximum, as in PyTorch
  }
  store(out, idx);
}

}  // namespace

void cross_entropy(const TensorView& logits, const TensorView& labels, const TensorView& loss,
                   const CrossEntropyOptions& options, const TensorView* lse, Stream) {
  if (logits.dtype == DType::F64)
    cross_entropy_t<double>(logits, labels, loss, options, lse);
  else
    cross_entropy_t<float>(logits, labels, loss, options, lse);
}

void cross_entropy_backward(const TensorView& dloss, const TensorView& logits,
                            const TensorView& labels, const TensorView& dlogits,
                            const CrossEntropyOptions& options, const TensorView* lse, Stream) {
  if (logits.dtype == DType::F64)
    cross_entropy_backward_t<double>(dloss, logits, labels, dlogits, options, lse);
  else
    cross_entropy_backward_t<float>(dloss, logits, labels, dlogits, options, lse);
}

void argmax(const TensorView& x, const TensorView& out, Stream) {
  const bool narrow = x.dtype == DType::F32 || x.dtype == DType::BF16 || x.dtype == DType::F16;
  if (narrow)
    argmax_t<float>(x, out);
  else
    argmax_t<double>(x, out);  // f64 and integers (exact up to 2^53)
}

}  // namespace hk::ops::cpu
