#include "planner/survivor.h"

#include "gtest/gtest.h"
#include "tests/support/job_builders.h"

namespace reshard::planner {
namespace {

// tp 2 x dp 2 on h0, h1 x 2 devices.
v1::Layout TwoHostsOfTwo() { return test_support::MakeLayoutOnHosts(2, 1, 2, 2); }

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

TEST(SurvivorLayoutTest, KeepsHsdpShardGroupsThatStillTileDp) {
  // tp 1 x dp 4, dp_shard 2 on h0..h3 x 1 device.
  v1::Layout l = test_support::MakeLayoutOnHosts(1, 1, 4, 1);
  l.mutable_config()->set_dp_shard(2);
  auto three = SurvivorLayout(l, {"h3"}, {});  // dp 3: 2 does not divide it
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->config().dp(), 3);
  EXPECT_EQ(three->config().dp_shard(), 0);
  auto two = SurvivorLayout(l, {"h2", "h3"}, {});  // dp 2: one replica of 2
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->config().dp_shard(), 2);
}

TEST(SurvivorLayoutTest, KeepsContextParallelAndExpertGroups) {
  // tp 2 x cp 2 x dp 3 = 12 ranks, 4 per host on h0..h2, ep 4, expert_tp 1.
  v1::Layout l = test_support::MakeLayoutOnHosts(2, 1, 3, 4);
  l.mutable_config()->set_cp(2);
  l.mutable_config()->set_ep(4);
  l.mutable_config()->set_expert_tp(1);
  test_support::Place(&l, 4);
  // Losing h2 leaves 8 slots: dp 2 (tp 2 x cp 2 x dp 2 = 8, a multiple of 4).
  auto two = SurvivorLayout(l, {"h2"}, {});
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->config().dp(), 2);
  EXPECT_EQ(two->config().cp(), 2);
  EXPECT_EQ(two->placement().ranks_size(), 8);
  // Losing a rank too leaves 7 slots: dp 1 gives 4 ranks, a multiple of 4.
  auto one = SurvivorLayout(l, {"h2"}, {0});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->config().dp(), 1);
  // ep 8: 8 ranks per stage at least; 7 slots cannot.
  l.mutable_config()->set_ep(8);
  l.mutable_config()->set_dp(4);
  test_support::Place(&l, 4);
  EXPECT_EQ(SurvivorLayout(l, {"h2", "h3"}, {0}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto eight = SurvivorLayout(l, {"h3"}, {});
  ASSERT_TRUE(eight.ok()) << eight.status();
  EXPECT_EQ(eight->config().dp(), 2);  // 12 slots: dp 3 is 12 ranks, not a multiple of 8
}

}  // namespace
}  // namespace reshard::planner
