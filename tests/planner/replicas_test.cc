// Replicas that plan alone (planner/replicas.h, docs/partitioning.md,
// "Replicas plan alone"): when an HSDP job's replicas split alike in both
// layouts, MakePlan plans replica 0 and repeats it. The whole plan, written
// out, passes the planner's replay and the independent verifier; no byte
// crosses between replicas; and every case that must not split does not.
#include "planner/replicas.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/layout.h"
#include "planner/plan_steps.h"
#include "planner/planner.h"
#include "tests/planner/plan_check.h"
#include "tests/support/job_builders.h"
#include "tests/verifier/random_jobs.h"
#include "verifier/verifier.h"

namespace reshard::planner {
namespace {

using test_support::AddBlob;
using test_support::AddTensor;
using test_support::SetDp;
using test_support::SetExpert;
using test_support::SetTpSplit;
using testing::PlanAndCheck;
using testing::WrittenOut;

v1::Layout Hsdp(int tp, int pp, int dp, int dp_shard, int per_host, int first_host = 0,
                v1::RankOrder order = v1::RANK_ORDER_TP_DP_PP) {
  return test_support::HsdpLayout(tp, pp, dp, dp_shard, per_host, first_host, order);
}

// A small FSDP-style model: tp-split weights sharded over the shard group,
// an fp32 moment, a replicated bias and a replicated blob, over `layers`.
v1::Ptc Model(int layers = 2) {
  v1::Ptc ptc;
  ptc.set_num_layers(layers);
  for (int l = 0; l < layers; ++l) {
    v1::TensorSpec* w = AddTensor(&ptc, "w" + std::to_string(l), {24, 16}, v1::DTYPE_BFLOAT16,
                                  layers > 1 ? v1::PIPELINE_LAYER : v1::PIPELINE_EVERY_STAGE, l);
    SetTpSplit(w, 1);
    SetDp(w, v1::DP_CHUNK, 0);
    v1::TensorSpec* m = AddTensor(&ptc, "m" + std::to_string(l), {24, 16}, v1::DTYPE_FLOAT32,
                                  layers > 1 ? v1::PIPELINE_LAYER : v1::PIPELINE_EVERY_STAGE, l);
    SetTpSplit(m, 0);
    SetDp(m, v1::DP_FLAT, 0);
  }
  AddTensor(&ptc, "bias", {10});
  AddBlob(&ptc, "step", 8, v1::BLOB_REPLICATED);
  return ptc;
}

// The hosts of a layout's ranks, by rank.
std::vector<std::string> HostsOf(const v1::Layout& l) {
  std::vector<std::string> out;
  for (const v1::DeviceSlot& s : ExpandPlacement(l.placement())) out.push_back(s.host());
  return out;
}

// The replica (by host) of every host: hosts "h<i>" in blocks of `per`.
int ReplicaOfHost(const std::string& host, int per) { return std::stoi(host.substr(1)) / per; }

TEST(ReplicasTest, AnHsdpTpChangePlansOneReplicaAndRepeatsIt) {
  // 4 replicas of 2 hosts x 4 devices: tp 4 ds 2 -> tp 2 ds 4.
  const v1::Ptc ptc = Model(1);
  const v1::Layout from = Hsdp(4, 1, 8, 2, 4);
  const v1::Layout to = Hsdp(2, 1, 16, 4, 4);
  const Plan plan = PlanAndCheck(ptc, from, to);
  EXPECT_EQ(plan.replicas.count, 4);
  EXPECT_EQ(plan.replicas.src_stride, 8);
  EXPECT_EQ(plan.replicas.dst_stride, 8);
  // Replica 0's own ranks only.
  for (const Plan::Step& s : plan.steps) EXPECT_LT(s.src_rank, 8);
  for (const Plan::Dst& d : plan.dsts) EXPECT_LT(d.rank, 8);
  ASSERT_EQ(plan.hosts.size(), 8u);
  for (int h = 0; h < 8; ++h) EXPECT_EQ(plan.hosts[h].host, "h" + std::to_string(h));
  // Host h mirrors host h % 2 of replica 0.
  for (int h = 2; h < 8; ++h) {
    EXPECT_EQ(plan.hosts[h].bytes_in, plan.hosts[h % 2].bytes_in) << h;
    EXPECT_EQ(plan.hosts[h].bytes_out, plan.hosts[h % 2].bytes_out) << h;
    EXPECT_EQ(plan.hosts[h].bytes_local, plan.hosts[h % 2].bytes_local) << h;
  }
  EXPECT_GT(plan.bytes_cross_host, 0);

  // No byte crosses between replicas.
  const std::vector<std::string> old_host = HostsOf(from), new_host = HostsOf(to);
  const Plan whole = WrittenOut(plan);
  EXPECT_EQ(static_cast<int64_t>(whole.steps.size()), plan.TotalSteps());
  for (const Plan::Step& s : whole.steps) {
    for (int32_t d = s.dst_begin; d < s.dst_end; ++d) {
      EXPECT_EQ(ReplicaOfHost(old_host[s.src_rank], 2),
                ReplicaOfHost(new_host[whole.dsts[d].rank], 2));
    }
  }
}

// The tp change of the first test: 4 replicas of 2 hosts x 4 devices, tp 4
// ds 2 -> tp 2 ds 4.
class TpChange : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Plan> made = MakePlan(ptc, from, to, {});
    ASSERT_TRUE(made.ok()) << made.status();
    plan = *std::move(made);
    proto = ToProto(plan, from, to);
  }
  const v1::Ptc ptc = Model(1);
  const v1::Layout from = Hsdp(4, 1, 8, 2, 4);
  const v1::Layout to = Hsdp(2, 1, 16, 4, 4);
  Plan plan;
  v1::TransferPlan proto;
};

TEST_F(TpChange, TheMessageRepeatsAndWritesOutToTheWholePlan) {
  EXPECT_EQ(proto.replicas().count(), 4);
  EXPECT_EQ(proto.replicas().src_rank_stride(), 8);
  EXPECT_EQ(proto.replicas().dst_rank_stride(), 8);
  EXPECT_EQ(proto.steps_size(), static_cast<int>(plan.steps.size()));
  EXPECT_EQ(proto.stats().steps(), 4 * proto.steps_size());
  EXPECT_EQ(proto.stats().zero_fills(), 4 * proto.zero_fills_size());

  const v1::TransferPlan whole = ExpandReplicas(proto);
  EXPECT_FALSE(whole.has_replicas());
  ASSERT_EQ(whole.steps_size(), proto.stats().steps());
  for (int i = 0; i < whole.steps_size(); ++i) EXPECT_EQ(whole.steps(i).index(), i);
  const int n = proto.steps_size();
  for (int k = 0; k < 4; ++k) {
    for (int i = 0; i < n; ++i) {
      const v1::CopyStep& s = whole.steps(k * n + i);
      EXPECT_EQ(s.src_rank(), proto.steps(i).src_rank() + 8 * k);
      ASSERT_EQ(s.dsts_size(), proto.steps(i).dsts_size());
      for (int d = 0; d < s.dsts_size(); ++d) {
        EXPECT_EQ(s.dsts(d).rank(), proto.steps(i).dsts(d).rank() + 8 * k);
      }
    }
  }
  EXPECT_TRUE(verifier::VerifyPlan(ptc, from, to, {}, {}, whole).ok());
  // ForEachStep walks the same steps, in the same order, with their indexes.
  int64_t next = 0;
  ForEachStep(proto, [&](const v1::CopyStep& s, const ReplicaShift& at) {
    EXPECT_EQ(s.index() + at.index, next);
    EXPECT_EQ(s.src_rank() + at.src, whole.steps(static_cast<int>(next)).src_rank());
    ++next;
  });
  EXPECT_EQ(next, whole.steps_size());
}

TEST_F(TpChange, ReplicasNamingFindsTheReplicasOfAHostsRanks) {
  ASSERT_EQ(proto.replicas().count(), 4);
  // Host h2 (replica 1) holds old and new ranks 8-11; h7 (replica 3) 28-31.
  EXPECT_EQ(ReplicasNaming(proto, {8, 9, 10, 11}, {8, 9, 10, 11}), std::vector<int>{1});
  EXPECT_EQ(ReplicasNaming(proto, {}, {28, 31}), std::vector<int>{3});
  EXPECT_EQ(ReplicasNaming(proto, {0}, {31}), (std::vector<int>{0, 3}));
  EXPECT_EQ(ReplicasNaming(proto, {40}, {-1}), std::vector<int>{});
  // A plan that does not repeat: replica 0, whatever the ranks.
  v1::TransferPlan whole = ExpandReplicas(proto);
  EXPECT_EQ(ReplicasNaming(whole, {28}, {}), std::vector<int>{0});
}

TEST_F(TpChange, TheVerifierCatchesAWrongStride) {
  ASSERT_TRUE(verifier::VerifyPlan(ptc, from, to, {}, {}, proto).ok());
  proto.mutable_replicas()->set_dst_rank_stride(0);
  EXPECT_FALSE(verifier::VerifyPlan(ptc, from, to, {}, {}, proto).ok());
  proto.mutable_replicas()->set_dst_rank_stride(8);
  proto.mutable_replicas()->set_count(3);
  EXPECT_FALSE(verifier::VerifyPlan(ptc, from, to, {}, {}, proto).ok());
  // Counts and strides past the worlds are refused before the plan is
  // written out (no loop over 2^31 replicas, no overflow).
  for (const auto& [count, src, dst] :
       {std::tuple{5, 8, 8}, std::tuple{4, 11, 8}, std::tuple{4, 8, 1 << 30},
        std::tuple{2147483647, 8, 8}, std::tuple{4, -8, 8}}) {
    proto.mutable_replicas()->set_count(count);
    proto.mutable_replicas()->set_src_rank_stride(src);
    proto.mutable_replicas()->set_dst_rank_stride(dst);
    const absl::Status s = verifier::VerifyPlan(ptc, from, to, {}, {}, proto);
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << count << " " << src << " " << dst << ": " << s;
    EXPECT_NE(std::string(s.message()).find("reach beyond the worlds of 32 and 32 ranks"),
              std::string::npos)
        << s;
  }
}

TEST(ReplicasTest, PipelineStagesAndEitherRankOrderSplit) {
  // pp 2: a replica's ranks are not consecutive, yet they shift by a stride.
  const v1::Ptc ptc = Model(2);
  for (v1::RankOrder order : {v1::RANK_ORDER_TP_DP_PP, v1::RANK_ORDER_TP_PP_DP}) {
    SCOPED_TRACE(order);
    v1::Layout from = Hsdp(2, 2, 6, 2, 4, 0, order);
    v1::Layout to = Hsdp(1, 2, 12, 4, 4, 0, order);
    const Plan plan = PlanAndCheck(ptc, from, to);
    // 3 replicas of 2 hosts each. In TP_DP_PP order a replica is 4 ranks
    // of stage 0 and 4 of stage 1, 12 ranks apart (hosts k and 3 + k); in
    // TP_PP_DP order its 8 ranks are consecutive.
    EXPECT_EQ(plan.replicas.count, 3);
    EXPECT_EQ(plan.replicas.src_stride, order == v1::RANK_ORDER_TP_PP_DP ? 8 : 4);
    EXPECT_EQ(plan.replicas.dst_stride, order == v1::RANK_ORDER_TP_PP_DP ? 8 : 4);
  }
}

TEST(ReplicasTest, PerRankBlobsSplitWhenTheRanksStayTheRanks) {
  v1::Ptc ptc = Model(1);
  AddBlob(&ptc, "rng", 16, v1::BLOB_PER_RANK);
  // The same world, the same rank numbering: new rank r takes old rank r.
  const Plan same = PlanAndCheck(ptc, Hsdp(4, 1, 8, 2, 4), Hsdp(2, 1, 16, 4, 4));
  EXPECT_EQ(same.replicas.count, 4);
  // The world grows: new rank r takes old rank r mod 32, across replicas.
  const Plan grown = PlanAndCheck(ptc, Hsdp(4, 1, 8, 2, 4), Hsdp(4, 1, 16, 4, 4));
  EXPECT_EQ(grown.replicas.count, 1);
}

TEST(ReplicasTest, WhatMustNotSplitDoesNot) {
  const v1::Ptc ptc = Model(1);
  const v1::Layout from = Hsdp(4, 1, 8, 2, 4);
  const v1::Layout to = Hsdp(2, 1, 16, 4, 4);
  // A lost host: a replica's holders are gone, another replica's serve.
  EXPECT_FALSE(SplitReplicas(ptc, from, to, LostSet{{"h0"}, {}}).has_value());
  EXPECT_FALSE(SplitReplicas(ptc, from, to, LostSet{{}, {3}}).has_value());
  // FSDP (one replica) on either side.
  EXPECT_FALSE(SplitReplicas(ptc, Hsdp(4, 1, 8, 8, 4), to, {}).has_value());
  // Replicas share hosts: 3 replicas of 2 ranks, 3 ranks per host.
  EXPECT_FALSE(SplitReplicas(ptc, Hsdp(1, 1, 6, 2, 3), Hsdp(1, 1, 6, 2, 3, 2), {}).has_value());
  // Replica 1 keeps its hosts but swaps two devices.
  v1::Layout swapped = to;
  swapped.mutable_placement()->mutable_ranks(8)->set_device(1);
  swapped.mutable_placement()->mutable_ranks(9)->set_device(0);
  EXPECT_FALSE(SplitReplicas(ptc, from, swapped, {}).has_value());
  // Replica 1 alone moves to new hosts: it no longer mirrors replica 0.
  v1::Layout moved = to;
  for (int r = 8; r < 16; ++r) {
    moved.mutable_placement()->mutable_ranks(r)->set_host(r < 12 ? "h8" : "h9");
  }
  EXPECT_FALSE(SplitReplicas(ptc, from, moved, {}).has_value());
  // An expert tensor.
  v1::Ptc experts = ptc;
  SetExpert(AddTensor(&experts, "experts", {4, 8}), 0);
  EXPECT_FALSE(SplitReplicas(experts, from, to, {}).has_value());
  // Yet each of these still plans, exactly.
  PlanAndCheck(ptc, from, swapped);
  PlanAndCheck(ptc, from, moved);
  const Plan recovered = PlanAndCheck(ptc, from, Hsdp(2, 1, 16, 4, 4, 8), LostSet{{"h0"}, {}});
  EXPECT_EQ(recovered.replicas.count, 1);
}

TEST(ReplicasTest, ReplicasMovingToNewHostsSplitWithTheirHosts) {
  // Every replica moves to hosts of its own (h8..h15): still alike.
  const v1::Ptc ptc = Model(1);
  const Plan plan = PlanAndCheck(ptc, Hsdp(4, 1, 8, 2, 4), Hsdp(4, 1, 8, 2, 4, 8));
  EXPECT_EQ(plan.replicas.count, 4);
  EXPECT_EQ(plan.bytes_local, 0);
  ASSERT_EQ(plan.hosts.size(), 16u);
  for (int h = 0; h < 8; ++h) EXPECT_EQ(plan.hosts[h].bytes_in, 0);
  for (int h = 8; h < 16; ++h) EXPECT_GT(plan.hosts[h].bytes_in, 0);
}

TEST(ReplicasTest, TheLargestSplitWhoseReplicasHaveHostsOfTheirOwn) {
  // 4 replicas of 4 ranks, 8 ranks per host: pairs of replicas share a host,
  // so the job splits in 2.
  const v1::Ptc ptc = Model(1);
  const Plan plan = PlanAndCheck(ptc, Hsdp(2, 1, 8, 2, 8), Hsdp(1, 1, 16, 4, 8));
  EXPECT_EQ(plan.replicas.count, 2);
  EXPECT_EQ(plan.replicas.src_stride, 8);
}

TEST(ReplicasTest, ThePythonHsdpResizeSplits) {
  // tests/python/test_reshard_compare.py, test_hsdp_resizes, generation 4:
  // tp 2 dp 4 dp_shard 2 -> tp 1 cp 2 dp 4 dp_shard 2 on 4 hosts x 2.
  const v1::Ptc ptc = Model(1);
  v1::Layout to = test_support::HsdpLayout(1, 1, 4, 2, 2);
  to.mutable_config()->set_cp(2);
  test_support::Place(&to, 2);
  const Plan plan = PlanAndCheck(ptc, test_support::HsdpLayout(2, 1, 4, 2, 2), to);
  EXPECT_EQ(plan.replicas.count, 2);
  EXPECT_EQ(plan.replicas.src_stride, 4);
  EXPECT_EQ(plan.replicas.dst_stride, 4);
}

TEST(ReplicasTest, TheLargestCommonSplitIsTaken) {
  // 4 replicas -> 2 replicas: gcd 2, each new replica of 2 old ones.
  const v1::Ptc ptc = Model(1);
  const Plan plan = PlanAndCheck(ptc, Hsdp(4, 1, 8, 2, 4), Hsdp(2, 1, 16, 8, 4));
  EXPECT_EQ(plan.replicas.count, 2);
  EXPECT_EQ(plan.replicas.src_stride, 16);
  EXPECT_EQ(plan.replicas.dst_stride, 16);
}

// A random HSDP layout of `replicas` replicas (tp, cp, pp, the shard group
// and the rank order drawn), one slot per rank on hosts "<prefix><i>" of a
// per-host count that divides a replica's ranks in a stage, so that no host
// holds ranks of two replicas. With `like`: pp 1 and the ranks per replica
// and per host of `like` (a pp-1 layout), so that each replica keeps its
// hosts.
v1::Layout RandomReplicaLayout(verifier::testing::internal::Rng& rng, int replicas, int num_layers,
                               const std::string& prefix, const v1::Layout* like = nullptr) {
  using verifier::testing::internal::Pick;
  const int keep = like == nullptr ? 0
                                   : like->config().tp() * std::max(1, like->config().cp()) *
                                         like->config().dp_shard();
  int tp, cp, ds;
  do {
    tp = 1 << Pick(rng, 0, 1);
    cp = Pick(rng, 1, 2);
    ds = Pick(rng, 1, 3);
  } while (keep != 0 && tp * cp * ds != keep);
  const int pp = like != nullptr ? 1 : Pick(rng, 1, std::min(2, num_layers));
  const int block = tp * cp * ds;  // a replica's ranks in one stage
  int per_host;
  if (like != nullptr) {
    per_host = like->placement().ranks_size() > 1 ? 0 : 1;
    while (per_host < like->placement().ranks_size() &&
           like->placement().ranks(per_host).host() == like->placement().ranks(0).host()) {
      ++per_host;
    }
  } else {
    std::vector<int> divisors;
    for (int d = 1; d <= block; ++d) {
      if (block % d == 0) divisors.push_back(d);
    }
    per_host = divisors[Pick(rng, 0, static_cast<int>(divisors.size()) - 1)];
  }
  v1::Layout l;
  *l.mutable_config() = test_support::Config(tp, pp, ds * replicas);
  l.mutable_config()->set_cp(cp);
  l.mutable_config()->set_dp_shard(ds);
  l.mutable_config()->set_order(verifier::testing::internal::Coin(rng, 0.5)
                                    ? v1::RANK_ORDER_TP_DP_PP
                                    : v1::RANK_ORDER_TP_PP_DP);
  test_support::Place(&l, per_host);
  for (v1::DeviceSlot& slot : *l.mutable_placement()->mutable_ranks()) {
    slot.set_host(prefix + slot.host().substr(1));
  }
  return l;
}

TEST(ReplicasPropertyTest, RandomJobsWhoseReplicasPlanAloneAreExact) {
  // Random PTCs of the property tests (expert tensors left out: they never
  // split), between HSDP layouts of the same number of replicas: onto new
  // hosts, or onto the same hosts with a replica's ranks per stage kept. Each
  // plan is replayed and verified written out; most of them split.
  int planned = 0, split = 0, invalid = 0;
  for (uint64_t seed = 5000; seed < 5300; ++seed) {
    verifier::testing::internal::Rng rng(seed);
    v1::Ptc ptc = verifier::testing::internal::RandomPtc(rng);
    auto* tensors = ptc.mutable_tensors();
    tensors->erase(
        std::remove_if(tensors->begin(), tensors->end(),
                       [](const v1::TensorSpec& t) { return t.partition().has_expert(); }),
        tensors->end());
    const int replicas = verifier::testing::internal::Pick(rng, 2, 4);
    const v1::Layout from = RandomReplicaLayout(rng, replicas, ptc.num_layers(), "h");
    // The same hosts where the old layout has one stage, else new hosts.
    const bool same_hosts = from.config().pp() == 1 && verifier::testing::internal::Coin(rng, 0.5);
    const v1::Layout to = RandomReplicaLayout(rng, replicas, ptc.num_layers(),
                                              same_hosts ? "h" : "n", same_hosts ? &from : nullptr);
    SCOPED_TRACE(absl::StrCat("seed ", seed, "\nptc { ", ptc.ShortDebugString(), " }\nfrom { ",
                              from.ShortDebugString(), " }\nto { ", to.ShortDebugString(), " }"));
    absl::StatusOr<Plan> plan;
    if (testing::AgreeOnRefusal(ptc, from, to, {}, &plan) != testing::PlanOutcome::kPlanned) {
      ++invalid;
      continue;
    }
    ++planned;
    split += plan->replicas.count > 1;
    EXPECT_TRUE(testing::CheckPlan(ptc, from, to, {}, *plan));
    const absl::Status verified =
        verifier::VerifyPlan(ptc, from, to, {}, {}, ToProto(*plan, from, to));
    EXPECT_TRUE(verified.ok()) << verified;
    if (HasFailure()) break;
  }
  std::printf("planned %d (replicas planned alone %d), invalid %d\n", planned, split, invalid);
  EXPECT_GE(planned, 240);
  EXPECT_GE(split, planned / 2);
}

}  // namespace
}  // namespace reshard::planner
