// Default table + KernelConfig precedence, capability ranges and mode chains.
#include <gtest/gtest.h>

#include "kernelize/mapping.h"

namespace hk::kernel_binding {

TEST(Mapping, DefaultTableIsDeviceAware) {
  auto rules = effective_rules(KernelConfig{});
  auto cuda = choose_rule(rules, "RMSNorm", "cuda", 90, Mode::Inference);
  ASSERT_TRUE(cuda);
  EXPECT_EQ(cuda->rule.kernel.spec, "kernels-community/liger-kernels:LigerRMSNorm");
  EXPECT_EQ(*cuda->rule.kernel.options.version, 3);
  EXPECT_EQ(choose_rule(rules, "RMSNorm", "xpu", 0, Mode::Inference)->rule.kernel.spec,
            "kernels-community/rmsnorm:RMSNorm");
  EXPECT_EQ(choose_rule(rules, "rotary_pos_emb", "rocm", 0, Mode::Inference)->rule.kernel.spec,
            "kernels-community/aiter-rope:apply_rotary_transformers");
  EXPECT_FALSE(choose_rule(rules, "MLP", "rocm", 0, Mode::Inference));
  EXPECT_FALSE(choose_rule(rules, "Unknown", "cuda", 90, Mode::Inference));
}

TEST(Mapping, ConfigOverridesPerDeviceAndInherits) {
  KernelConfig c{{{"RMSNorm", KernelMappingValue::devices({{"cuda", {"me/norm:N", {}}}})}}};
  auto rules = effective_rules(c);
  EXPECT_EQ(choose_rule(rules, "RMSNorm", "cuda", 90, Mode::Inference)->rule.kernel.spec,
            "me/norm:N");
  EXPECT_EQ(choose_rule(rules, "RMSNorm", "cuda", 90, Mode::Inference)->rule.source,
            "kernel_config");
  // xpu not named by the per-device value: the default stays
  EXPECT_EQ(choose_rule(rules, "RMSNorm", "xpu", 0, Mode::Inference)->rule.kernel.spec,
            "kernels-community/rmsnorm:RMSNorm");
  c.inherit_mapping = false;
  rules = effective_rules(c);
  EXPECT_FALSE(choose_rule(rules, "RMSNorm", "xpu", 0, Mode::Inference));
  EXPECT_FALSE(choose_rule(rules, "MLP", "cuda", 90, Mode::Inference));
}

TEST(Mapping, EmptyValueDisables) {
  auto rules = effective_rules(KernelConfig{{{"RMSNorm", ""}}});
  auto choice = choose_rule(rules, "RMSNorm", "cuda", 90, Mode::Inference);
  ASSERT_TRUE(choice);
  EXPECT_TRUE(choice->rule.kernel.disabled());
}

TEST(Mapping, SmallestCapabilityRangeThenModeChain) {
  auto r = [](int lo, int hi, Mode m, const char* spec) {
    MappingRule x;
    x.layer = "RMSNorm";
    x.device = "cuda";
    x.min_capability = lo;
    x.max_capability = hi;
    x.mode = m;
    x.kernel.spec = spec;
    return x;
  };
  std::vector<MappingRule> rules = {
      r(0, 1000, Mode::Fallback, "wide/any"), r(80, 100, Mode::Training, "narrow/train"),
      r(80, 100, Mode::Fallback, "narrow/any"), r(90, 90, Mode::Inference | Mode::Capture, "h/ic"),
      r(70, 75, Mode::Inference, "old/inf")};
  // capability 90: the 90..90 range is smallest; for I the chain reaches I|C there
  EXPECT_EQ(choose_rule(rules, "RMSNorm", "cuda", 90, Mode::Inference)->rule.kernel.spec, "h/ic");
  // the 90..90 range has no T/T|C/fallback: training finds nothing in the winning range
  EXPECT_FALSE(choose_rule(rules, "RMSNorm", "cuda", 90, Mode::Training));
  // capability 86: 80..100 wins; T matches the training rule, I walks I→I|C→T
  EXPECT_EQ(choose_rule(rules, "RMSNorm", "cuda", 86, Mode::Training)->rule.kernel.spec,
            "narrow/train");
  auto inf = choose_rule(rules, "RMSNorm", "cuda", 86, Mode::Inference);
  EXPECT_EQ(inf->rule.kernel.spec, "narrow/train");
  EXPECT_EQ(inf->matched_mode, Mode::Training);
  // I|C chain skips T: falls to the fallback key
  EXPECT_EQ(
      choose_rule(rules, "RMSNorm", "cuda", 86, Mode::Inference | Mode::Capture)->rule.kernel.spec,
      "narrow/any");
  EXPECT_EQ(choose_rule(rules, "RMSNorm", "cuda", 72, Mode::Inference)->rule.kernel.spec,
            "old/inf");
  EXPECT_EQ(choose_rule(rules, "RMSNorm", "cuda", 60, Mode::Training)->rule.kernel.spec,
            "wide/any");
}

}  // namespace hk::kernel_binding
