#include "planner/survivor.h"

#include "gtest/gtest.h"
#include "tests/planner/test_specs.h"

namespace reshard::planner {
namespace {

// tp 2 x dp 2 on h0, h1 x 2 devices.
v1::Layout TwoHostsOfTwo() { return testing::MakeLayout(2, 1, 2, 2); }

TEST(SurvivorLayoutTest, ShrinksDataParallelismOntoSurvivors) {
  auto l = SurvivorLayout(TwoHostsOfTwo(), {"h0"}, {});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->config().tp(), 2);
  EXPECT_EQ(l->config().dp(), 1);
  ASSERT_EQ(l->placement().ranks_size(), 2);
  EXPECT_EQ(l->placement().ranks(0).host(), "h1");
  EXPECT_EQ(l->placement().ranks(1).device(), 1);
  // A lost rank takes its slot away: 3 slots hold one tp 2 replica.
  auto r = SurvivorLayout(TwoHostsOfTwo(), {}, {0});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->config().dp(), 1);
  EXPECT_EQ(r->placement().ranks(0).host(), "h0");
  EXPECT_EQ(r->placement().ranks(0).device(), 1);
  EXPECT_EQ(SurvivorLayout(TwoHostsOfTwo(), {"h0", "h1"}, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace reshard::planner
