// Learning-rate schedules against Transformers' get_scheduler (optim.json), and warmup resolution.
#include <gtest/gtest.h>

#include "hk/error.h"
#include "hk/lr_scheduler.h"
#include "train_test_util.h"

namespace hk {
namespace {

TEST(LRScheduler, MatchesTransformersGetScheduler) {
  const auto ref = test::read_json(test::train_fixture("optim.json"));
  ASSERT_EQ(ref["schedules"].size(), 8u);
  for (const auto& s : ref["schedules"]) {
    LRScheduler sched(parse_scheduler_type(s["type"].get<std::string>()),
                      s["base_lr"].get<double>(), s["warmup_steps"].get<int64_t>(),
                      s["total_steps"].get<int64_t>());
    const auto lrs = s["lrs"].get<std::vector<double>>();
    for (size_t step = 0; step < lrs.size(); ++step)
      EXPECT_NEAR(sched.lr(static_cast<int64_t>(step)), lrs[step], 1e-15)
          << s["type"] << " warmup " << s["warmup_steps"] << " step " << step;
  }
}

TEST(LRScheduler, UnknownTypeNamesTheImplementedOnes) {
  try {
    parse_scheduler_type("polynomial");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("constant_with_warmup"), std::string::npos) << e.what();
  }
  EXPECT_STREQ(scheduler_type_name(parse_scheduler_type("cosine")), "cosine");
}

TEST(LRScheduler, WarmupStepsAndRatios) {
  EXPECT_EQ(resolve_warmup_steps(5, 0, 100), 5);
  EXPECT_EQ(resolve_warmup_steps(0.1, 0, 95), 10);  // 5.x: a ratio below 1, ceil
  EXPECT_EQ(resolve_warmup_steps(0, 0.25, 10), 3);  // 4.x warmup_ratio, ceil(2.5)
  EXPECT_EQ(resolve_warmup_steps(3, 0.5, 10), 3);   // steps win over the ratio
  EXPECT_EQ(resolve_warmup_steps(0, 0, 10), 0);
  EXPECT_THROW(resolve_warmup_steps(-1, 0, 10), InvalidArgument);
  EXPECT_THROW(resolve_warmup_steps(0, 1.5, 10), InvalidArgument);
}

}  // namespace
}  // namespace hk
