// The verifier must be able to fail: valid plans, mutated one way at a time,
// are rejected with a message that names what is wrong.
#include "verifier/verifier.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "tests/support/job_builders.h"

namespace reshard::verifier {
namespace {

using test_support::AddBlob;
using test_support::AddTensor;
using test_support::MakeLayout;
using test_support::SetDp;
using test_support::SetPipeline;
using test_support::SetTpSplit;

// A job with tp-split, dp-flat (padded) and blob items, moved from
// tp 2 x pp 2 x dp 2 on hosts a, b to tp 2 x dp 2 on a and the new host c.
struct Case {
  v1::Ptc ptc;
  v1::Layout from, to;
  std::vector<std::string> lost_hosts;
  std::vector<int> lost_ranks;
  v1::TransferPlan plan;

  absl::Status Verify() const { return VerifyPlan(ptc, from, to, lost_hosts, lost_ranks, plan); }
};

Case MixedCase() {
  Case c;
  c.ptc.set_num_layers(2);
  v1::TensorSpec* w0 = AddTensor(&c.ptc, "layers.0.w", {6, 4});
  SetTpSplit(w0, 0);
  SetPipeline(w0, v1::PIPELINE_LAYER, 0);
  v1::TensorSpec* w1 = AddTensor(&c.ptc, "layers.1.w", {5, 3});
  SetPipeline(w1, v1::PIPELINE_LAYER, 1);
  SetDp(w1, v1::DP_FLAT);
  AddBlob(&c.ptc, "step", 8, v1::BLOB_REPLICATED);
  c.from = MakeLayout(2, 2, 2, {"a", "b"}, 4);
  c.to = MakeLayout(2, 1, 2, {"a", "c"}, 2);
  absl::StatusOr<v1::TransferPlan> plan = planner::PlanTransfer(c.ptc, c.from, c.to, {});
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (plan.ok()) c.plan = *plan;
  return c;
}

// "w" replicated over dp 2 on a:0 and b:0, kept in place or moved to c.
Case ReplicaCase(const std::vector<std::string>& to_hosts, std::vector<int> lost_ranks) {
  Case c;
  c.ptc.set_num_layers(1);
  AddTensor(&c.ptc, "w", {4, 4});
  c.from = MakeLayout(1, 1, 2, {"a", "b"}, 1);
  c.to = MakeLayout(1, 1, static_cast<int>(to_hosts.size()), to_hosts, 1);
  c.lost_ranks = std::move(lost_ranks);
  planner::LostSet lost;
  lost.ranks = c.lost_ranks;
  absl::StatusOr<v1::TransferPlan> plan = planner::PlanTransfer(c.ptc, c.from, c.to, lost);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (plan.ok()) c.plan = *plan;
  return c;
}

void ExpectRejected(const Case& c, const std::string& needle) {
  const absl::Status s = c.Verify();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(std::string(s.message()).find(needle), std::string::npos)
      << "wanted \"" << needle << "\" in: " << s.message();
}

int FindStep(const v1::TransferPlan& plan, int item, bool cross, int min_dsts = 1) {
  for (int i = 0; i < plan.steps_size(); ++i) {
    const auto& s = plan.steps(i);
    if (s.item() == item && s.cross_host() == cross && s.dsts_size() >= min_dsts) return i;
  }
  return -1;
}

TEST(VerifierTest, AcceptsHandWrittenPlan) {
  // "w" [2, 3] fp32 from a:0 to a:0 and b:0; the second copy walks the
  // region column by column (shape [3, 2], strides [1, 3]).
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  AddTensor(&ptc, "w", {2, 3});
  const v1::Layout from = MakeLayout(1, 1, 1, {"a"}, 1);
  const v1::Layout to = MakeLayout(1, 1, 2, {"a", "b"}, 1);
  v1::TransferPlan plan;
  *plan.mutable_source_layout() = from;
  *plan.mutable_target_layout() = to;
  auto* item = plan.add_items();
  item->set_name("w");
  item->set_element_bytes(4);
  for (int r = 0; r < 2; ++r) {
    v1::CopyStep* s = plan.add_steps();
    s->set_src_rank(0);
    v1::Destination* d = s->add_dsts();
    d->set_rank(r);
    const std::vector<int64_t> shape =
        r == 0 ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{3, 2};
    const std::vector<int64_t> strides =
        r == 0 ? std::vector<int64_t>{3, 1} : std::vector<int64_t>{1, 3};
    for (int k = 0; k < 2; ++k) {
      s->add_shape(shape[k]);
      s->mutable_src()->add_strides(strides[k]);
      d->mutable_region()->add_strides(strides[k]);
    }
    s->set_bytes(24);
    s->set_cross_host(r == 1);
  }
  v1::PlanStats* st = plan.mutable_stats();
  st->set_bytes_local(24);
  st->set_bytes_cross_host(24);
  st->set_lower_bound_cross_host(24);
  st->set_steps(2);
  st->set_cross_host_steps(1);
  auto* a = st->add_hosts();
  a->set_host("a");
  a->set_bytes_out(24);
  a->set_bytes_local(24);
  auto* b = st->add_hosts();
  b->set_host("b");
  b->set_bytes_in(24);
  EXPECT_TRUE(VerifyPlan(ptc, from, to, {}, {}, plan).ok())
      << VerifyPlan(ptc, from, to, {}, {}, plan);

  plan.mutable_steps(1)->mutable_dsts(0)->mutable_region()->set_strides(0, 3);  // not a transpose
  EXPECT_FALSE(VerifyPlan(ptc, from, to, {}, {}, plan).ok());
}

TEST(VerifierTest, PlannedCasesVerify) {
  EXPECT_TRUE(MixedCase().Verify().ok()) << MixedCase().Verify();
  EXPECT_TRUE(ReplicaCase({"c"}, {1}).Verify().ok()) << ReplicaCase({"c"}, {1}).Verify();
  EXPECT_TRUE(ReplicaCase({"a", "b"}, {}).Verify().ok()) << ReplicaCase({"a", "b"}, {}).Verify();
}

TEST(VerifierTest, DroppedStep) {
  Case c = MixedCase();
  ASSERT_GT(c.plan.steps_size(), 0);
  c.plan.mutable_steps()->RemoveLast();
  ExpectRejected(c, "never written");
}

TEST(VerifierTest, DuplicatedDestination) {
  Case c = MixedCase();
  ASSERT_GT(c.plan.steps_size(), 0);
  v1::CopyStep* s = c.plan.mutable_steps(0);
  *s->add_dsts() = s->dsts(0);
  ExpectRejected(c, "a second time");
}

TEST(VerifierTest, SourceThatDoesNotHoldTheElement) {
  // Old ranks r and r ^ 1 hold different tp rows of layers.0.w at the same
  // offsets on the same host: reading the other one copies the wrong rows.
  Case c = MixedCase();
  const int i = FindStep(c.plan, 0, false);
  ASSERT_GE(i, 0);
  c.plan.mutable_steps(i)->set_src_rank(c.plan.steps(i).src_rank() ^ 1);
  ExpectRejected(c, "expected element");
}

TEST(VerifierTest, ShiftedSourceOffset) {
  Case c = MixedCase();
  const int i = FindStep(c.plan, 0, false);
  ASSERT_GE(i, 0);
  c.plan.mutable_steps(i)->mutable_src()->set_offset(c.plan.steps(i).src().offset() + 1);
  EXPECT_EQ(c.Verify().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(VerifierTest, CorruptedStats) {
  const Case base = MixedCase();
  ASSERT_GT(base.plan.stats().bytes_cross_host(), 0);
  const struct {
    const char* field;
    void (*mutate)(v1::PlanStats*);
  } kMutations[] = {
      {"bytes_local", [](v1::PlanStats* s) { s->set_bytes_local(s->bytes_local() + 4); }},
      {"bytes_cross_host",
       [](v1::PlanStats* s) { s->set_bytes_cross_host(s->bytes_cross_host() - 4); }},
      {"lower_bound_cross_host",
       [](v1::PlanStats* s) { s->set_lower_bound_cross_host(s->lower_bound_cross_host() + 4); }},
      {"bytes_zero_filled",
       [](v1::PlanStats* s) { s->set_bytes_zero_filled(s->bytes_zero_filled() + 4); }},
      {"steps", [](v1::PlanStats* s) { s->set_steps(s->steps() + 1); }},
      {"cross_host_steps", [](v1::PlanStats* s) { s->set_cross_host_steps(0); }},
      {"zero_fills", [](v1::PlanStats* s) { s->set_zero_fills(s->zero_fills() + 1); }},
      {"stats.hosts", [](v1::PlanStats* s) { s->mutable_hosts(0)->set_bytes_in(12345); }},
      {"stats.hosts", [](v1::PlanStats* s) { *s->add_hosts() = s->hosts(0); }},
  };
  for (const auto& m : kMutations) {
    Case c = base;
    m.mutate(c.plan.mutable_stats());
    SCOPED_TRACE(m.field);
    ExpectRejected(c, m.field);
  }
}

TEST(VerifierTest, CrossHostDestinationsSpanTwoHosts) {
  // The blob crosses to host c once for new ranks 2 and 3; send one copy to
  // new rank 0 on host a instead.
  Case c = MixedCase();
  const int i = FindStep(c.plan, 2, true, 2);
  ASSERT_GE(i, 0);
  c.plan.mutable_steps(i)->mutable_dsts(1)->set_rank(0);
  ExpectRejected(c, "span hosts");
}

TEST(VerifierTest, LostRankAsSource) {
  // Old rank 1 is lost; its replica, old rank 0, holds the same bytes at the
  // same offsets, so only the lost-rank rule catches the switch.
  Case c = ReplicaCase({"c"}, {1});
  ASSERT_GT(c.plan.steps_size(), 0);
  c.plan.mutable_steps(0)->set_src_rank(1);
  ExpectRejected(c, "lost");
}

TEST(VerifierTest, RemoteReplicaWhenOneIsOnTheDevice) {
  // Identity over two hosts: new rank 1 reading old rank 0 (another host)
  // instead of old rank 1 on its own device breaks rule 2.
  Case c = ReplicaCase({"a", "b"}, {});
  for (auto& s : *c.plan.mutable_steps()) {
    if (s.dsts(0).rank() == 1) {
      s.set_src_rank(0);
      s.set_cross_host(true);
    }
  }
  ExpectRejected(c, "own device");
}

TEST(VerifierTest, WrongStepBytesOrCrossHostFlag) {
  Case c = MixedCase();
  c.plan.mutable_steps(0)->set_bytes(c.plan.steps(0).bytes() + 4);
  ExpectRejected(c, "bytes");
  c = MixedCase();
  c.plan.mutable_steps(0)->set_cross_host(!c.plan.steps(0).cross_host());
  ExpectRejected(c, "cross_host");
}

TEST(VerifierTest, ZeroFillsDroppedOrOverData) {
  Case c = MixedCase();
  ASSERT_GT(c.plan.zero_fills_size(), 0);
  c.plan.mutable_zero_fills()->RemoveLast();
  ExpectRejected(c, "never written");
  c = MixedCase();
  v1::ZeroFill* z = c.plan.mutable_zero_fills(0);
  ASSERT_GT(z->offset(), 0);
  z->set_offset(z->offset() - 1);
  z->set_count(z->count() + 1);
  ExpectRejected(c, "a second time");
}

TEST(VerifierTest, WrongItemsOrLostRanks) {
  Case c = MixedCase();
  c.plan.mutable_items(0)->set_element_bytes(2);
  ExpectRejected(c, "element_bytes");
  c = MixedCase();
  c.plan.add_lost_ranks(3);
  ExpectRejected(c, "lost_ranks");
}

TEST(VerifierTest, RefusesInvalidOrHugeInputs) {
  v1::Ptc ptc;
  ptc.set_num_layers(1);
  AddTensor(&ptc, "huge", {20000, 20000});
  const v1::Layout l = MakeLayout(1, 1, 1, {"a"}, 1);
  EXPECT_EQ(VerifyPlan(ptc, l, l, {}, {}, {}).code(), absl::StatusCode::kInvalidArgument);

  Case c = ReplicaCase({"a", "b"}, {});
  EXPECT_EQ(VerifyPlan(c.ptc, c.from, c.to, {"b"}, {}, c.plan).code(),
            absl::StatusCode::kInvalidArgument);  // the target uses a lost host
  EXPECT_EQ(VerifyPlan(c.ptc, c.from, c.to, {}, {7}, c.plan).code(),
            absl::StatusCode::kInvalidArgument);  // no old rank 7
}

}  // namespace
}  // namespace reshard::verifier
