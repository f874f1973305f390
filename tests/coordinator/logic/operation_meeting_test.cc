// The meeting rule alone (store/operation_meeting.h; docs/coordinator.md,
// "Checkpoints and operations"): every row of the doc's table.
#include "services/coordinator/store/operation_meeting.h"

#include "gtest/gtest.h"

namespace reshard::coordinator {
namespace {

ActiveOperation Checkpoint(const std::string& id) {
  ActiveOperation op;
  op.id = id;
  op.kind = v1::OPERATION_KIND_CHECKPOINT;
  op.state = v1::OPERATION_STATE_TRANSFERRING;
  return op;
}

ActiveOperation Resize(const std::string& id, v1::OperationState state) {
  ActiveOperation op;
  op.id = id;
  op.kind = v1::OPERATION_KIND_RESIZE;
  op.state = state;
  return op;
}

constexpr auto kCp = v1::OPERATION_KIND_CHECKPOINT;
constexpr auto kResize = v1::OPERATION_KIND_RESIZE;
constexpr auto kMigrate = v1::OPERATION_KIND_MIGRATE;
constexpr auto kRecover = v1::OPERATION_KIND_RECOVER;

absl::StatusOr<MeetingVerdict> MeetWith(v1::OperationKind kind, const std::string& cut_over,
                                        const std::vector<ActiveOperation>& active) {
  return Meet("j", kind, cut_over, active);
}

void ExpectVerdict(const absl::StatusOr<MeetingVerdict>& v, Meeting what,
                   const std::string& other) {
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->what, what);
  EXPECT_EQ(v->other, other);
}

void ExpectRefused(const absl::StatusOr<MeetingVerdict>& v, const std::string& message) {
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(v.status().message(), message);
}

TEST(MeetTest, NothingActiveCreates) {
  for (auto kind : {kCp, kResize, kMigrate, kRecover}) {
    ExpectVerdict(MeetWith(kind, "", {}), Meeting::kCreate, "");
  }
  // A cut-over naming nothing active: CheckCutOver says why.
  ExpectVerdict(MeetWith(kCp, "x", {}), Meeting::kCutOver, "x");
}

TEST(MeetTest, AReconfigurationQueuesBehindACheckpointAndARecoveryAbortsIt) {
  ExpectVerdict(MeetWith(kResize, "", {Checkpoint("c")}), Meeting::kQueue, "c");
  ExpectVerdict(MeetWith(kMigrate, "", {Checkpoint("c")}), Meeting::kQueue, "c");
  ExpectVerdict(MeetWith(kRecover, "", {Checkpoint("c")}), Meeting::kAbortCheckpoint, "c");
  // Behind a queued one: refused, naming the checkpoint first in line.
  ActiveOperation queued = Resize("r", v1::OPERATION_STATE_PENDING);
  queued.queued_behind = "c";
  ExpectRefused(MeetWith(kResize, "", {Checkpoint("c"), queued}),
                "job \"j\" has active operation \"c\" (TRANSFERRING)");
  ExpectRefused(MeetWith(kRecover, "", {Checkpoint("c"), queued}),
                "job \"j\" has active operation \"c\" (TRANSFERRING)");
  ExpectRefused(MeetWith(kResize, "", {Resize("r", v1::OPERATION_STATE_PLANNED)}),
                "job \"j\" has active operation \"r\" (PLANNED)");
}

TEST(MeetTest, ACheckpointFoldsIntoAStopFreeOrWaitingOperation) {
  ActiveOperation sf = Resize("s", v1::OPERATION_STATE_PLANNED);
  sf.stop_free = true;
  ExpectVerdict(MeetWith(kCp, "", {sf}), Meeting::kFold, "s");
  ExpectVerdict(MeetWith(kCp, "", {sf, Checkpoint("cut")}), Meeting::kFold, "s");
  ExpectVerdict(MeetWith(kCp, "s", {sf}), Meeting::kCutOver, "s");
  ActiveOperation waiting = Resize("b", v1::OPERATION_STATE_PENDING);
  waiting.step_boundary = v1::STEP_BOUNDARY_WAITING;
  ExpectVerdict(MeetWith(kCp, "", {waiting}), Meeting::kFold, "b");
  ExpectVerdict(MeetWith(kCp, "b", {waiting}), Meeting::kBoundaryCheckpoint, "b");
}

TEST(MeetTest, ACheckpointIsRefusedBesideACheckpointOrAStopTheWorldOperation) {
  ExpectRefused(MeetWith(kCp, "", {Checkpoint("c")}),
                "job \"j\" has active operation \"c\" (TRANSFERRING): one checkpoint at a time");
  ExpectRefused(MeetWith(kCp, "", {Resize("r", v1::OPERATION_STATE_PENDING)}),
                "job \"j\" has active operation \"r\" (PENDING): a stop-the-world RESIZE moves "
                "the last committed generation; stop training");
}

TEST(MeetTest, ABoundaryCheckpointNeedsTheOperationToWaitNow) {
  ActiveOperation op = Resize("b", v1::OPERATION_STATE_PENDING);
  op.step_boundary = v1::STEP_BOUNDARY_WAITING;
  op.queued_behind = "c";
  ExpectRefused(MeetWith(kCp, "b", {Checkpoint("c"), op}),
                "cut_over_operation_id \"b\": it is queued behind checkpoint \"c\" and waits for "
                "its step boundary once that one ends (Job.step_boundary_operation_id)");
  // Once "c" has ended (not active), before the driver released it: taken.
  ExpectVerdict(MeetWith(kCp, "b", {op}), Meeting::kBoundaryCheckpoint, "b");
  ExpectVerdict(MeetWith(kCp, "", {op}), Meeting::kFold, "b");
  op.step_boundary = v1::STEP_BOUNDARY_CHECKPOINTING;
  op.step_boundary_checkpoint_id = "c";
  ExpectRefused(MeetWith(kCp, "b", {op, Checkpoint("c")}),
                "cut_over_operation_id \"b\": its step-boundary checkpoint \"c\" was created "
                "already");
  op.queued_behind.clear();
  op.step_boundary = v1::STEP_BOUNDARY_TIMED_OUT;
  op.state = v1::OPERATION_STATE_PLANNED;
  ExpectRefused(MeetWith(kCp, "b", {op}),
                "cut_over_operation_id \"b\": it no longer waits for a step boundary (TIMED_OUT, "
                "PLANNED)");
}

}  // namespace
}  // namespace reshard::coordinator
