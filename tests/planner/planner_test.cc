#include "planner/planner.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/job_builders.h"

namespace reshard::planner {
namespace {

using test_support::MakeLayoutOnHosts;
using test_support::SetDp;
using test_support::SetTpSplit;
using test_support::Tensor;
using ::testing::HasSubstr;

v1::Ptc OneTensor(v1::TensorSpec t, int num_layers = 1) {
  v1::Ptc ptc;
  ptc.set_num_layers(num_layers);
  *ptc.add_tensors() = std::move(t);
  return ptc;
}

TEST(MakePlanTest, IdentityCopiesOnSameDevice) {
  v1::TensorSpec t = Tensor("w", {8, 4});
  SetTpSplit(&t, 0);
  const v1::Layout l = MakeLayoutOnHosts(2, 1, 2, 2);
  absl::StatusOr<Plan> plan = MakePlan(OneTensor(t), l, l, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->bytes_cross_host, 0);
  EXPECT_EQ(plan->lower_bound_cross_host, 0);
  EXPECT_EQ(plan->bytes_local, 2 * 8 * 4 * 4);
  ASSERT_EQ(plan->steps.size(), 4u);
  for (const Plan::Step& s : plan->steps) {
    ASSERT_EQ(s.dst_end - s.dst_begin, 1);
    EXPECT_EQ(s.src_rank, plan->dsts[s.dst_begin].rank);
  }
}

TEST(MakePlanTest, RegionCrossesToAHostOnceForSeveralRanks) {
  // dp 1 -> 2 replicated, the new replica on a new host with 2 tp ranks
  // there: each tp piece crosses once, to one rank each.
  v1::TensorSpec t = Tensor("w", {8, 4});
  const v1::Layout from = MakeLayoutOnHosts(1, 1, 1, 1);
  v1::Layout to = MakeLayoutOnHosts(1, 1, 2, 1);  // h0, h1
  absl::StatusOr<Plan> plan = MakePlan(OneTensor(t), from, to, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->bytes_cross_host, 128);
  EXPECT_EQ(plan->lower_bound_cross_host, 128);
  // Now two ranks on the new host need the whole (replicated) tensor.
  v1::Layout to2 = MakeLayoutOnHosts(1, 1, 3, 2);  // h0: ranks 0,1  h1: rank 2 (+ spare)
  to2.mutable_placement()->Clear();
  for (auto [h, d] : {std::pair<const char*, int>{"h0", 0}, {"h9", 0}, {"h9", 1}}) {
    auto* s = to2.mutable_placement()->add_ranks();
    s->set_host(h);
    s->set_device(d);
  }
  plan = MakePlan(OneTensor(t), from, to2, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->bytes_cross_host, 128);
  EXPECT_EQ(plan->cross_host_steps, 1);
  bool fan_out = false;
  for (const Plan::Step& s : plan->steps) fan_out |= s.cross_host && s.dst_end - s.dst_begin == 2;
  EXPECT_TRUE(fan_out);
}

TEST(MakePlanTest, RemoteLoadSpreadOverReplicas) {
  // 4 replicas on h0..h3 migrate to h4..h7 (everything remote): with 8 tensors
  // every old host serves some, none serves all.
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  for (int i = 0; i < 8; ++i) *ptc.add_tensors() = Tensor("w" + std::to_string(i), {16});
  const v1::Layout from = MakeLayoutOnHosts(1, 1, 4, 1, 0);
  const v1::Layout to = MakeLayoutOnHosts(1, 1, 4, 1, 4);
  absl::StatusOr<Plan> plan = MakePlan(ptc, from, to, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->bytes_local, 0);
  EXPECT_EQ(plan->bytes_cross_host, 4 * 8 * 64);
  for (const Plan::HostStats& h : plan->hosts) {
    if (h.host < "h4") {
      EXPECT_EQ(h.bytes_out, 8 * 64) << h.host;
    }
  }
}

TEST(MakePlanTest, ZeroFillsPadding) {
  v1::TensorSpec t = Tensor("m", {5});
  SetDp(&t, v1::DP_FLAT);
  absl::StatusOr<Plan> plan =
      MakePlan(OneTensor(t), MakeLayoutOnHosts(1, 1, 1, 1), MakeLayoutOnHosts(1, 1, 2, 2), {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->fills.size(), 1u);
  EXPECT_EQ(plan->fills[0].rank, 1);
  EXPECT_EQ(plan->fills[0].offset, 2);
  EXPECT_EQ(plan->fills[0].count, 1);
  EXPECT_EQ(plan->bytes_zero_filled, 4);
}

TEST(MakePlanTest, LostWithoutReplicaNamesTensorAndRegion) {
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  v1::TensorSpec a = Tensor("a", {4});
  SetTpSplit(&a, 0);
  *ptc.add_tensors() = a;
  *ptc.add_tensors() = Tensor("b", {4});
  LostSet lost;
  lost.hosts = {"h1"};
  absl::StatusOr<Plan> plan =
      MakePlan(ptc, MakeLayoutOnHosts(2, 1, 1, 1), MakeLayoutOnHosts(1, 1, 1, 1), lost);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("tensor \"a\" regions [2:4]"));
  EXPECT_THAT(std::string(plan.status().message()), ::testing::Not(HasSubstr("\"b\"")));
}

TEST(MakePlanTest, LostWithReplicaUsesSurvivor) {
  v1::TensorSpec t = Tensor("w", {4});
  LostSet lost;
  lost.ranks = {0};
  v1::Layout to = MakeLayoutOnHosts(1, 1, 1, 1, 5);
  absl::StatusOr<Plan> plan = MakePlan(OneTensor(t), MakeLayoutOnHosts(1, 1, 2, 1), to, lost);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->steps.size(), 1u);
  EXPECT_EQ(plan->steps[0].src_rank, 1);
  EXPECT_THAT(plan->lost_ranks, ::testing::ElementsAre(0));
}

TEST(MakePlanTest, BadLostInputs) {
  v1::TensorSpec t = Tensor("w", {4});
  const v1::Layout l = MakeLayoutOnHosts(1, 1, 2, 1);
  LostSet lost;
  lost.hosts = {"nope"};
  EXPECT_EQ(MakePlan(OneTensor(t), l, l, lost).status().code(), absl::StatusCode::kInvalidArgument);
  lost.hosts = {"h1"};
  absl::Status s = MakePlan(OneTensor(t), l, l, lost).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 is on lost host \"h1\""));
  lost.hosts.clear();
  lost.ranks = {7};
  EXPECT_EQ(MakePlan(OneTensor(t), l, l, lost).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MakePlanTest, PerRankBlobFollowsModulo) {
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  auto* b = ptc.add_blobs();
  b->set_name("rng");
  b->set_size_bytes(16);
  b->set_scope(v1::BLOB_PER_RANK);
  absl::StatusOr<Plan> plan =
      MakePlan(ptc, MakeLayoutOnHosts(1, 1, 2, 2), MakeLayoutOnHosts(1, 1, 4, 4), {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  // new ranks 0,2 take old rank 0's value; 1,3 take old rank 1's.
  for (const Plan::Step& s : plan->steps) {
    for (int i = s.dst_begin; i < s.dst_end; ++i) {
      EXPECT_EQ(plan->dsts[i].rank % 2, s.src_rank);
    }
  }
}

TEST(PlanTransferTest, ProtoCarriesStats) {
  v1::TensorSpec t = Tensor("w", {8});
  SetTpSplit(&t, 0);
  absl::StatusOr<v1::TransferPlan> plan =
      PlanTransfer(OneTensor(t), MakeLayoutOnHosts(2, 1, 1, 2), MakeLayoutOnHosts(4, 1, 1, 2), {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->items(0).name(), "w");
  EXPECT_EQ(plan->stats().steps(), plan->steps_size());
  EXPECT_EQ(plan->stats().bytes_cross_host(), plan->stats().lower_bound_cross_host());
}

}  // namespace
}  // namespace reshard::planner
