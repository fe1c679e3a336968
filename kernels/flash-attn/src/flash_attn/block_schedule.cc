// flash_attn/block_schedule.cc — see block_schedule.h.
#include "flash_attn/block_schedule.h"

#include <algorithm>
#include <functional>
#include <queue>

namespace hk_flash {

std::vector<double> backward_block_work(int seqlen_q, int seqlen_k, int group, bool causal) {
  const int n_blocks = (seqlen_k + 127) / 128;
  std::vector<double> work(std::max(0, n_blocks));
  for (int n = 0; n < n_blocks; ++n) {
    const int m_lo = causal ? std::max(0, 128 * n - (seqlen_k - seqlen_q)) : 0;
    work[n] = 1.0 + group * std::max(0, (seqlen_q - m_lo + 63) / 64);
  }
  return work;
}

double schedule_tail(const std::vector<double>& work, int heads, int section, int sms) {
  if (sms <= 0 || heads <= 0 || section <= 0) return 1.0;
  std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;
  for (int i = 0; i < sms; ++i) free_at.push(0.0);
  double end = 0.0, total = 0.0;
  for (int first = 0; first < heads; first += section)
    for (double w : work)
      for (int h = first; h < std::min(heads, first + section); ++h) {
        const double done = free_at.top() + w;
        free_at.pop();
        free_at.push(done);
        end = std::max(end, done);
        total += w;
      }
  return total > 0.0 ? end / (total / sms) : 1.0;
}

int choose_section(const std::vector<double>& work, int heads, int fit, int sms) {
  if (fit >= heads || sms <= 0) return heads;
  const double one_section = schedule_tail(work, heads, heads, sms);
  for (int s = std::max(1, fit); s >= 1; --s)
    if (schedule_tail(work, heads, s, sms) <= one_section + 0.02) return s;
  return heads;
}

}  // namespace hk_flash
