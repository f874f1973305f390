// Recovery keeps what the job had (issue 34, item 5; docs/coordinator.md,
// "Recovery keeps the job's redundancy"), on both stores:
// - a rank that crashed on a live host restarts in place (the current
//   layout, its own device) and the plan takes its state from its own
//   agent's buffer (no byte crosses hosts); a lost host, or a host that is
//   not ALIVE, still refuses the device;
// - a recovery that gives up the job's HSDP replicas or its ability to
//   survive the loss of any one host is FAILED_PRECONDITION naming what is lost and the
//   layout that keeps it, with or without a target, and changes nothing;
//   the layout named is accepted as it is, and accept_degraded recovers
//   anyway, written to the audit trail.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "services/coordinator/store/audit.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using test_support::AddBlob;
using test_support::AddTensor;
using test_support::MakeLayout;
using test_support::SetDp;
using test_support::TwoLayerJob;

// HSDP 2 x 3: w (60x4, DP_CHUNK on rows) and an optimizer moment (DP_FLAT)
// sharded over dp_shard 3, a replicated step; tp 1, pp 1, dp 6 on h0..h2 x 2.
// Replica 0 is ranks 0-2 (h0:0 h0:1 h1:0), replica 1 ranks 3-5 (h1:1 h2:0
// h2:1): any one host's loss leaves a full copy.
v1::JobSpec HsdpJob(const std::string& name) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.set_tenant("team-a");
  v1::Ptc* ptc = spec.mutable_ptc();
  ptc->set_num_layers(1);
  SetDp(AddTensor(ptc, "w", {60, 4}), v1::DP_CHUNK, 0);
  SetDp(AddTensor(ptc, "optimizer.m", {60}), v1::DP_FLAT);
  AddBlob(ptc, "step", 8, v1::BLOB_REPLICATED);
  *spec.mutable_layout() = MakeLayout(1, 1, 6, {"h0", "h1", "h2"}, 2);
  spec.mutable_layout()->mutable_config()->set_dp_shard(3);
  return spec;
}

v1::RecoverFromFailureRequest Recover(const v1::Job& job, const std::vector<std::string>& hosts,
                                      const std::vector<int>& ranks) {
  v1::RecoverFromFailureRequest r;
  r.set_job_id(job.id());
  r.set_expected_generation(job.generation());
  for (const std::string& h : hosts) r.add_lost_hosts(h);
  for (int rank : ranks) r.add_lost_ranks(rank);
  return r;
}

class RecoveryKeepsTest : public LogicTest {};

TEST_P(RecoveryKeepsTest, CrashedRankRestartsInPlaceFromItsAgentsBuffer) {
  // tp 2, pp 2, dp 1 on h0, h1 x 2: one copy of everything, a per-rank blob.
  const v1::Job job = Register(TwoLayerJob("crashed"));
  v1::RecoverFromFailureRequest r = Recover(job, {}, {1});  // h0 device 1
  *r.mutable_target() = job.layout();
  // No agent registered h0: it is not ALIVE, so rank 1's device is refused.
  const std::string refused =
      "target.placement: rank 1 is on host \"h0\" device 1, the device of a lost rank (a rank "
      "restarts in place only on an ALIVE host that no lost_hosts name)";
  EXPECT_THAT(api_->RecoverFromFailure(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, refused));

  RegisterAgents({"h0", "h1"});
  // A lost host is never restarted in place.
  v1::RecoverFromFailureRequest with_host = r;
  with_host.add_lost_hosts("h0");
  EXPECT_THAT(api_->RecoverFromFailure(with_host).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "target.placement: rank 0 is on lost host \"h0\""));

  absl::StatusOr<v1::Operation> op = api_->RecoverFromFailure(r);
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(op->kind(), v1::OPERATION_KIND_RECOVER);
  EXPECT_TRUE(MessageDifferencer::Equals(op->target_layout(), job.layout()));
  Tick();
  const v1::Operation planned = Op(op->id());
  ASSERT_EQ(planned.state(), v1::OPERATION_STATE_TRANSFERRING) << planned.ShortDebugString();
  // Rank 1's bytes come from its own agent's buffer of generation 1 (and
  // every other rank's from its own): nothing crosses hosts, nothing is
  // regenerated.
  EXPECT_EQ(planned.stats().bytes_cross_host(), 0);
  EXPECT_EQ(planned.stats().bytes_zero_filled(), 0);
  EXPECT_GT(planned.stats().bytes_local(), 0);
  CompleteTask("h0", op->id());
  CompleteTask("h1", op->id());
  Tick();
  EXPECT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_COMMITTED);
  const v1::Job after = Job(job.id());
  EXPECT_EQ(after.generation(), 2);
  EXPECT_TRUE(MessageDifferencer::Equals(after.layout(), job.layout()));
}

TEST_P(RecoveryKeepsTest, LosingTheReplicasIsRefusedNamingTheLayoutThatKeepsThem) {
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Job job = Register(HsdpJob("hsdp"));
  const DatabaseSnapshot before = Snapshot();
  // The survivor policy: dp 4 on the four surviving devices, dp_shard 3
  // does not divide it, so plain FSDP: one copy of each shard.
  const std::string refusal =
      "job \"" + job.id() +
      "\": the recovery to tp 1 pp 1 dp 4 on h0:0 h0:1 h2:0 h2:1 loses its HSDP replicas (2 "
      "replicas of dp_shard 3 -> one copy at dp 4) and its ability to survive the loss of any "
      "one host (the current layout has it; with the target, losing host \"h0\" loses state no "
      "other host holds); a target that keeps it: tp 1 pp 1 dp 4 dp_shard 2 on h0:0 h0:1 h2:0 "
      "h2:1; set accept_degraded to recover anyway";
  v1::RecoverFromFailureRequest r = Recover(job, {"h1"}, {});
  absl::Status s = api_->RecoverFromFailure(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(), refusal);
  // The same layout named as the target: the same refusal.
  v1::Layout fsdp = MakeLayout(1, 1, 4, {"h0", "h2"}, 2);
  *r.mutable_target() = fsdp;
  s = api_->RecoverFromFailure(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(), refusal);
  EXPECT_TRUE(Snapshot() == before);

  // The layout the refusal names keeps both: accepted as it is.
  v1::Layout kept = fsdp;
  kept.mutable_config()->set_dp_shard(2);
  *r.mutable_target() = kept;
  absl::StatusOr<v1::Operation> op = api_->RecoverFromFailure(r);
  ASSERT_TRUE(op.ok()) << op.status();
  Tick();
  EXPECT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_TRANSFERRING);
}

TEST_P(RecoveryKeepsTest, AcceptDegradedRecoversAnywayAndIsAudited) {
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Job job = Register(HsdpJob("hsdp-accepted"));
  v1::RecoverFromFailureRequest r = Recover(job, {"h1"}, {});
  r.set_accept_degraded(true);
  AuditRecord audit;
  audit.method = "RecoverFromFailure";
  audit.identity = "scheduler";
  absl::StatusOr<v1::Operation> op;
  {
    AuditScope scope(&audit);
    op = api_->RecoverFromFailure(r);
  }
  ASSERT_TRUE(op.ok()) << op.status();
  // The survivor policy's layout: plain FSDP dp 4 on the survivors.
  EXPECT_EQ(op->target_layout().ShortDebugString(),
            "config { tp: 1 pp: 1 dp: 4 } placement { ranks { host: \"h0\" } ranks { host: "
            "\"h0\" device: 1 } ranks { host: \"h2\" } ranks { host: \"h2\" device: 1 } }");
  AuditQuery query;
  query.job_id = job.id();
  absl::StatusOr<AuditPage> page = store_->ListAudit(query);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->records.size(), 1u);
  EXPECT_EQ(page->records[0].method, "RecoverFromFailure");
  EXPECT_EQ(page->records[0].operation_id, op->id());
  EXPECT_EQ(page->records[0].message,
            "accept_degraded: the recovery to tp 1 pp 1 dp 4 on h0:0 h0:1 h2:0 h2:1 gives up its "
            "HSDP replicas (2 replicas of dp_shard 3 -> one copy at dp 4) and its ability to "
            "survive the loss of any one host (the current layout has it; with the target, "
            "losing host \"h0\" loses state no other host holds)");
}

TEST_P(RecoveryKeepsTest, ACrashedRankOfAnHsdpJobIsPointedToItsOwnDevice) {
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Job job = Register(HsdpJob("hsdp-crashed"));
  // Rank 2 (h1:0) crashed; h1 and its agent are alive. Without a target
  // the survivor policy would drop to plain FSDP dp 5: refused, naming the
  // current layout (in place) as the one that keeps everything.
  v1::RecoverFromFailureRequest r = Recover(job, {}, {2});
  absl::Status s = api_->RecoverFromFailure(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(),
            "job \"" + job.id() +
                "\": the recovery to tp 1 pp 1 dp 5 on h0:0 h0:1 h1:1 h2:0 h2:1 loses its HSDP "
                "replicas (2 replicas of dp_shard 3 -> one copy at dp 5) and its ability to "
                "survive the loss of any one host (the current layout has it; with the target, "
                "losing host \"h0\" loses state no other host holds); a target that keeps "
                "it: tp 1 pp 1 dp 6 dp_shard 3 on h0:0 h0:1 h1:0 h1:1 h2:0 h2:1; set "
                "accept_degraded to recover anyway");
  *r.mutable_target() = job.layout();
  absl::StatusOr<v1::Operation> op = api_->RecoverFromFailure(r);
  ASSERT_TRUE(op.ok()) << op.status();
  Tick();
  const v1::Operation planned = Op(op->id());
  ASSERT_EQ(planned.state(), v1::OPERATION_STATE_TRANSFERRING) << planned.ShortDebugString();
  EXPECT_EQ(planned.stats().bytes_cross_host(), 0);
}

RESHARD_LOGIC_ON_BOTH_STORES(RecoveryKeepsTest);

}  // namespace
}  // namespace reshard::coordinator::testing
