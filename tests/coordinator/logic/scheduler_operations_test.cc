// SchedulerApi against a real PostgreSQL, operations: Resize, Migrate and
// RecoverFromFailure with their checks (each failure with its code, a
// message naming the field, and the database unchanged), idempotent
// retries, PreviewPlan, CancelOperation and WatchOperation.
#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "services/coordinator/logic/ids.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using test_support::Config;
using test_support::HostsPlacement;
using test_support::MakeLayout;
using test_support::TwoLayerJob;
using test_support::TwoLayerPtc;

class SchedulerOperationsTest : public LogicTest {};

TEST_F(SchedulerOperationsTest, ResizeCreatesAPendingOperation) {
  const v1::Job job = Register(TwoLayerJob("grow"));
  const v1::Layout target = MakeLayout(2, 2, 2, {"h0", "h1", "h2", "h3"}, 2);
  absl::StatusOr<v1::Operation> op = ResizeTo(job, target);
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_TRUE(LooksLikeId(op->id()));
  EXPECT_EQ(op->job_id(), job.id());
  EXPECT_EQ(op->kind(), v1::OPERATION_KIND_RESIZE);
  EXPECT_EQ(op->state(), v1::OPERATION_STATE_PENDING);
  EXPECT_EQ(op->from_generation(), 1);
  EXPECT_TRUE(MessageDifferencer::Equals(op->target_layout(), target));
  const v1::Job now = Job(job.id());
  EXPECT_EQ(now.state(), v1::JOB_STATE_RECONFIGURING);
  EXPECT_EQ(now.active_operation_id(), op->id());
}

TEST_F(SchedulerOperationsTest, ResizeWithoutConfigKeepsTheCurrentOne) {
  const v1::Job job = Register(TwoLayerJob("move"));
  v1::ResizeRequest request;
  request.set_job_id(job.id());
  request.set_expected_generation(1);
  *request.mutable_placement() = HostsPlacement({"h4", "h5"}, 2);
  absl::StatusOr<v1::Operation> op = api_->Resize(request);
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_TRUE(MessageDifferencer::Equals(op->target_layout().config(), job.layout().config()));
}

TEST_F(SchedulerOperationsTest, ResizeRefusalsChangeNothing) {
  const v1::Job job = Register(TwoLayerJob("strict"));
  const DatabaseSnapshot before = Snapshot();
  v1::ResizeRequest good;
  good.set_job_id(job.id());
  good.set_expected_generation(1);
  *good.mutable_placement() = HostsPlacement({"h2", "h3"}, 2);

  v1::ResizeRequest r = good;
  r.clear_job_id();
  EXPECT_THAT(api_->Resize(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "job_id is empty"));
  r = good;
  r.clear_placement();
  EXPECT_THAT(api_->Resize(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "placement is required"));
  r = good;
  r.set_expected_generation(0);
  EXPECT_THAT(api_->Resize(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected_generation is 0"));
  r = good;
  *r.mutable_placement() = HostsPlacement({"h2", "h3", "h4"}, 2);
  EXPECT_THAT(api_->Resize(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "target.placement has 3 hosts"));
  r = good;
  *r.mutable_config() = Config(16, 1, 1);  // proj has 8 rows: tp ranks 8..15 get none
  *r.mutable_placement() = HostsPlacement({"h2"}, 16);
  EXPECT_THAT(api_->Resize(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "target.config.tp 16 leaves tp rank"));
  r = good;
  r.set_job_id(NewId());
  EXPECT_THAT(
      api_->Resize(r).status(),
      StatusIs(absl::StatusCode::kNotFound, absl::StrCat("job \"", r.job_id(), "\" not found")));
  r = good;
  r.set_expected_generation(2);
  EXPECT_THAT(
      api_->Resize(r).status(),
      StatusIs(absl::StatusCode::kAborted,
               absl::StrCat("job \"", job.id(), "\" is at generation 1, request expected 2")));
  EXPECT_TRUE(Snapshot() == before);
}

TEST_F(SchedulerOperationsTest, SecondOperationIsFailedPreconditionNamingTheFirst) {
  const v1::Job job = Register(TwoLayerJob("one-at-a-time"));
  absl::StatusOr<v1::Operation> first = ResizeTo(job, MakeLayout(2, 2, 1, {"h2", "h3"}, 2));
  ASSERT_TRUE(first.ok()) << first.status();
  const DatabaseSnapshot before = Snapshot();
  EXPECT_THAT(ResizeTo(job, MakeLayout(2, 2, 1, {"h4", "h5"}, 2)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       absl::StrCat("job \"", job.id(), "\" has active operation \"", first->id(),
                                    "\" (PENDING)")));
  EXPECT_TRUE(Snapshot() == before);
}

TEST_F(SchedulerOperationsTest, RetriedMutationReturnsTheFirstOperation) {
  const v1::Job job = Register(TwoLayerJob("retry-resize"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Layout target = MakeLayout(1, 2, 2, {"h1", "h2"}, 2);
  absl::StatusOr<v1::Operation> first = ResizeTo(job, target, "resize-key");
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<v1::Operation> again = ResizeTo(job, target, "resize-key");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->id(), first->id());

  // The first one's result as it is now: after it moved on, too.
  Tick();
  again = ResizeTo(job, target, "resize-key");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->id(), first->id());
  EXPECT_EQ(again->state(), v1::OPERATION_STATE_TRANSFERRING);

  // The same key on another request is refused.
  const DatabaseSnapshot before = Snapshot();
  EXPECT_EQ(ResizeTo(job, MakeLayout(2, 2, 1, {"h4", "h5"}, 2), "resize-key").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Snapshot() == before);
}

TEST_F(SchedulerOperationsTest, RetryAfterCommitStillReturnsTheFirstOperation) {
  const v1::Job job = Register(TwoLayerJob("retry-after-commit"));
  RegisterAgents({"h0", "h1", "h2"});
  // No config: the target borrows the current one, which a retry after the
  // commit must not re-judge against the new generation.
  v1::ResizeRequest request;
  request.set_job_id(job.id());
  request.set_expected_generation(1);
  *request.mutable_placement() = HostsPlacement({"h1", "h2"}, 2);
  request.set_idempotency_key("move-once");
  absl::StatusOr<v1::Operation> op = api_->Resize(request);
  ASSERT_TRUE(op.ok()) << op.status();
  Tick();
  for (const std::string& host : Participants(op->id())) CompleteTask(host, op->id());
  Tick();
  ASSERT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_COMMITTED);
  ASSERT_EQ(Job(job.id()).generation(), 2);

  absl::StatusOr<v1::Operation> again = api_->Resize(request);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->id(), op->id());
  EXPECT_EQ(again->state(), v1::OPERATION_STATE_COMMITTED);
  // Without the key the same request is stale.
  request.clear_idempotency_key();
  EXPECT_EQ(api_->Resize(request).status().code(), absl::StatusCode::kAborted);
}

TEST_F(SchedulerOperationsTest, MigrateKeepsTheConfig) {
  const v1::Job job = Register(TwoLayerJob("migrate"));
  v1::MigrateRequest request;
  request.set_job_id(job.id());
  request.set_expected_generation(1);
  *request.mutable_placement() = HostsPlacement({"h0", "h1", "h2"}, 2);
  const DatabaseSnapshot before = Snapshot();
  EXPECT_THAT(api_->Migrate(request).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "placement has 6 slots but the job's world size is 4"));
  request.clear_placement();
  EXPECT_THAT(api_->Migrate(request).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "placement is required"));
  EXPECT_TRUE(Snapshot() == before);

  *request.mutable_placement() = HostsPlacement({"h2", "h3"}, 2);
  absl::StatusOr<v1::Operation> op = api_->Migrate(request);
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(op->kind(), v1::OPERATION_KIND_MIGRATE);
  EXPECT_TRUE(MessageDifferencer::Equals(op->target_layout().config(), job.layout().config()));
}

TEST_F(SchedulerOperationsTest, RecoverFromFailureChecksTheLostSet) {
  const v1::Job job = Register(TwoLayerJob("recover"));
  v1::RecoverFromFailureRequest good;
  good.set_job_id(job.id());
  good.set_expected_generation(1);
  good.add_lost_hosts("h1");
  *good.mutable_target() = MakeLayout(2, 2, 1, {"h0", "h2"}, 2);
  const DatabaseSnapshot before = Snapshot();

  v1::RecoverFromFailureRequest r = good;
  r.clear_lost_hosts();
  EXPECT_THAT(
      api_->RecoverFromFailure(r).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "lost_hosts and lost_ranks are both empty"));
  r = good;
  r.set_lost_hosts(0, "h7");
  EXPECT_THAT(api_->RecoverFromFailure(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "host \"h7\" holds no rank"));
  r = good;
  *r.mutable_target() = MakeLayout(2, 2, 1, {"h1", "h2"}, 2);
  EXPECT_THAT(api_->RecoverFromFailure(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "on lost host \"h1\""));
  r = good;
  r.add_lost_ranks(4);
  EXPECT_THAT(api_->RecoverFromFailure(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "lost_ranks: rank 4 is out of range"));
  r = good;
  r.clear_target();  // the coordinator picks: 2 surviving devices, tp 2 x pp 2 does not fit
  EXPECT_THAT(api_->RecoverFromFailure(r).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "2 surviving devices cannot hold tp 2 x pp 2 = 4 ranks"));
  r.set_expected_generation(2);
  EXPECT_THAT(api_->RecoverFromFailure(r).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "expected_generation 2 is not the current generation 1"));
  r = good;
  r.mutable_target()->mutable_config()->set_pp(0);
  EXPECT_THAT(api_->RecoverFromFailure(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "target.config.pp is 0"));
  EXPECT_TRUE(Snapshot() == before);

  absl::StatusOr<v1::Operation> op = api_->RecoverFromFailure(good);
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(op->kind(), v1::OPERATION_KIND_RECOVER);
  EXPECT_EQ(op->state(), v1::OPERATION_STATE_PENDING);
}

// Without a target the coordinator applies the one survivor policy
// (planner/survivor.h): same config, dp shrunk to the surviving slots.
TEST_F(SchedulerOperationsTest, RecoverWithoutATargetKeepsTheConfigOnTheSurvivors) {
  v1::JobSpec spec = TwoLayerJob("recover-default");
  *spec.mutable_layout() = MakeLayout(2, 2, 2, {"h0", "h1", "h2", "h3"}, 2);
  const v1::Job job = Register(spec);
  v1::RecoverFromFailureRequest r;
  r.set_job_id(job.id());
  r.set_expected_generation(1);
  r.add_lost_hosts("h1");
  absl::StatusOr<v1::Operation> op = api_->RecoverFromFailure(r);
  ASSERT_TRUE(op.ok()) << op.status();
  const v1::Layout& t = op->target_layout();
  EXPECT_EQ(t.config().tp(), 2);
  EXPECT_EQ(t.config().pp(), 2);
  EXPECT_EQ(t.config().dp(), 1);
  ASSERT_EQ(t.placement().ranks_size(), 4);
  const char* hosts[] = {"h0", "h0", "h2", "h2"};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(t.placement().ranks(i).host(), hosts[i]) << i;
}

TEST_F(SchedulerOperationsTest, PreviewPlanReturnsThePlannersStatsAndStoresNothing) {
  const v1::Job job = Register(TwoLayerJob("preview"));
  const DatabaseSnapshot before = Snapshot();
  v1::PreviewPlanRequest request;
  request.set_job_id(job.id());
  *request.mutable_target() = MakeLayout(1, 2, 2, {"h1", "h2"}, 2);
  absl::StatusOr<v1::PreviewPlanResponse> preview = api_->PreviewPlan(request);
  ASSERT_TRUE(preview.ok()) << preview.status();
  absl::StatusOr<v1::TransferPlan> plan =
      planner::PlanTransfer(TwoLayerPtc(), job.layout(), request.target(), {});
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(MessageDifferencer::Equals(preview->stats(), plan->stats()));
  EXPECT_GT(preview->stats().bytes_cross_host(), 0);

  request.add_lost_hosts("h1");
  *request.mutable_target() = MakeLayout(2, 2, 1, {"h0", "h2"}, 2);
  EXPECT_THAT(api_->PreviewPlan(request).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "tensor \"layers.1.qkv\""));
  request.clear_lost_hosts();
  request.mutable_target()->mutable_config()->set_dp(3);
  EXPECT_THAT(api_->PreviewPlan(request).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "target.placement"));
  request.clear_target();
  EXPECT_THAT(api_->PreviewPlan(request).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "target is required"));
  EXPECT_TRUE(Snapshot() == before);
}

TEST_F(SchedulerOperationsTest, CancelAPendingOperation) {
  const v1::Job job = Register(TwoLayerJob("cancel"));
  absl::StatusOr<v1::Operation> op = ResizeTo(job, MakeLayout(2, 2, 1, {"h2", "h3"}, 2));
  ASSERT_TRUE(op.ok()) << op.status();
  v1::CancelOperationRequest request;
  request.set_operation_id(op->id());
  request.set_idempotency_key("cancel-1");
  absl::StatusOr<v1::Operation> cancelled = api_->CancelOperation(request);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_EQ(cancelled->error(), "cancelled by client");
  const v1::Job now = Job(job.id());
  EXPECT_EQ(now.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_EQ(now.generation(), 1);
  EXPECT_TRUE(now.active_operation_id().empty());
  EXPECT_EQ(MetricValue("reshard_coordinator_operations_total",
                        {{"kind", "resize"}, {"result", "aborted"}}),
            1);

  // A retry with its key gets the result; anyone else learns it is final.
  EXPECT_EQ(api_->CancelOperation(request)->id(), op->id());
  request.clear_idempotency_key();
  EXPECT_THAT(api_->CancelOperation(request).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "is already ABORTED"));
  request.set_operation_id(NewId());
  EXPECT_THAT(api_->CancelOperation(request).status(),
              StatusIs(absl::StatusCode::kNotFound, "operation \""));
  request.clear_operation_id();
  EXPECT_THAT(api_->CancelOperation(request).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "operation_id is empty"));

  // The driver leaves a cancelled operation alone; a new one may start.
  Tick();
  EXPECT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_TRUE(ResizeTo(job, MakeLayout(2, 2, 1, {"h2", "h3"}, 2)).ok());
}

TEST_F(SchedulerOperationsTest, CancelDuringTransferDiscardsTheNewGeneration) {
  const v1::Job job = Register(TwoLayerJob("cancel-transfer"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation op = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  v1::CancelOperationRequest request;
  request.set_operation_id(op.id());
  ASSERT_TRUE(api_->CancelOperation(request).ok());

  absl::StatusOr<v1::HeartbeatResponse> hb = Heartbeat("h2");
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_TRUE(hb->assigned_operations().empty());
  bool discarded = false;
  for (const v1::GenerationRef& ref : hb->discard()) {
    discarded |= ref.job_id() == job.id() && ref.generation() == op.to_generation();
  }
  EXPECT_TRUE(discarded) << hb->ShortDebugString();

  v1::ReportProgressRequest report;
  report.set_host_id("h2");
  report.set_operation_id(op.id());
  report.set_state(v1::HOST_TASK_STATE_RUNNING);
  absl::StatusOr<v1::ReportProgressResponse> reply = agents_->ReportProgress(report);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->abort());
  EXPECT_EQ(Job(job.id()).generation(), 1);
}

}  // namespace
}  // namespace reshard::coordinator::testing
