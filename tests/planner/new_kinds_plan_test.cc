// Golden plan tests of the kinds of issue 13: hand-computed fills, regenerate
// lists and byte counts, every plan also replayed (plan_check.h) and checked
// by the independent verifier.
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "tests/planner/plan_check.h"
#include "tests/support/job_builders.h"
#include "verifier/verifier.h"

namespace reshard::planner {
namespace {

using test_support::MakeLayoutOnHosts;
using test_support::SetTpSplit;
using test_support::Tensor;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::PlanAndCheck;

v1::Ptc Vocabulary() {
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  v1::TensorSpec emb = Tensor("emb", {50257, 2});
  SetTpSplit(&emb, 0);
  v1::AxisPadding* p = emb.mutable_partition()->mutable_padding();
  p->set_multiple(128);
  p->set_times_tp(true);
  *ptc.add_tensors() = emb;
  return ptc;
}

TEST(NewKindsPlanTest, VocabularyPaddingTp1ToTp4ZeroFillsTheNewPadding) {
  const v1::Ptc ptc = Vocabulary();
  // tp 1 holds 50304 rows, tp 4 50688 (4 x 12672): new rank 3 holds rows
  // 38016..50256 and 431 rows of padding; only real rows are copied.
  const Plan plan = PlanAndCheck(ptc, MakeLayoutOnHosts(1, 1, 1, 4), MakeLayoutOnHosts(4, 1, 1, 4));
  ASSERT_EQ(plan.fills.size(), 1u);
  EXPECT_EQ(plan.fills[0].rank, 3);
  EXPECT_EQ(plan.fills[0].offset, 12241 * 2);
  EXPECT_EQ(plan.fills[0].count, 431 * 2);
  EXPECT_EQ(plan.bytes_zero_filled, 431 * 2 * 4);
  EXPECT_EQ(plan.bytes_local, 50257 * 2 * 4);
  EXPECT_EQ(plan.bytes_cross_host, 0);
  // Back to tp 1: 47 rows of padding at the end of the one buffer.
  const Plan back = PlanAndCheck(ptc, MakeLayoutOnHosts(4, 1, 1, 4), MakeLayoutOnHosts(1, 1, 1, 4));
  ASSERT_EQ(back.fills.size(), 1u);
  EXPECT_EQ(back.fills[0].offset, 50257 * 2);
  EXPECT_EQ(back.fills[0].count, 47 * 2);
}

TEST(NewKindsPlanTest, CrossHostLowerBoundExcludesPadding) {
  // tp 1 on h0 -> tp 4 on h1: every real element crosses once, no padding.
  const Plan plan =
      PlanAndCheck(Vocabulary(), MakeLayoutOnHosts(1, 1, 1, 1), MakeLayoutOnHosts(4, 1, 1, 4, 1));
  EXPECT_EQ(plan.bytes_cross_host, 50257 * 2 * 4);
  EXPECT_EQ(plan.lower_bound_cross_host, 50257 * 2 * 4);
}

v1::Ptc WithRngState(bool regenerable) {
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  *ptc.add_tensors() = Tensor("w", {4, 4});
  v1::BlobSpec* rng = ptc.add_blobs();
  rng->set_name("rng_state");
  rng->set_size_bytes(16);
  rng->set_scope(v1::BLOB_PER_RANK);
  rng->set_regenerable(regenerable);
  v1::BlobSpec* step = ptc.add_blobs();
  step->set_name("step");
  step->set_size_bytes(8);
  return ptc;
}

TEST(NewKindsPlanTest, LostHostHoldingTheOnlyRngStateRegeneratesIt) {
  // dp 2 on h0, h1; h1 is lost, the new dp 2 is on h0 and h2. The weights
  // and the step have a replica on h0; rng_state value 1 had only h1.
  const v1::Layout from = MakeLayoutOnHosts(1, 1, 2, 1);
  const v1::Layout to = MakeLayoutOnHosts(1, 1, 2, 1, 0);
  v1::Layout target = to;
  target.mutable_placement()->set_hosts(1, "h2");
  const LostSet lost{{"h1"}, {}};
  const Plan plan = PlanAndCheck(WithRngState(true), from, target, lost);
  EXPECT_THAT(plan.regenerate, ElementsAre(std::make_pair(1, 1)));  // (rank 1, rng_state)
  ASSERT_EQ(plan.fills.size(), 1u);
  EXPECT_EQ(plan.fills[0].item, 1);
  EXPECT_EQ(plan.fills[0].rank, 1);
  EXPECT_EQ(plan.fills[0].count, 16);
  EXPECT_EQ(plan.bytes_cross_host, 64 + 8);  // w and step to h2
  const v1::TransferPlan proto = ToProto(plan, from, target);
  ASSERT_EQ(proto.regenerate_size(), 1);
  EXPECT_EQ(proto.regenerate(0).rank(), 1);
  EXPECT_EQ(proto.regenerate(0).item(), 1);
  // A required rng_state fails the plan, naming it.
  absl::StatusOr<Plan> required = MakePlan(WithRngState(false), from, target, lost);
  EXPECT_EQ(required.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(required.status().message()), HasSubstr("blob \"rng_state\""));
}

v1::Ptc MegatronBuckets() {
  v1::Ptc ptc;
  ptc.set_num_layers(2);
  v1::BucketGroup* g = ptc.add_buckets();
  g->set_name("main");
  g->set_reverse_order(true);
  g->set_param_align(64);
  g->set_pad_multiple(128);
  g->set_bucket_elements(300);
  int layer = 0;
  for (auto [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"a", {10, 10}}, {"b", {5, 10}}, {"c", {20, 10}}, {"d", {7, 3}}}) {
    v1::TensorSpec t = Tensor(name, shape);
    SetTpSplit(&t, 1);
    test_support::SetPipeline(&t, v1::PIPELINE_LAYER, layer++ % 2);
    t.mutable_partition()->mutable_dp()->set_mode(v1::DP_BUCKET);
    t.mutable_partition()->mutable_dp()->set_bucket("main");
    *ptc.add_tensors() = t;
  }
  return ptc;
}

TEST(NewKindsPlanTest, MegatronBucketsAcrossDpTpAndHosts) {
  const v1::Ptc ptc = MegatronBuckets();
  PlanAndCheck(ptc, MakeLayoutOnHosts(2, 2, 2, 4), MakeLayoutOnHosts(1, 2, 3, 2));
  PlanAndCheck(ptc, MakeLayoutOnHosts(1, 2, 3, 2), MakeLayoutOnHosts(2, 1, 2, 4, 3));
  // Bucket buffers hold no padding: nothing to fill.
  const Plan plan =
      PlanAndCheck(ptc, MakeLayoutOnHosts(2, 2, 2, 4), MakeLayoutOnHosts(2, 2, 1, 4, 1));
  EXPECT_TRUE(plan.fills.empty());
}

TEST(NewKindsPlanTest, FsdpFlatParameterToMoreRanks) {
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  ptc.add_buckets()->set_name("unit0");
  for (auto [name, n] : std::vector<std::pair<std::string, int64_t>>{{"x", 5}, {"y", 6}}) {
    v1::TensorSpec t = Tensor(name, {n});
    t.mutable_partition()->mutable_dp()->set_mode(v1::DP_BUCKET);
    t.mutable_partition()->mutable_dp()->set_bucket("unit0");
    *ptc.add_tensors() = t;
  }
  const Plan plan =
      PlanAndCheck(ptc, MakeLayoutOnHosts(1, 1, 3, 3), MakeLayoutOnHosts(1, 1, 4, 2, 5));
  EXPECT_EQ(plan.bytes_cross_host, 11 * 4);
}

TEST(NewKindsPlanTest, InterleavedContextParallelAndExperts) {
  v1::Ptc ptc;
  ptc.set_num_layers(8);
  for (int layer = 0; layer < 8; ++layer) {
    v1::TensorSpec w = Tensor("layers." + std::to_string(layer) + ".w", {6, 4});
    SetTpSplit(&w, 0);
    test_support::SetPipeline(&w, v1::PIPELINE_LAYER, layer);
    test_support::SetDp(&w, v1::DP_FLAT);
    *ptc.add_tensors() = w;
    v1::TensorSpec e = Tensor("layers." + std::to_string(layer) + ".experts", {4, 6, 2});
    SetTpSplit(&e, 1);
    test_support::SetPipeline(&e, v1::PIPELINE_LAYER, layer);
    e.mutable_partition()->mutable_expert()->set_axis(0);
    test_support::SetDp(&e, v1::DP_CHUNK, 1);
    e.mutable_partition()->set_allow_empty(true);
    *ptc.add_tensors() = e;
  }
  v1::TensorSpec emb = Tensor("emb", {11, 4});
  SetTpSplit(&emb, 0);
  emb.mutable_partition()->mutable_pipeline()->set_mode(v1::PIPELINE_FIRST_AND_LAST_STAGE);
  *ptc.add_tensors() = emb;
  // tp 2, pp 2, dp 2, ep 2 -> tp 2, cp 2, pp 2 x vpp 2, dp 1, ep 4, expert_tp 1.
  v1::Layout from = MakeLayoutOnHosts(2, 2, 2, 4);
  from.mutable_config()->set_ep(2);
  v1::Layout to = MakeLayoutOnHosts(2, 2, 1, 4, 1);
  to.mutable_config()->set_cp(2);
  to.mutable_config()->set_vpp(2);
  to.mutable_config()->set_ep(4);
  to.mutable_config()->set_expert_tp(1);
  test_support::Place(&to, 4, 1);
  PlanAndCheck(ptc, from, to);
  PlanAndCheck(ptc, to, from);
  // Every tensor here is sharded over its data-parallel group: losing a
  // host loses its shards, and the plan names them.
  v1::Layout two = MakeLayoutOnHosts(2, 2, 2, 2);
  two.mutable_config()->set_ep(2);
  absl::StatusOr<Plan> lost = MakePlan(ptc, two, to, LostSet{{"h0"}, {}});
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(lost.status().message()), HasSubstr("tensor \"layers.0.experts\""));
}

TEST(NewKindsPlanTest, PlanCheckCatchesABrokenPlan) {
  const v1::Ptc ptc = MegatronBuckets();
  const v1::Layout from = MakeLayoutOnHosts(2, 2, 2, 4), to = MakeLayoutOnHosts(1, 2, 3, 2);
  absl::StatusOr<Plan> plan = MakePlan(ptc, from, to, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  Plan dropped = *plan;
  dropped.steps.pop_back();
  EXPECT_FALSE(testing::CheckPlan(ptc, from, to, {}, dropped));
  Plan shifted = *plan;
  shifted.dsts[0].offset += 1;
  EXPECT_FALSE(testing::CheckPlan(ptc, from, to, {}, shifted));
  Plan extra = *plan;
  const Plan::Step& first = plan->steps[0];
  extra.fills.push_back(Plan::Fill{first.item, plan->dsts[first.dst_begin].rank,
                                   plan->dsts[first.dst_begin].offset, 1});
  EXPECT_FALSE(testing::CheckPlan(ptc, from, to, {}, extra));
}

}  // namespace
}  // namespace reshard::planner
