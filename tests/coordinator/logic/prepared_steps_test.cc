// ComputePreparedSteps and WithoutSkipped on a hand-built plan whose
// answers are computed by hand: which steps a prepared stop-free
// operation's transfer skips, the bytes skipped and each host's bytes left.
#include "services/coordinator/logic/prepared_steps.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/plan_steps.h"
#include "planner/planner.h"
#include "tests/support/job_builders.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

v1::Layout TwoRanks(const std::string& first, const std::string& second) {
  return test_support::MakeLayout(2, 1, 1, {first, second}, 1);
}

v1::ShardChecksum Sum(int item, int rank, uint64_t checksum, int64_t bytes) {
  v1::ShardChecksum c;
  c.set_item(item);
  c.set_rank(rank);
  c.set_checksum(checksum);
  c.set_bytes(bytes);
  return c;
}

// Old ranks 0, 1 on a, b; new ranks 0, 1 on a, b.
//   step 0: item 0, old rank 0 -> new rank 1 (b), 100 bytes
//   step 1: item 0, old rank 1 -> new rank 0 (a), 100 bytes
//   step 2: item 1, old rank 0 -> new ranks 0 (a) and 1 (b), 10 bytes each
//   zero fill: item 1, new rank 1 (b), 5 elements of 4 bytes = 20 bytes
// Bytes written: a 100 + 10 = 110; b 100 + 10 + 20 = 130.
v1::TransferPlan HandPlan() {
  v1::TransferPlan plan;
  *plan.mutable_source_layout() = TwoRanks("a", "b");
  *plan.mutable_target_layout() = TwoRanks("a", "b");
  for (const char* name : {"w", "rng"}) {
    v1::PlanItem* item = plan.add_items();
    item->set_name(name);
    item->set_element_bytes(4);
  }
  auto step = [&](int index, int item, int src, std::vector<int> dsts, int64_t bytes) {
    v1::CopyStep* s = plan.add_steps();
    s->set_index(index);
    s->set_item(item);
    s->set_src_rank(src);
    for (int d : dsts) s->add_dsts()->set_rank(d);
    s->set_bytes(bytes);
  };
  step(0, 0, 0, {1}, 100);
  step(1, 0, 1, {0}, 100);
  step(2, 1, 0, {0, 1}, 10);
  v1::ZeroFill* fill = plan.add_zero_fills();
  fill->set_item(1);
  fill->set_rank(1);
  fill->set_count(5);
  plan.add_regenerate()->set_item(1);
  return plan;
}

TEST(PreparedStepsTest, SkipsTheStepsWhoseSourceKeptItsChecksumAndBytes) {
  // (0, 0) unchanged; (0, 1) another checksum; (1, 0) other bytes.
  const PreparedSteps out =
      ComputePreparedSteps(HandPlan(), {Sum(0, 0, 1, 400), Sum(0, 1, 2, 400), Sum(1, 0, 3, 40)},
                           {Sum(0, 0, 1, 400), Sum(0, 1, 9, 400), Sum(1, 0, 3, 41)});
  EXPECT_THAT(out.skipped, ElementsAre(0));
  // Step 0's 100 bytes and the zero fill's 20.
  EXPECT_EQ(out.bytes_skipped, 120);
  // a: step 1 (100) + step 2 (10); b: step 2 (10).
  EXPECT_THAT(out.bytes_by_host, ElementsAre(Pair("a", 110), Pair("b", 10)));
}

TEST(PreparedStepsTest, AShardMissingOnEitherSideMovesAgain) {
  // (0, 1) was not reported by the prepare; (1, 0) has no checkpoint checksum.
  const PreparedSteps out = ComputePreparedSteps(HandPlan(), {Sum(0, 0, 1, 400), Sum(1, 0, 3, 40)},
                                                 {Sum(0, 0, 1, 400), Sum(0, 1, 2, 400)});
  EXPECT_THAT(out.skipped, ElementsAre(0));
  EXPECT_EQ(out.bytes_skipped, 120);
}

TEST(PreparedStepsTest, NothingChangedLeavesNoBytesButEveryHost) {
  const std::vector<v1::ShardChecksum> sums = {Sum(0, 0, 1, 400), Sum(0, 1, 2, 400),
                                               Sum(1, 0, 3, 40)};
  const PreparedSteps out = ComputePreparedSteps(HandPlan(), sums, sums);
  EXPECT_THAT(out.skipped, ElementsAre(0, 1, 2));
  EXPECT_EQ(out.bytes_skipped, 240);  // 110 + 130: the whole plan
  EXPECT_THAT(out.bytes_by_host, ElementsAre(Pair("a", 0), Pair("b", 0)));
}

TEST(PreparedStepsTest, ARepeatingPlanSkipsAsItsWrittenOutForm) {
  // An HSDP job whose 2 replicas plan alone (TransferPlan.replicas).
  absl::StatusOr<v1::TransferPlan> plan =
      planner::PlanTransfer(test_support::TwoLayerPtc(), test_support::HsdpLayout(2, 2, 4, 2, 2),
                            test_support::HsdpLayout(1, 2, 8, 4, 2), {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->replicas().count(), 2);
  // Every source shard prepared; those of items 0-2 kept their checksums.
  std::vector<v1::ShardChecksum> prepared, checkpoint;
  for (int item = 0; item < plan->items_size(); ++item) {
    for (int rank = 0; rank < 16; ++rank) {
      prepared.push_back(Sum(item, rank, 1, 64));
      checkpoint.push_back(Sum(item, rank, item < 3 ? 1 : 2, 64));
    }
  }
  const PreparedSteps out = ComputePreparedSteps(*plan, prepared, checkpoint);
  const PreparedSteps want =
      ComputePreparedSteps(planner::ExpandReplicas(*plan), prepared, checkpoint);
  EXPECT_EQ(out.skipped, want.skipped);
  EXPECT_EQ(out.bytes_skipped, want.bytes_skipped);
  EXPECT_EQ(out.bytes_by_host, want.bytes_by_host);
  EXPECT_FALSE(out.skipped.empty());
  EXPECT_GT(out.bytes_skipped, 0);
  EXPECT_LT(static_cast<int64_t>(out.skipped.size()), plan->stats().steps());
}

TEST(PreparedStepsTest, WithoutSkippedDropsSkippedStepsFillsAndRegenerates) {
  const v1::TransferPlan slice = WithoutSkipped(HandPlan(), {0, 2});
  ASSERT_EQ(slice.steps_size(), 1);
  EXPECT_EQ(slice.steps(0).index(), 1);
  EXPECT_EQ(slice.zero_fills_size(), 0);
  EXPECT_EQ(slice.regenerate_size(), 0);
  EXPECT_EQ(slice.items_size(), 2);
  EXPECT_EQ(slice.target_layout().placement().hosts_size(), 2);
}

}  // namespace
}  // namespace reshard::coordinator
