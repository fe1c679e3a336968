// Sampling from one row of logits: temperature, then top-k, then top-p (Transformers' processor
// order and tie rules), then a draw from a seeded 64-bit Mersenne Twister. Double precision on the
// host; the draw uses the generator's raw output (not std::discrete_distribution) so a seed gives
// the same tokens with every standard library.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "hk/error.h"
#include "hk/generation.h"

namespace hk {

std::vector<double> sampling_distribution(const float* logits, int64_t vocab,
                                          const SamplingOptions& options) {
  HK_CHECK(vocab > 0, "sampling: empty logits row");
  HK_CHECK(options.temperature > 0 && std::isfinite(options.temperature),
           "sampling: temperature must be > 0 (use greedy decoding for temperature 0)");
  HK_CHECK(options.top_p > 0 && options.top_p <= 1, "sampling: top_p must be in (0, 1]");
  HK_CHECK(options.top_k >= 0, "sampling: top_k must be >= 0");
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const size_t n = static_cast<size_t>(vocab);
  std::vector<double> scores(n);
  for (size_t i = 0; i < n; ++i) scores[i] = static_cast<double>(logits[i]) / options.temperature;

  if (options.top_k > 0 && options.top_k < vocab) {
    // Keep every token whose score is >= the k-th largest (ties at the boundary survive).
    std::vector<double> sorted(scores);
    std::nth_element(sorted.begin(), sorted.begin() + (options.top_k - 1), sorted.end(),
                     std::greater<double>());
    const double kth = sorted[static_cast<size_t>(options.top_k - 1)];
    for (double& s : scores)
      if (s < kth) s = neg_inf;
  }

  auto softmax = [&](std::vector<double>& v) {
    double mx = *std::max_element(v.begin(), v.end());
    HK_CHECK(std::isfinite(mx), "sampling: logits have no finite value");
    double sum = 0;
    for (double& x : v) {
      x = std::isinf(x) && x < 0 ? 0.0 : std::exp(x - mx);
      sum += x;
    }
    for (double& x : v) x /= sum;
  };
  softmax(scores);

  if (options.top_p < 1.0) {
    // Ascending order; drop the prefix whose cumulative mass is <= 1 - top_p, always keeping the
    // most likely token.
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return scores[a] < scores[b]; });
    double cum = 0;
    for (size_t r = 0; r + 1 < n; ++r) {
      cum += scores[order[r]];
      if (cum <= 1.0 - options.top_p) scores[order[r]] = 0;
    }
    double sum = std::accumulate(scores.begin(), scores.end(), 0.0);
    for (double& x : scores) x /= sum;
  }
  return scores;
}

int64_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& options,
                     std::mt19937_64& rng) {
  std::vector<double> p = sampling_distribution(logits, vocab, options);
  const double u = static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
  double cum = 0;
  int64_t last_nonzero = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) continue;
    last_nonzero = static_cast<int64_t>(i);
    cum += p[i];
    if (u < cum) return static_cast<int64_t>(i);
  }
  return last_nonzero;  // rounding left u just above the total mass
}

}  // namespace hk
