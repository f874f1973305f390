#include "planner/layout.h"

#include "gtest/gtest.h"
#include "tests/support/job_builders.h"

namespace reshard::planner {
namespace {

using test_support::MakeLayoutOnHosts;

TEST(ResolvedLayoutTest, MegatronRankOrderTpFastestThenDpThenPp) {
  HostTable hosts;
  const ResolvedLayout l = ResolvedLayout::Resolve(MakeLayoutOnHosts(2, 3, 4, 8), 6, &hosts);
  EXPECT_EQ(l.world(), 24);
  EXPECT_EQ(l.Rank({1, 0, 0}), 1);
  EXPECT_EQ(l.Rank({0, 1, 0}), 2);
  EXPECT_EQ(l.Rank({0, 0, 1}), 8);
  for (int r = 0; r < l.world(); ++r) EXPECT_EQ(l.Rank(l.Coord(r)), r);
  EXPECT_EQ(l.host(9), hosts.Find("h1"));
  EXPECT_EQ(l.device(9), 1);
}

TEST(ResolvedLayoutTest, TpPpDpOrder) {
  HostTable hosts;
  v1::Layout layout = MakeLayoutOnHosts(2, 3, 2, 4);
  layout.mutable_config()->set_order(v1::RANK_ORDER_TP_PP_DP);
  const ResolvedLayout l = ResolvedLayout::Resolve(layout, 3, &hosts);
  EXPECT_EQ(l.Rank({0, 0, 1}), 2);
  EXPECT_EQ(l.Rank({0, 1, 0}), 6);
  for (int r = 0; r < l.world(); ++r) EXPECT_EQ(l.Rank(l.Coord(r)), r);
}

TEST(ResolvedLayoutTest, StagesEvenAndExplicit) {
  HostTable hosts;
  const ResolvedLayout even = ResolvedLayout::Resolve(MakeLayoutOnHosts(1, 3, 1, 4), 10, &hosts);
  EXPECT_EQ(even.StageOfLayer(3), 0);  // 4, 3, 3
  EXPECT_EQ(even.StageOfLayer(4), 1);
  EXPECT_EQ(even.StageOfLayer(9), 2);
  const ResolvedLayout uneven =
      ResolvedLayout::Resolve(MakeLayoutOnHosts(1, 3, 1, 4, 0, {0, 1, 8}), 10, &hosts);
  EXPECT_EQ(uneven.StageOfLayer(0), 0);
  EXPECT_EQ(uneven.StageOfLayer(7), 1);
  EXPECT_EQ(uneven.StageOfLayer(8), 2);
  std::vector<int> stages;
  v1::Pipeline p;
  p.set_mode(v1::PIPELINE_LAST_STAGE);
  uneven.StagesHolding(p, &stages);
  EXPECT_EQ(stages, std::vector<int>({2}));
  p.set_mode(v1::PIPELINE_EVERY_STAGE);
  uneven.StagesHolding(p, &stages);
  EXPECT_EQ(stages, std::vector<int>({0, 1, 2}));
}

TEST(ExpandPlacementTest, ExplicitRanksWin) {
  v1::Placement p;
  auto* s = p.add_ranks();
  s->set_host("a");
  s->set_device(3);
  const auto slots = ExpandPlacement(p);
  ASSERT_EQ(slots.size(), 1u);
  EXPECT_EQ(slots[0].host(), "a");
  EXPECT_EQ(slots[0].device(), 3);
}

}  // namespace
}  // namespace reshard::planner
