// Two-phase (stop-free) reconfiguration against a real PostgreSQL, agents
// played through AgentApi (docs/coordinator.md, "Stop-free
// reconfiguration"): a stop-free resize waits in PLANNED while the old
// layout trains, is prepared (workers and agents), is cut over by a checkpoint of a step
// boundary whose generation becomes its source, and commits with that
// step's dataset state; refusals name the operation and why; a cut-over
// that does not commit aborts the operation.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/logic/stop_free_fixture.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::MakeLayout;

TEST_P(StopFreeTest, PreparesWhileTheOldLayoutTrainsThenCutsOverAtAStep) {
  const v1::Job job = RegisterWithData("stop-free");
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Layout target = MakeLayout(1, 2, 2, {"h1", "h2"}, 2);
  absl::StatusOr<v1::Operation> created = StopFreeResize(job, target);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(created->stop_free());

  // Planned, then it waits while its agents prepare: the old generation
  // stays current.
  Tick();
  Tick();
  v1::Operation op = Op(created->id());
  EXPECT_EQ(op.state(), v1::OPERATION_STATE_PLANNED) << op.error();
  EXPECT_EQ(op.prepared_unix_ms(), 0);
  EXPECT_EQ(Participants(op.id()), PlanHosts(op.id()));
  EXPECT_EQ(Job(job.id()).active_operation_id(), op.id());
  EXPECT_EQ(Job(job.id()).generation(), 1);

  // No cut-over before the new workers are warm and the agents prepared.
  EXPECT_THAT(CheckpointAt(job, 3, op.id()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "not prepared yet"));
  PrepareAll(op.id());
  absl::StatusOr<v1::Operation> prepared = MarkPrepared(op.id());
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_GT(prepared->prepared_unix_ms(), 0);
  EXPECT_GE(prepared->prepare_seconds(), 0);
  // A repeat keeps the first time.
  absl::StatusOr<v1::Operation> again = MarkPrepared(op.id());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->prepared_unix_ms(), prepared->prepared_unix_ms());

  // The old layout's step 3 is the cut-over: its checkpoint's generation
  // becomes the operation's source.
  absl::StatusOr<v1::Operation> cut = CheckpointAt(job, 3, op.id());
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(cut->kind(), v1::OPERATION_KIND_CHECKPOINT);
  EXPECT_EQ(cut->to_generation(), 2);
  op = Op(op.id());
  EXPECT_EQ(op.from_generation(), 2);
  EXPECT_EQ(op.to_generation(), 3);
  EXPECT_EQ(op.cutover_operation_id(), cut->id());
  EXPECT_GT(op.cutover_unix_ms(), 0);
  EXPECT_EQ(Job(job.id()).active_operation_id(), op.id());
  EXPECT_THAT(CheckpointAt(job, 4, op.id()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "cut over already"));

  // The old workers publish (the checkpoint's tasks); the transfer waits.
  Tick();
  EXPECT_EQ(Op(cut->id()).state(), v1::OPERATION_STATE_TRANSFERRING);
  EXPECT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_PLANNED);
  CompleteAll(cut->id());
  Tick();
  EXPECT_EQ(Op(cut->id()).state(), v1::OPERATION_STATE_COMMITTED);
  v1::Job mid = Job(job.id());
  EXPECT_EQ(mid.generation(), 2);
  EXPECT_EQ(mid.state(), v1::JOB_STATE_RECONFIGURING);
  EXPECT_EQ(mid.dataset_state().step(), 3);

  // Then the transfer from the cut-over generation, and the commit with
  // that step's dataset state.
  Tick();
  op = Op(op.id());
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_TRANSFERRING) << op.error();
  CompleteAll(op.id());
  Tick();
  op = Op(op.id());
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_COMMITTED) << op.error();
  EXPECT_GE(op.pause_seconds(), 0);
  const v1::Job done = Job(job.id());
  EXPECT_EQ(done.generation(), 3);
  EXPECT_EQ(done.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_EQ(done.dataset_state().step(), 3);
  EXPECT_EQ(done.dataset_state().cursor(), 3 * kBatch);
  EXPECT_EQ(done.layout().config().dp(), 2);
  EXPECT_EQ(MetricValue("reshard_coordinator_stop_free_seconds", {{"phase", "pause"}}), 1);
  EXPECT_EQ(MetricValue("reshard_coordinator_stop_free_seconds", {{"phase", "prepare"}}), 1);
}

TEST_P(StopFreeTest, RefusalsNameTheOperationAndWhy) {
  const v1::Job job = RegisterWithData("refusals");
  RegisterAgents({"h0", "h1", "h2"});
  absl::StatusOr<v1::Operation> plain = ResizeTo(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->stop_free());
  EXPECT_THAT(MarkPrepared(plain->id()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "not stop-free"));
  EXPECT_THAT(CheckpointAt(job, 3, plain->id()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "it is not stop-free"));
  EXPECT_THAT(MarkPrepared("op-unknown").status(), StatusIs(absl::StatusCode::kNotFound, ""));
  v1::CheckpointRequest no_step;
  no_step.set_job_id(job.id());
  no_step.set_expected_generation(1);
  no_step.set_cut_over_operation_id(plain->id());
  EXPECT_THAT(api_->Checkpoint(no_step).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs with_step"));
}

TEST_P(StopFreeTest, AStopFreeMigrateWaitsForItsCutOverToo) {
  const v1::Job job = RegisterWithData("migrate");
  RegisterAgents({"h0", "h1", "h2", "h3"});
  v1::MigrateRequest r;
  r.set_job_id(job.id());
  r.set_expected_generation(1);
  *r.mutable_placement() = MakeLayout(2, 2, 1, {"h2", "h3"}, 2).placement();
  r.set_stop_free(true);
  absl::StatusOr<v1::Operation> op = api_->Migrate(r);
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_TRUE(op->stop_free());
  Tick();
  Tick();
  EXPECT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_PLANNED);
  EXPECT_EQ(Participants(op->id()), PlanHosts(op->id()));
  PrepareAll(op->id());
  ASSERT_TRUE(MarkPrepared(op->id()).ok());
  absl::StatusOr<v1::Operation> cut = CheckpointAt(job, 2, op->id());
  ASSERT_TRUE(cut.ok()) << cut.status();
  Tick();
  CompleteAll(cut->id());
  Tick();
  Tick();
  ASSERT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_TRANSFERRING) << Op(op->id()).error();
  CompleteAll(op->id());
  Tick();
  EXPECT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_COMMITTED);
  const v1::Job done = Job(job.id());
  EXPECT_EQ(done.generation(), 3);
  EXPECT_EQ(done.dataset_state().step(), 2);
}

TEST_P(StopFreeTest, ACutOverThatDoesNotCommitAbortsTheOperation) {
  const v1::Job job = RegisterWithData("aborted-cut");
  RegisterAgents({"h0", "h1", "h2"});
  absl::StatusOr<v1::Operation> op = StopFreeResize(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(op.ok()) << op.status();
  Tick();
  PrepareAll(op->id());
  ASSERT_TRUE(MarkPrepared(op->id()).ok());
  absl::StatusOr<v1::Operation> cut = CheckpointAt(job, 3, op->id());
  ASSERT_TRUE(cut.ok()) << cut.status();
  Tick();
  v1::CancelOperationRequest cancel;
  cancel.set_operation_id(cut->id());
  ASSERT_TRUE(api_->CancelOperation(cancel).ok());
  Tick();
  const v1::Operation ended = Op(op->id());
  EXPECT_EQ(ended.state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_THAT(ended.error(), ::testing::HasSubstr(cut->id()));
  const v1::Job after = Job(job.id());
  EXPECT_EQ(after.generation(), 1);
  EXPECT_EQ(after.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_TRUE(after.active_operation_id().empty());
  // Both new generations are dropped on the hosts: the checkpoint's and
  // the one the agents prepared.
  absl::StatusOr<v1::HeartbeatResponse> beat = Heartbeat("h1");
  ASSERT_TRUE(beat.ok()) << beat.status();
  std::vector<int64_t> discarded;
  for (const v1::GenerationRef& ref : beat->discard()) discarded.push_back(ref.generation());
  EXPECT_THAT(discarded, ::testing::ElementsAre(2, 3));
}

RESHARD_LOGIC_ON_BOTH_STORES(StopFreeTest);

}  // namespace
}  // namespace reshard::coordinator::testing
