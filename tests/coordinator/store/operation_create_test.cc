// CreateOperation's rules alone (store/operation_create.h): the plan each
// meeting verdict gives, and each refusal's code and message, for the
// snapshot a Store reads. The Stores' persistence of the plans runs in the
// contract suite (operations_test.cc, operation_moves_test.cc).
#include "services/coordinator/store/operation_create.h"

#include "gtest/gtest.h"

namespace reshard::coordinator {
namespace {

using Action = CreationPlan::Action;

ActiveOperation Active(const std::string& id, v1::OperationKind kind, v1::OperationState state) {
  ActiveOperation op;
  op.id = id;
  op.kind = kind;
  op.state = state;
  return op;
}

ActiveOperation Checkpoint(const std::string& id) {
  ActiveOperation op =
      Active(id, v1::OPERATION_KIND_CHECKPOINT, v1::OPERATION_STATE_TRANSFERRING);
  op.to_generation = 6;
  return op;
}

NewOperation Request(const std::string& id, v1::OperationKind kind) {
  NewOperation op;
  op.operation_id = id;
  op.job_id = "j";
  op.kind = kind;
  op.expected_generation = 3;
  return op;
}

// Job "j" at generation 3 that has handed out numbers up to 5.
CreationSnapshot Snapshot(std::vector<ActiveOperation> active = {}) {
  CreationSnapshot s;
  s.generation = 3;
  s.max_generation = 5;
  s.active = std::move(active);
  return s;
}

// A stop-free resize "s", PLANNED and prepared, that reserved 7 below its 8.
CutOverTarget Prepared() {
  CutOverTarget t;
  t.state = v1::OPERATION_STATE_PLANNED;
  t.stop_free = true;
  t.prepared = true;
  t.workers_prepared = true;
  t.agents_prepared = true;
  t.prepared_from_generation = 3;
  t.to_generation = 8;
  return t;
}

CreationSnapshot CutOverSnapshot(const CutOverTarget& target) {
  ActiveOperation s = Active("s", v1::OPERATION_KIND_RESIZE, v1::OPERATION_STATE_PLANNED);
  s.stop_free = true;
  s.to_generation = target.to_generation;
  CreationSnapshot snap = Snapshot({s});
  snap.cut_over = target;
  return snap;
}

NewOperation CutOverRequest() {
  NewOperation op = Request("c", v1::OPERATION_KIND_CHECKPOINT);
  op.cut_over_operation_id = "s";
  return op;
}

CreationPlan Planned(const NewOperation& op, const CreationSnapshot& s) {
  absl::StatusOr<CreationPlan> plan = PlanCreation(op, s);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : CreationPlan{};
}

void ExpectRefused(const NewOperation& op, const CreationSnapshot& s, absl::StatusCode code,
                   const std::string& message) {
  absl::StatusOr<CreationPlan> plan = PlanCreation(op, s);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), code);
  EXPECT_EQ(plan.status().message(), message);
}

TEST(PlanCreationTest, AReplayAnswersTheFirstCallBeforeAnyCheck) {
  NewOperation op = Request("r2", v1::OPERATION_KIND_RESIZE);
  op.expected_generation = 0;  // refused, were it not a replay
  CreationSnapshot s;
  s.replayed = "r1";
  const CreationPlan plan = Planned(op, s);
  EXPECT_EQ(plan.action, Action::kReplay);
  EXPECT_EQ(plan.existing, "r1");
}

TEST(PlanCreationTest, ExpectedGenerationMustBePositiveAndTheJobs) {
  NewOperation op = Request("r", v1::OPERATION_KIND_RESIZE);
  op.expected_generation = 0;
  ExpectRefused(op, Snapshot(), absl::StatusCode::kInvalidArgument,
                "expected_generation must be positive, got 0");
  op.expected_generation = -2;
  ExpectRefused(op, Snapshot(), absl::StatusCode::kInvalidArgument,
                "expected_generation must be positive, got -2");
  op.expected_generation = 2;
  ExpectRefused(op, Snapshot(), absl::StatusCode::kAborted,
                "job \"j\" is at generation 3, request expected 2");
}

TEST(PlanCreationTest, NothingActiveCreatesWithTheNextNumber) {
  const CreationPlan plan = Planned(Request("r", v1::OPERATION_KIND_RESIZE), Snapshot());
  EXPECT_EQ(plan.action, Action::kCreate);
  EXPECT_EQ(plan.row.from_generation, 3);
  EXPECT_EQ(plan.row.to_generation, 6);
  EXPECT_EQ(plan.row.queued_behind, "");
  EXPECT_EQ(plan.row.step_boundary, v1::STEP_BOUNDARY_UNSPECIFIED);
  EXPECT_EQ(plan.row.step_boundary_timeout_ms, 0);
  EXPECT_EQ(plan.row.step_boundary_deadline_unix_ms, 0);
  EXPECT_FALSE(plan.abort_checkpoint.has_value());
  EXPECT_FALSE(plan.cut_over.has_value());
  EXPECT_FALSE(plan.boundary_checkpoint.has_value());
  EXPECT_EQ(plan.job_state, v1::JOB_STATE_RECONFIGURING);

  // Stop-free: the number below its own is reserved for its checkpoint.
  NewOperation stop_free = Request("sf", v1::OPERATION_KIND_RESIZE);
  stop_free.stop_free = true;
  EXPECT_EQ(Planned(stop_free, Snapshot()).row.to_generation, 7);

  // At the step boundary: waits from now, until its deadline.
  NewOperation boundary = Request("b", v1::OPERATION_KIND_RESIZE);
  boundary.at_step_boundary = true;
  boundary.step_boundary_timeout_ms = 30000;
  boundary.step_boundary_deadline_unix_ms = 123456;
  const CreationPlan waits = Planned(boundary, Snapshot());
  EXPECT_EQ(waits.row.step_boundary, v1::STEP_BOUNDARY_WAITING);
  EXPECT_EQ(waits.row.step_boundary_timeout_ms, 30000);
  EXPECT_EQ(waits.row.step_boundary_deadline_unix_ms, 123456);
}

TEST(PlanCreationTest, AReconfigurationQueuesBehindACheckpointWithItsNumbersOpen) {
  NewOperation op = Request("r", v1::OPERATION_KIND_MIGRATE);
  op.at_step_boundary = true;
  op.step_boundary_timeout_ms = 30000;
  op.step_boundary_deadline_unix_ms = 123456;
  const CreationPlan plan = Planned(op, Snapshot({Checkpoint("c")}));
  EXPECT_EQ(plan.action, Action::kCreate);
  EXPECT_EQ(plan.row.queued_behind, "c");
  EXPECT_EQ(plan.row.from_generation, 3);
  EXPECT_EQ(plan.row.to_generation, 0);
  EXPECT_EQ(plan.row.step_boundary, v1::STEP_BOUNDARY_WAITING);
  EXPECT_EQ(plan.row.step_boundary_timeout_ms, 30000);
  EXPECT_EQ(plan.row.step_boundary_deadline_unix_ms, 0);  // counts from the release
  EXPECT_FALSE(plan.abort_checkpoint.has_value());
}

TEST(PlanCreationTest, ARecoveryAbortsTheCheckpointNamingWhatWasLost) {
  NewOperation op = Request("rec", v1::OPERATION_KIND_RECOVER);
  op.lost_hosts = {"h1", "h2"};
  op.lost_ranks = {3};
  const CreationPlan plan = Planned(op, Snapshot({Checkpoint("c")}));
  EXPECT_EQ(plan.action, Action::kCreate);
  ASSERT_TRUE(plan.abort_checkpoint.has_value());
  EXPECT_EQ(plan.abort_checkpoint->operation_id, "c");
  EXPECT_EQ(plan.abort_checkpoint->from, v1::OPERATION_STATE_TRANSFERRING);
  EXPECT_EQ(plan.abort_checkpoint->to_generation, 6);
  EXPECT_EQ(plan.abort_checkpoint->error,
            "aborted: recovery \"rec\" replaced it (lost host \"h1\", host \"h2\", rank 3); a "
            "checkpoint needs every rank of its generation");
  EXPECT_EQ(plan.row.queued_behind, "");
  EXPECT_EQ(plan.row.to_generation, 6);
}

TEST(PlanCreationTest, ACheckpointFoldsIntoAStopFreeOperation) {
  ActiveOperation sf = Active("s", v1::OPERATION_KIND_RESIZE, v1::OPERATION_STATE_PLANNED);
  sf.stop_free = true;
  const CreationPlan plan = Planned(Request("c", v1::OPERATION_KIND_CHECKPOINT), Snapshot({sf}));
  EXPECT_EQ(plan.action, Action::kFold);
  EXPECT_EQ(plan.existing, "s");
}

TEST(PlanCreationTest, TheMeetingRulesRefusalsPassThrough) {
  ExpectRefused(Request("r", v1::OPERATION_KIND_RESIZE),
                Snapshot({Active("a", v1::OPERATION_KIND_RESIZE, v1::OPERATION_STATE_PLANNED)}),
                absl::StatusCode::kFailedPrecondition,
                "job \"j\" has active operation \"a\" (PLANNED)");
  ExpectRefused(Request("c2", v1::OPERATION_KIND_CHECKPOINT), Snapshot({Checkpoint("c")}),
                absl::StatusCode::kFailedPrecondition,
                "job \"j\" has active operation \"c\" (TRANSFERRING): one checkpoint at a time");
}

TEST(PlanCreationTest, ACutOverTakesTheReservedNumber) {
  const CreationPlan plan = Planned(CutOverRequest(), CutOverSnapshot(Prepared()));
  EXPECT_EQ(plan.action, Action::kCreate);
  EXPECT_EQ(plan.row.from_generation, 3);
  EXPECT_EQ(plan.row.to_generation, 7);
  ASSERT_TRUE(plan.cut_over.has_value());
  EXPECT_EQ(plan.cut_over->operation_id, "s");
  EXPECT_EQ(plan.cut_over->from_generation, 7);
  EXPECT_EQ(plan.cut_over->to_generation, 8);
  EXPECT_EQ(plan.cut_over->checkpoint_id, "c");
  EXPECT_FALSE(plan.boundary_checkpoint.has_value());

  // Created before migration 0011 (to_generation 4: nothing reserved): the
  // checkpoint takes the next number and the operation moves past it.
  CutOverTarget old = Prepared();
  old.to_generation = 4;
  const CreationPlan moved = Planned(CutOverRequest(), CutOverSnapshot(old));
  EXPECT_EQ(moved.row.to_generation, 6);
  ASSERT_TRUE(moved.cut_over.has_value());
  EXPECT_EQ(moved.cut_over->from_generation, 6);
  EXPECT_EQ(moved.cut_over->to_generation, 7);
}

TEST(PlanCreationTest, ACutOverIsRefusedNamingWhy) {
  const auto kFp = absl::StatusCode::kFailedPrecondition;
  ExpectRefused(CutOverRequest(), Snapshot(), kFp,
                "cut_over_operation_id \"s\": not the active operation of job \"j\" (it has none)");
  ExpectRefused(CutOverRequest(),
                Snapshot({Active("a", v1::OPERATION_KIND_RESIZE, v1::OPERATION_STATE_PLANNED)}),
                kFp,
                "cut_over_operation_id \"s\": not the active operation of job \"j\" (\"a\" is)");
  CreationSnapshot two = CutOverSnapshot(Prepared());
  two.active.push_back(Checkpoint("c0"));
  ExpectRefused(CutOverRequest(), two, kFp,
                "cut_over_operation_id \"s\": it was cut over already (checkpoint \"c0\" is "
                "running)");
  CreationSnapshot gone = CutOverSnapshot(Prepared());
  gone.cut_over.reset();
  ExpectRefused(CutOverRequest(), gone, absl::StatusCode::kNotFound, "operation \"s\" not found");

  CutOverTarget t = Prepared();
  t.stop_free = false;
  ExpectRefused(CutOverRequest(), CutOverSnapshot(t), kFp,
                "cut_over_operation_id \"s\" (PLANNED): it is not stop-free");
  t = Prepared();
  t.state = v1::OPERATION_STATE_PENDING;
  ExpectRefused(CutOverRequest(), CutOverSnapshot(t), kFp,
                "cut_over_operation_id \"s\" (PENDING): it is not PLANNED");
  t = Prepared();
  t.cutover_operation_id = "c0";
  ExpectRefused(CutOverRequest(), CutOverSnapshot(t), kFp,
                "cut_over_operation_id \"s\" (PLANNED): it was cut over already");
  t = Prepared();
  t.prepared = false;
  t.workers_prepared = false;
  t.agents_prepared = false;
  t.prepared_from_generation = 0;
  ExpectRefused(CutOverRequest(), CutOverSnapshot(t), kFp,
                "cut_over_operation_id \"s\" (PLANNED): its new workers are not prepared yet "
                "(MarkPrepared); its agents have not started preparing yet");
  t.workers_prepared = true;
  t.prepared_from_generation = 3;
  t.hosts_not_prepared = {"h0", "h1"};
  ExpectRefused(CutOverRequest(), CutOverSnapshot(t), kFp,
                "cut_over_operation_id \"s\" (PLANNED): hosts not prepared yet (not PREPARED): "
                "\"h0\", \"h1\"");
}

TEST(PlanCreationTest, ABoundaryCheckpointQueuesTheWaitingOperationBehindIt) {
  ActiveOperation waiting = Active("b", v1::OPERATION_KIND_RESIZE, v1::OPERATION_STATE_PENDING);
  waiting.step_boundary = v1::STEP_BOUNDARY_WAITING;
  waiting.to_generation = 6;
  NewOperation op = Request("c", v1::OPERATION_KIND_CHECKPOINT);
  op.cut_over_operation_id = "b";
  const CreationPlan plan = Planned(op, Snapshot({waiting}));
  EXPECT_EQ(plan.action, Action::kCreate);
  EXPECT_EQ(plan.row.to_generation, 6);
  EXPECT_FALSE(plan.cut_over.has_value());
  ASSERT_TRUE(plan.boundary_checkpoint.has_value());
  EXPECT_EQ(plan.boundary_checkpoint->operation_id, "b");
  EXPECT_EQ(plan.boundary_checkpoint->checkpoint_id, "c");
  EXPECT_EQ(plan.boundary_checkpoint->step_boundary, v1::STEP_BOUNDARY_CHECKPOINTING);
  EXPECT_EQ(plan.boundary_checkpoint->to_generation, 0);
  EXPECT_EQ(plan.boundary_checkpoint->step_boundary_deadline_unix_ms, 0);

  waiting.step_boundary = v1::STEP_BOUNDARY_TIMED_OUT;
  ExpectRefused(op, Snapshot({waiting}), absl::StatusCode::kFailedPrecondition,
                "cut_over_operation_id \"b\": it no longer waits for a step boundary (TIMED_OUT, "
                "PENDING)");
}

TEST(PlanCreationTest, ACheckpointStepMustFollowTheCommittedOne) {
  NewOperation op = Request("c", v1::OPERATION_KIND_CHECKPOINT);
  op.step = StepCommit{};
  op.step->step = 10;
  op.step->cursor = 80;
  ExpectRefused(op, Snapshot(), absl::StatusCode::kFailedPrecondition,
                "job \"j\" has no dataset state: a checkpoint with a step needs one "
                "(RegisterJobRequest.dataset_state)");
  CreationSnapshot s = Snapshot();
  s.committed.emplace();
  s.committed->set_step(10);
  s.committed->set_cursor(80);
  s.committed->set_global_batch(8);
  ExpectRefused(op, s, absl::StatusCode::kFailedPrecondition,
                "job \"j\": step 10 is committed already; a checkpoint carries a later step");
  op.step->step = 12;
  op.step->cursor = 96;
  const CreationPlan plan = Planned(op, s);
  EXPECT_EQ(plan.action, Action::kCreate);
  EXPECT_EQ(plan.row.to_generation, 6);
}

}  // namespace
}  // namespace reshard::coordinator
