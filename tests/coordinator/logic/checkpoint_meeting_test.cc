// A checkpoint and an operation that meet (docs/coordinator.md, "Checkpoints
// and operations"), against a real PostgreSQL with the agents played through
// AgentApi: a reconfiguration requested while a checkpoint is in flight is
// queued and starts by itself when the checkpoint ends (from its generation
// when it committed), also across a driver restart; a recovery aborts the
// checkpoint instead of waiting behind it; a checkpoint while a stop-free
// operation is active is folded into its cut-over; a stop-the-world resize
// at_step_boundary waits for a checkpoint naming it, or for its deadline.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/logic/stop_free_fixture.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::MakeLayout;
using test_support::ReplicatedTwoLayerJob;

class CheckpointMeetingTest : public StopFreeTest {
 protected:
  absl::StatusOr<v1::Operation> BoundaryResize(const v1::Job& job, const v1::Layout& target,
                                               int64_t timeout_ms = 0) {
    v1::ResizeRequest r;
    r.set_job_id(job.id());
    r.set_expected_generation(Job(job.id()).generation());
    *r.mutable_placement() = target.placement();
    *r.mutable_config() = target.config();
    r.set_at_step_boundary(true);
    r.set_step_boundary_timeout_ms(timeout_ms);
    return api_->Resize(r);
  }

  size_t OperationCount(const std::string& job_id) {
    absl::StatusOr<std::vector<v1::Operation>> ops = store_->ListOperationsForJob(job_id);
    EXPECT_TRUE(ops.ok()) << ops.status();
    return ops.ok() ? ops->size() : 0;
  }

  /// A checkpoint of `step` in TRANSFERRING (its publish tasks out).
  v1::Operation CheckpointInFlight(const v1::Job& job, int64_t step) {
    absl::StatusOr<v1::Operation> cp = CheckpointAt(job, step, "");
    EXPECT_TRUE(cp.ok()) << cp.status();
    if (!cp.ok()) return v1::Operation();
    Tick();
    EXPECT_EQ(Op(cp->id()).state(), v1::OPERATION_STATE_TRANSFERRING) << Op(cp->id()).error();
    return Op(cp->id());
  }
};

TEST_P(CheckpointMeetingTest, AResizeDuringACheckpointIsQueuedAndMovesTheCheckpointedState) {
  const v1::Job job = RegisterWithData("queued");
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation cp = CheckpointInFlight(job, 3);

  // Accepted, not refused: PENDING behind the checkpoint, numbers open.
  absl::StatusOr<v1::Operation> resize = ResizeTo(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(resize.ok()) << resize.status();
  EXPECT_EQ(resize->state(), v1::OPERATION_STATE_PENDING);
  EXPECT_EQ(resize->queued_behind_operation_id(), cp.id());
  EXPECT_EQ(resize->from_generation(), 1);
  EXPECT_EQ(resize->to_generation(), 0);
  EXPECT_EQ(Job(job.id()).active_operation_id(), cp.id());
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_RECONFIGURING);
  // One reconfiguration at a time still: a second one is refused, naming
  // the checkpoint it would meet first.
  EXPECT_THAT(ResizeTo(job, MakeLayout(2, 2, 1, {"h1", "h2"}, 2)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       absl::StrCat("has active operation \"", cp.id(), "\"")));
  // The checkpoint's next step waits for this one.
  EXPECT_THAT(CheckpointAt(job, 4, "").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "one checkpoint at a time"));

  // It waits while the checkpoint runs.
  Tick();
  EXPECT_EQ(Op(resize->id()).state(), v1::OPERATION_STATE_PENDING);
  EXPECT_EQ(Op(resize->id()).queued_behind_operation_id(), cp.id());

  // The checkpoint commits generation 2; the resize starts by itself from it.
  CompleteAll(cp.id());
  Tick();
  EXPECT_EQ(Op(cp.id()).state(), v1::OPERATION_STATE_COMMITTED);
  v1::Operation op = Op(resize->id());
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_TRANSFERRING) << op.error();
  EXPECT_EQ(op.queued_behind_operation_id(), "");
  EXPECT_EQ(op.from_generation(), 2);
  EXPECT_EQ(op.to_generation(), 3);
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_RECONFIGURING);
  CompleteAll(op.id());
  Tick();
  ASSERT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_COMMITTED) << Op(op.id()).error();
  const v1::Job done = Job(job.id());
  EXPECT_EQ(done.generation(), 3);
  EXPECT_EQ(done.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_EQ(done.dataset_state().step(), 3);  // the checkpoint's step travelled
  EXPECT_EQ(done.layout().config().dp(), 2);
}

TEST_P(CheckpointMeetingTest, AQueuedResizeSurvivesADriverRestart) {
  const v1::Job job = RegisterWithData("queued-restart");
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation cp = CheckpointInFlight(job, 3);
  absl::StatusOr<v1::Operation> resize = ResizeTo(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(resize.ok()) << resize.status();

  // A new replica (its own store connection, nothing in memory) leads.
  driver_ = MakeDriver(ConnectStore());
  ASSERT_TRUE(driver_->ResumeAll().ok());
  EXPECT_EQ(Op(resize->id()).queued_behind_operation_id(), cp.id());
  CompleteAll(cp.id());
  Tick();
  v1::Operation op = Op(resize->id());
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_TRANSFERRING) << op.error();
  EXPECT_EQ(op.from_generation(), 2);
  CompleteAll(op.id());
  Tick();
  EXPECT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_COMMITTED);
  EXPECT_EQ(Job(job.id()).generation(), 3);
}

TEST_P(CheckpointMeetingTest, ACheckpointThatEndsOtherwiseReleasesTheResizeFromTheLastCommit) {
  const v1::Job job = RegisterWithData("queued-abort");
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation cp = CheckpointInFlight(job, 3);
  absl::StatusOr<v1::Operation> resize = ResizeTo(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(resize.ok()) << resize.status();
  v1::CancelOperationRequest cancel;
  cancel.set_operation_id(cp.id());
  ASSERT_TRUE(api_->CancelOperation(cancel).ok());
  // Still RECONFIGURING: the resize is active.
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_RECONFIGURING);
  Tick();
  const v1::Operation op = Op(resize->id());
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_TRANSFERRING) << op.error();
  EXPECT_EQ(op.from_generation(), 1);
  // Generation 2 was the checkpoint's (DISCARDED, never handed out again).
  EXPECT_EQ(op.to_generation(), 3);
  CompleteAll(op.id());
  Tick();
  EXPECT_EQ(Job(job.id()).generation(), 3);
  EXPECT_EQ(Job(job.id()).dataset_state().step(), 0);
}

TEST_P(CheckpointMeetingTest, CancellingTheQueuedResizeLeavesTheCheckpointAlone) {
  const v1::Job job = RegisterWithData("queued-cancel");
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation cp = CheckpointInFlight(job, 3);
  absl::StatusOr<v1::Operation> resize = ResizeTo(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(resize.ok()) << resize.status();
  v1::CancelOperationRequest cancel;
  cancel.set_operation_id(resize->id());
  ASSERT_TRUE(api_->CancelOperation(cancel).ok());
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_RECONFIGURING);  // the checkpoint runs
  CompleteAll(cp.id());
  Tick();
  EXPECT_EQ(Op(cp.id()).state(), v1::OPERATION_STATE_COMMITTED);
  EXPECT_EQ(Job(job.id()).generation(), 2);
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_ACTIVE);
}

TEST_P(CheckpointMeetingTest, ARecoveryAbortsTheCheckpointInsteadOfWaitingBehindIt) {
  // Every item on both hosts: losing h1 loses nothing.
  const v1::Job job = Register(ReplicatedTwoLayerJob("recover"));
  RegisterAgents({"h0", "h1", "h2"});
  v1::CheckpointRequest checkpoint;
  checkpoint.set_job_id(job.id());
  checkpoint.set_expected_generation(1);
  absl::StatusOr<v1::Operation> started = api_->Checkpoint(checkpoint);
  ASSERT_TRUE(started.ok()) << started.status();
  Tick();
  const v1::Operation cp = Op(started->id());
  ASSERT_EQ(cp.state(), v1::OPERATION_STATE_TRANSFERRING) << cp.error();
  v1::RecoverFromFailureRequest r;
  r.set_job_id(job.id());
  r.set_expected_generation(1);
  r.add_lost_hosts("h1");
  // h0 alone cannot survive another host's loss: accepted (docs/coordinator.md,
  // "Recovery keeps the job's redundancy").
  r.set_accept_degraded(true);
  absl::StatusOr<v1::Operation> recover = api_->RecoverFromFailure(r);
  ASSERT_TRUE(recover.ok()) << recover.status();
  EXPECT_EQ(recover->queued_behind_operation_id(), "");
  EXPECT_EQ(recover->from_generation(), 1);
  const v1::Operation aborted = Op(cp.id());
  EXPECT_EQ(aborted.state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_EQ(aborted.error(),
            absl::StrCat("aborted: recovery \"", recover->id(),
                         "\" replaced it (lost host \"h1\"); a checkpoint needs every rank of its "
                         "generation"));
  // Its generation is discarded on every host.
  absl::StatusOr<v1::HeartbeatResponse> beat = Heartbeat("h0");
  ASSERT_TRUE(beat.ok()) << beat.status();
  bool discarded = false;
  for (const v1::GenerationRef& g : beat->discard()) {
    discarded |= g.job_id() == job.id() && g.generation() == cp.to_generation();
  }
  EXPECT_TRUE(discarded);
  Tick();
  EXPECT_EQ(Op(recover->id()).state(), v1::OPERATION_STATE_TRANSFERRING)
      << Op(recover->id()).error();
}

TEST_P(CheckpointMeetingTest, ACheckpointDuringAStopFreeOperationIsFoldedIntoItsCutOver) {
  const v1::Job job = RegisterWithData("folded");
  RegisterAgents({"h0", "h1", "h2"});
  absl::StatusOr<v1::Operation> sf = StopFreeResize(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(sf.ok()) << sf.status();
  // Folded while it is PENDING, and while its agents prepare.
  for (int pass = 0; pass < 2; ++pass) {
    const size_t ops = OperationCount(job.id());
    absl::StatusOr<v1::Operation> folded = CheckpointAt(job, 3, "");
    ASSERT_TRUE(folded.ok()) << folded.status();
    EXPECT_TRUE(folded->checkpoint_folded());
    EXPECT_EQ(folded->id(), sf->id());
    EXPECT_EQ(OperationCount(job.id()), ops);  // nothing created
    EXPECT_EQ(Job(job.id()).generation(), 1);
    EXPECT_FALSE(Op(sf->id()).checkpoint_folded());  // only in the answer
    Tick();
  }
  EXPECT_EQ(Op(sf->id()).state(), v1::OPERATION_STATE_PLANNED);
  // Naming it is the cut-over, as before.
  PrepareAll(sf->id());
  ASSERT_TRUE(MarkPrepared(sf->id()).ok());
  absl::StatusOr<v1::Operation> cut = CheckpointAt(job, 3, sf->id());
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_FALSE(cut->checkpoint_folded());
  EXPECT_EQ(cut->kind(), v1::OPERATION_KIND_CHECKPOINT);
  // After the cut-over a checkpoint still folds (the old layout is retiring).
  absl::StatusOr<v1::Operation> late = CheckpointAt(job, 4, "");
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_TRUE(late->checkpoint_folded());
  EXPECT_EQ(late->id(), sf->id());
}

TEST_P(CheckpointMeetingTest, AResizeAtTheStepBoundaryPlansFromTheCheckpointNamingIt) {
  const v1::Job job = RegisterWithData("boundary");
  RegisterAgents({"h0", "h1", "h2"});
  absl::StatusOr<v1::Operation> r = BoundaryResize(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step_boundary(), v1::STEP_BOUNDARY_WAITING);
  EXPECT_EQ(r->step_boundary_deadline_unix_ms(), clock_.NowUnixMs() + 120000);
  EXPECT_EQ(Job(job.id()).step_boundary_operation_id(), r->id());
  Tick();
  EXPECT_EQ(Op(r->id()).state(), v1::OPERATION_STATE_PENDING);  // waits

  // The loop's periodic checkpoint folds into it.
  absl::StatusOr<v1::Operation> periodic = CheckpointAt(job, 2, "");
  ASSERT_TRUE(periodic.ok()) << periodic.status();
  EXPECT_TRUE(periodic->checkpoint_folded());
  EXPECT_EQ(periodic->id(), r->id());

  // The boundary: a checkpoint naming it (no dataset step needed).
  v1::CheckpointRequest at;
  at.set_job_id(job.id());
  at.set_expected_generation(1);
  at.set_cut_over_operation_id(r->id());
  absl::StatusOr<v1::Operation> cp = api_->Checkpoint(at);
  ASSERT_TRUE(cp.ok()) << cp.status();
  EXPECT_EQ(cp->kind(), v1::OPERATION_KIND_CHECKPOINT);
  EXPECT_EQ(cp->to_generation(), 2);
  v1::Operation op = Op(r->id());
  EXPECT_TRUE(op.at_step_boundary());
  EXPECT_EQ(op.step_boundary(), v1::STEP_BOUNDARY_CHECKPOINTING);
  EXPECT_EQ(op.step_boundary_checkpoint_id(), cp->id());
  EXPECT_EQ(op.queued_behind_operation_id(), cp->id());
  EXPECT_EQ(op.cutover_operation_id(), cp->id());  // its cut-over, as a stop-free one's
  EXPECT_GT(op.cutover_unix_ms(), 0);
  EXPECT_EQ(Job(job.id()).step_boundary_operation_id(), "");
  EXPECT_THAT(api_->Checkpoint(at).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "was created already"));

  Tick();
  CompleteAll(cp->id());
  Tick();  // commits the checkpoint (created after the operation, so advanced after it)
  Tick();  // releases and plans the operation
  op = Op(r->id());
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_TRANSFERRING) << op.error();
  EXPECT_EQ(op.step_boundary(), v1::STEP_BOUNDARY_REACHED);
  EXPECT_EQ(op.from_generation(), 2);
  CompleteAll(op.id());
  Tick();
  EXPECT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_COMMITTED);
  EXPECT_GE(Op(op.id()).pause_seconds(), 0);
  EXPECT_EQ(Job(job.id()).generation(), 3);
}

TEST_P(CheckpointMeetingTest, TheBoundaryIsOpenAsSoonAsTheCheckpointAheadEnded) {
  const v1::Job job = RegisterWithData("boundary-after-abort");
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation cp = CheckpointInFlight(job, 3);
  absl::StatusOr<v1::Operation> r = BoundaryResize(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(r.ok()) << r.status();
  v1::CancelOperationRequest cancel;
  cancel.set_operation_id(cp.id());
  ASSERT_TRUE(api_->CancelOperation(cancel).ok());
  // Not released by the driver yet, but nothing is ahead of it any more.
  EXPECT_EQ(Op(r->id()).queued_behind_operation_id(), cp.id());
  EXPECT_EQ(Job(job.id()).step_boundary_operation_id(), r->id());
  absl::StatusOr<v1::Operation> boundary = CheckpointAt(job, 3, r->id());
  ASSERT_TRUE(boundary.ok()) << boundary.status();
  EXPECT_EQ(boundary->to_generation(), 3);  // 2 was the cancelled checkpoint's
  EXPECT_EQ(Op(r->id()).queued_behind_operation_id(), boundary->id());
  Tick();
  CompleteAll(boundary->id());
  Tick();
  Tick();
  const v1::Operation op = Op(r->id());
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_TRANSFERRING) << op.error();
  EXPECT_EQ(op.step_boundary(), v1::STEP_BOUNDARY_REACHED);
  EXPECT_EQ(op.from_generation(), 3);
  EXPECT_EQ(op.to_generation(), 4);
}

TEST_P(CheckpointMeetingTest, WithoutACheckpointByTheDeadlineItPlansFromTheLastCommit) {
  const v1::Job job = RegisterWithData("boundary-timeout");
  RegisterAgents({"h0", "h1", "h2"});
  absl::StatusOr<v1::Operation> r =
      BoundaryResize(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2), /*timeout_ms=*/5000);
  ASSERT_TRUE(r.ok()) << r.status();
  clock_.Advance(4999);
  Tick();
  EXPECT_EQ(Op(r->id()).step_boundary(), v1::STEP_BOUNDARY_WAITING);
  // A new leader keeps the deadline (it is in the row).
  driver_ = MakeDriver(ConnectStore());
  ASSERT_TRUE(driver_->ResumeAll().ok());
  EXPECT_EQ(Op(r->id()).state(), v1::OPERATION_STATE_PENDING);
  clock_.Advance(1);
  Tick();
  const v1::Operation op = Op(r->id());
  EXPECT_EQ(op.step_boundary(), v1::STEP_BOUNDARY_TIMED_OUT);
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_TRANSFERRING) << op.error();
  EXPECT_EQ(op.from_generation(), 1);
  EXPECT_EQ(Job(job.id()).step_boundary_operation_id(), "");
  // Too late to name it.
  EXPECT_THAT(CheckpointAt(job, 3, r->id()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "it no longer waits for a step boundary (TIMED_OUT, TRANSFERRING)"));
}

TEST_P(CheckpointMeetingTest, AtStepBoundaryRefusals) {
  const v1::Job job = RegisterWithData("boundary-refusals");
  RegisterAgents({"h0", "h1", "h2"});
  v1::ResizeRequest r;
  r.set_job_id(job.id());
  r.set_expected_generation(1);
  *r.mutable_placement() = MakeLayout(1, 2, 2, {"h1", "h2"}, 2).placement();
  *r.mutable_config() = MakeLayout(1, 2, 2, {"h1", "h2"}, 2).config();
  r.set_at_step_boundary(true);
  r.set_stop_free(true);
  EXPECT_THAT(api_->Resize(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "at_step_boundary and stop_free"));
  r.set_stop_free(false);
  r.set_step_boundary_timeout_ms(-1);
  EXPECT_THAT(api_->Resize(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "step_boundary_timeout_ms is -1"));
  r.set_at_step_boundary(false);
  r.set_step_boundary_timeout_ms(1000);
  EXPECT_THAT(api_->Resize(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "step_boundary_timeout_ms needs at_step_boundary"));
  EXPECT_EQ(OperationCount(job.id()), 0u);
}

TEST_P(CheckpointMeetingTest, AResizeAtTheBoundaryDuringACheckpointWaitsForItThenForItsBoundary) {
  const v1::Job job = RegisterWithData("boundary-queued");
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation cp = CheckpointInFlight(job, 3);
  absl::StatusOr<v1::Operation> r =
      BoundaryResize(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2), /*timeout_ms=*/5000);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->queued_behind_operation_id(), cp.id());
  EXPECT_EQ(r->step_boundary(), v1::STEP_BOUNDARY_WAITING);
  EXPECT_EQ(r->step_boundary_deadline_unix_ms(), 0);  // not yet: it is queued
  EXPECT_EQ(Job(job.id()).step_boundary_operation_id(), "");
  EXPECT_THAT(CheckpointAt(job, 4, r->id()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "is queued behind checkpoint"));
  clock_.Advance(10000);  // a queued operation's wait has not started
  CompleteAll(cp.id());
  Tick();
  v1::Operation op = Op(r->id());
  EXPECT_EQ(op.state(), v1::OPERATION_STATE_PENDING);
  EXPECT_EQ(op.step_boundary(), v1::STEP_BOUNDARY_WAITING);
  EXPECT_EQ(op.step_boundary_deadline_unix_ms(), clock_.NowUnixMs() + 5000);
  EXPECT_EQ(op.from_generation(), 2);
  EXPECT_EQ(Job(job.id()).step_boundary_operation_id(), r->id());
  absl::StatusOr<v1::Operation> boundary = CheckpointAt(job, 4, r->id());
  ASSERT_TRUE(boundary.ok()) << boundary.status();
  Tick();
  CompleteAll(boundary->id());
  Tick();
  Tick();
  op = Op(r->id());
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_TRANSFERRING) << op.error();
  EXPECT_EQ(op.step_boundary(), v1::STEP_BOUNDARY_REACHED);
  EXPECT_EQ(op.from_generation(), 3);
  CompleteAll(op.id());
  Tick();
  EXPECT_EQ(Job(job.id()).generation(), 4);
  EXPECT_EQ(Job(job.id()).dataset_state().step(), 4);
}

RESHARD_LOGIC_ON_BOTH_STORES(CheckpointMeetingTest);

}  // namespace
}  // namespace reshard::coordinator::testing
