// Mode validation and the exact fallback chains of MISSION.md.
#include <gtest/gtest.h>

#include "hk/error.h"
#include "hk/mode.h"

namespace hk {

TEST(Mode, ChainsMatchTheSpecification) {
  const Mode I = Mode::Inference, T = Mode::Training, C = Mode::Capture, F = Mode::Fallback;
  EXPECT_EQ(fallback_chain(I), (std::vector<Mode>{I, I | C, T, T | C, F}));
  EXPECT_EQ(fallback_chain(I | C), (std::vector<Mode>{I | C, T | C, F}));
  EXPECT_EQ(fallback_chain(T), (std::vector<Mode>{T, T | C, F}));
  EXPECT_EQ(fallback_chain(T | C), (std::vector<Mode>{T | C, F}));
}

TEST(Mode, InvalidCombinationsAreErrors) {
  EXPECT_THROW(validate_mode(Mode::Inference | Mode::Training), InvalidArgument);
  EXPECT_THROW(validate_mode(Mode::Capture), InvalidArgument);
  EXPECT_THROW(validate_mode(Mode::None), InvalidArgument);
  EXPECT_THROW(fallback_chain(Mode::Fallback), InvalidArgument);
  try {
    validate_mode(Mode::Inference | Mode::Training);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("exclusive"), std::string::npos);
  }
}

TEST(Mode, ParseAndName) {
  EXPECT_EQ(parse_mode("inference"), Mode::Inference);
  EXPECT_EQ(parse_mode("training,capture"), Mode::Training | Mode::Capture);
  EXPECT_EQ(parse_mode("Inference|Capture"), Mode::Inference | Mode::Capture);
  EXPECT_EQ(mode_name(Mode::Training | Mode::Capture), "training|capture");
  EXPECT_THROW(parse_mode("fast"), InvalidArgument);
  EXPECT_THROW(parse_mode("inference,training"), InvalidArgument);
}

}  // namespace hk
