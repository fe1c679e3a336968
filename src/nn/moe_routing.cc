// Host MoE routing and its backward (see moe_routing.h).
#include "nn/moe_routing.h"

#include <cmath>

namespace hk::nn::moe {

std::vector<double> softmax_rows(const std::vector<double>& logits, int64_t rows, int64_t cols,
                                 bool f32) {
  std::vector<double> out(logits.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* z = &logits[static_cast<size_t>(r * cols)];
    double* p = &out[static_cast<size_t>(r * cols)];
    if (f32) {
      float m = -INFINITY, sum = 0.0f;
      for (int64_t e = 0; e < cols; ++e) m = std::fmax(m, static_cast<float>(z[e]));
      std::vector<float> ex(static_cast<size_t>(cols));
      for (int64_t e = 0; e < cols; ++e) {
        ex[e] = std::exp(static_cast<float>(z[e]) - m);
        sum += ex[e];
      }
      for (int64_t e = 0; e < cols; ++e) p[e] = ex[e] / sum;
    } else {
      double m = -INFINITY, sum = 0.0;
      for (int64_t e = 0; e < cols; ++e) m = std::fmax(m, z[e]);
      for (int64_t e = 0; e < cols; ++e) sum += (p[e] = std::exp(z[e] - m));
      for (int64_t e = 0; e < cols; ++e) p[e] /= sum;
    }
  }
  return out;
}

void top_k_row(const double* probs, int64_t experts, int64_t top_k, int32_t* ids) {
  // Selection by repeated arg-max: k passes of E (k and E are small); a strict > keeps the lower
  // index on ties.
  std::vector<bool> taken(static_cast<size_t>(experts), false);
  for (int64_t j = 0; j < top_k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < experts; ++e)
      if (!taken[e] && (best < 0 || probs[e] > probs[best])) best = e;
    taken[best] = true;
    ids[j] = static_cast<int32_t>(best);
  }
}

Routing route(const std::vector<double>& logits, int64_t tokens, int64_t experts, int64_t top_k,
              bool norm_topk_prob, bool f32) {
  Routing r;
  r.tokens = tokens;
  r.experts = experts;
  r.top_k = top_k;
  r.probs = softmax_rows(logits, tokens, experts, f32);
  const size_t n = static_cast<size_t>(tokens * top_k);
  r.ids.resize(n);
  r.weights.resize(n);
  for (int64_t t = 0; t < tokens; ++t) {
    const double* p = &r.probs[static_cast<size_t>(t * experts)];
    int32_t* id = &r.ids[static_cast<size_t>(t * top_k)];
    double* w = &r.weights[static_cast<size_t>(t * top_k)];
    top_k_row(p, experts, top_k, id);
    if (f32) {
      float sum = 0.0f;
      for (int64_t j = 0; j < top_k; ++j) sum += static_cast<float>(p[id[j]]);
      for (int64_t j = 0; j < top_k; ++j)
        w[j] = norm_topk_prob ? static_cast<float>(p[id[j]]) / sum : p[id[j]];
    } else {
      double sum = 0.0;
      for (int64_t j = 0; j < top_k; ++j) sum += p[id[j]];
      for (int64_t j = 0; j < top_k; ++j) w[j] = norm_topk_prob ? p[id[j]] / sum : p[id[j]];
    }
  }
  // Counting sort by expert, stable in t·k + slot.
  r.offsets.assign(static_cast<size_t>(experts + 1), 0);
  for (int32_t e : r.ids) ++r.offsets[static_cast<size_t>(e) + 1];
  for (int64_t e = 0; e < experts; ++e) r.offsets[e + 1] += r.offsets[e];
  std::vector<int64_t> next(r.offsets.begin(), r.offsets.end() - 1);
  r.sorted_token.resize(n);
  r.sorted_slot.resize(n);
  r.position.resize(n);
  for (size_t a = 0; a < n; ++a) {
    const int64_t row = next[static_cast<size_t>(r.ids[a])]++;
    r.sorted_token[row] = static_cast<int64_t>(a) / top_k;
    r.sorted_slot[row] = static_cast<int64_t>(a);
    r.position[a] = row;
  }
  return r;
}

std::vector<double> route_backward(const Routing& r, const std::vector<double>& dweights,
                                   bool norm_topk_prob) {
  const int64_t E = r.experts, k = r.top_k;
  std::vector<double> dlogits(static_cast<size_t>(r.tokens * E), 0.0);
  std::vector<double> dp(static_cast<size_t>(E));
  for (int64_t t = 0; t < r.tokens; ++t) {
    const double* p = &r.probs[static_cast<size_t>(t * E)];
    const int32_t* id = &r.ids[static_cast<size_t>(t * k)];
    const double* w = &r.weights[static_cast<size_t>(t * k)];
    const double* dw = &dweights[static_cast<size_t>(t * k)];
    std::fill(dp.begin(), dp.end(), 0.0);
    if (norm_topk_prob) {
      // w_j = v_j / s with s = Σ v: dv_j = (dw_j − Σ_i dw_i·w_i) / s.
      double s = 0.0, dot = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        s += p[id[j]];
        dot += dw[j] * w[j];
      }
      for (int64_t j = 0; j < k; ++j) dp[id[j]] += (dw[j] - dot) / s;
    } else {
      for (int64_t j = 0; j < k; ++j) dp[id[j]] += dw[j];
    }
    double dot = 0.0;
    for (int64_t e = 0; e < E; ++e) dot += p[e] * dp[e];
    double* dz = &dlogits[static_cast<size_t>(t * E)];
    for (int64_t e = 0; e < E; ++e) dz[e] = p[e] * (dp[e] - dot);
  }
  return dlogits;
}

}  // namespace hk::nn::moe
