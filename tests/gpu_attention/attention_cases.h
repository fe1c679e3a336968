// Shared by the GPU attention tests (test_flash_attention.cc through libhk, test_flash_kernels.cc
// through flash.h): the feature cases every kernel is checked on, and a scoped environment switch
// for the kernel-choice variables (HK_FLASH_*), which scripts/gpu-test may also set.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace attention_cases {

struct Case {
  std::string name;
  int64_t b, s, t, hq, hkv;
  bool causal = true;
  double softcap = 0;
  int64_t window = -1;
  bool key_start = false;  // per batch (b·37 + 3) mod (t + 2)
  float scale = 0;
};

// Lengths 1, 7, 129; S < T and S > T; GQA 1, 2, 3; causal and not; softcap; window (causal and
// not); key_start; custom scale; all of them together.
inline const std::vector<Case>& feature_cases() {
  static const std::vector<Case> all = {
      {"s1", 1, 1, 1, 1, 1},
      {"odd7_gqa2", 2, 7, 7, 4, 2},
      {"s129_gqa3", 1, 129, 129, 3, 1},
      {"s_lt_t", 2, 65, 300, 4, 4},
      {"s_gt_t", 1, 300, 129, 2, 2},
      {"noncausal", 2, 200, 333, 4, 2, false},
      {"softcap", 1, 150, 150, 2, 1, true, 30.0},
      {"window", 1, 300, 300, 2, 2, true, 0, 64},
      {"window_noncausal", 1, 100, 260, 2, 1, false, 0, 40},
      {"key_start", 3, 20, 140, 4, 2, true, 0, -1, true},
      {"scale", 1, 64, 64, 2, 2, true, 0, -1, false, 0.3f},
      {"everything", 2, 129, 257, 4, 2, true, 10.0, 50, true, 0.1f},
  };
  return all;
}

inline int64_t key_start_of(const Case& c, int64_t batch) {
  return (batch * 37 + 3) % (c.t + 2);
}

// Sets an environment variable for a scope (value null: leaves it as the environment has it),
// then restores it.
class EnvScope {
 public:
  EnvScope(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value) setenv(name, value, 1);
  }
  EnvScope(const EnvScope&) = delete;
  EnvScope& operator=(const EnvScope&) = delete;
  ~EnvScope() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace attention_cases
