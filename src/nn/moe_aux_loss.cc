// The router load-balancing loss (hk/moe.h), as Transformers' load_balancing_loss_func computes
// it for Qwen3-MoE, and its gradient with respect to every MoE layer's router logits.
//
// Transformers sums the top-k counts and the probabilities over all layers before it multiplies
// them, so the loss couples the layers: d(loss)/d(p_l[r, e]) = E · C_e · mask[r] / (L·N)², with
// C_e the count over all layers and N the non-padding rows per layer. The softmax is taken in the
// logits' dtype (f32 math, rounded to it), and the top-k that counts is that softmax's, as in
// Transformers (for bf16 logits it may differ from the router's f32 top-k on near-ties). A batch
// whose rows are all padding gives 0 (Transformers divides 0 by 0 there).
#include <cmath>

#include "hk/error.h"
#include "hk/moe.h"
#include "hk/ops.h"
#include "nn/moe_routing.h"

namespace hk::nn {

LoadBalancingLoss load_balancing_loss(const std::vector<Tensor>& router_logits, int64_t top_k,
                                      const std::vector<int64_t>& key_start, int64_t seq,
                                      double scale, Stream stream) {
  LoadBalancingLoss out;
  if (router_logits.empty()) return out;
  const int64_t rows = router_logits[0].size(0), E = router_logits[0].size(1);
  std::vector<double> mask(static_cast<size_t>(rows), 1.0);
  if (!key_start.empty()) {
    HK_CHECK(seq > 0 && rows == seq * static_cast<int64_t>(key_start.size()),
             "load_balancing_loss: key_start has " + std::to_string(key_start.size()) +
                 " rows of " + std::to_string(seq) + " positions, the logits " +
                 std::to_string(rows) + " rows");
    for (int64_t r = 0; r < rows; ++r)
      mask[r] = (r % seq) >= key_start[static_cast<size_t>(r / seq)] ? 1.0 : 0.0;
  }
  double kept = 0.0;
  for (double m : mask) kept += m;
  const double total = kept * static_cast<double>(router_logits.size());

  // Per layer: the probabilities (rounded as the logits' dtype rounds them) and the top-k counts.
  std::vector<std::vector<double>> probs;
  std::vector<double> count(static_cast<size_t>(E), 0.0), prob_sum(static_cast<size_t>(E), 0.0);
  std::vector<int32_t> ids(static_cast<size_t>(top_k));
  for (const Tensor& logits : router_logits) {
    HK_CHECK(logits.ndim() == 2 && logits.size(0) == rows && logits.size(1) == E,
             "load_balancing_loss: every layer's router logits must be [" + std::to_string(rows) +
                 ", " + std::to_string(E) + "], got " + logits.view().str());
    const DType dt = logits.dtype();
    Tensor host = logits.device().is_cpu() ? logits : logits.to(Device::cpu(), stream);
    std::vector<double> p = moe::softmax_rows(host.to_doubles(), rows, E, dt != DType::F64);
    if (dt != DType::F64 && dt != DType::F32) {  // round to the logits' dtype
      Tensor wide = Tensor::empty({rows, E}, DType::F64);
      std::copy(p.begin(), p.end(), wide.data_as<double>());
      Tensor narrow = Tensor::empty({rows, E}, dt);
      ops::cast(wide, narrow);
      p = narrow.to_doubles();
    }
    for (int64_t r = 0; r < rows; ++r) {
      if (mask[r] == 0.0) continue;
      const double* pr = &p[static_cast<size_t>(r * E)];
      moe::top_k_row(pr, E, top_k, ids.data());
      for (int32_t e : ids) count[e] += 1.0;
      for (int64_t e = 0; e < E; ++e) prob_sum[e] += pr[e];
    }
    probs.push_back(std::move(p));
  }
  if (total == 0.0) {
    for (const Tensor& logits : router_logits)
      out.grads.push_back(
          Tensor::zeros({rows, E}, statistics_dtype(logits.dtype()), logits.device(), stream));
    return out;
  }
  for (int64_t e = 0; e < E; ++e) out.value += (count[e] / total) * (prob_sum[e] / total);
  out.value *= static_cast<double>(E);

  std::vector<double> dp(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    dp[e] = scale * static_cast<double>(E) * count[e] / (total * total);
  for (size_t l = 0; l < router_logits.size(); ++l) {
    const DType gt = statistics_dtype(router_logits[l].dtype());  // f32, or f64 on the f64 path
    Tensor g = Tensor::empty({rows, E}, DType::F64);
    double* gp = g.data_as<double>();
    for (int64_t r = 0; r < rows; ++r) {
      const double* pr = &probs[l][static_cast<size_t>(r * E)];
      double dot = 0.0;
      for (int64_t e = 0; e < E; ++e) dot += pr[e] * dp[e];
      for (int64_t e = 0; e < E; ++e) gp[r * E + e] = mask[r] * pr[e] * (dp[e] - dot);
    }
    if (gt != DType::F64) {
      Tensor narrow = Tensor::empty({rows, E}, gt);
      ops::cast(g, narrow);
      g = narrow;
    }
    const Device dev = router_logits[l].device();
    out.grads.push_back(dev.is_cpu() ? g : g.to(dev, stream));
  }
  return out;
}

}  // namespace hk::nn
