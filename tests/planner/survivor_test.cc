#include "planner/survivor.h"

#include "gtest/gtest.h"

namespace reshard::planner {
namespace {

v1::Layout TwoHostsOfTwo() {
  v1::Layout l;
  l.mutable_config()->set_tp(2);
  l.mutable_config()->set_pp(1);
  l.mutable_config()->set_dp(2);
  l.mutable_placement()->add_hosts("a");
  l.mutable_placement()->add_hosts("b");
  l.mutable_placement()->set_devices_per_host(2);
  return l;
}

TEST(SurvivorLayoutTest, ShrinksDataParallelismOntoSurvivors) {
  auto l = SurvivorLayout(TwoHostsOfTwo(), {"a"}, {});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->config().tp(), 2);
  EXPECT_EQ(l->config().dp(), 1);
  ASSERT_EQ(l->placement().ranks_size(), 2);
  EXPECT_EQ(l->placement().ranks(0).host(), "b");
  EXPECT_EQ(l->placement().ranks(1).device(), 1);
  // A lost rank takes its slot away: 3 slots hold one tp 2 replica.
  auto r = SurvivorLayout(TwoHostsOfTwo(), {}, {0});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->config().dp(), 1);
  EXPECT_EQ(r->placement().ranks(0).host(), "a");
  EXPECT_EQ(r->placement().ranks(0).device(), 1);
  EXPECT_EQ(SurvivorLayout(TwoHostsOfTwo(), {"a", "b"}, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace reshard::planner
