// FinishOperation (logic/operation_finish.h), the one way an operation ends,
// against a real PostgreSQL: it ends active phases only by the table's
// endings, refuses the rest naming the phase and the event, and loses a race
// to a move it did not see (Aborted) without writing anything.
#include "services/coordinator/logic/operation_finish.h"

#include "gtest/gtest.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::MakeLayout;
using test_support::TwoLayerJob;

class OperationFinishTest : public LogicTest {};

TEST_P(OperationFinishTest, EndsAnActivePhaseAndRefusesATerminalOne) {
  const v1::Job job = Register(TwoLayerJob("finish"));
  absl::StatusOr<v1::Operation> created = ResizeTo(job, MakeLayout(2, 2, 1, {"h2", "h3"}, 2));
  ASSERT_TRUE(created.ok()) << created.status();
  const v1::Operation pending = Op(created->id());
  ASSERT_EQ(PhaseOf(pending), OpPhase::kPending);

  OperationEnding failed;
  failed.event = OpEvent::kFailed;
  failed.error = "the job's PTC cannot be planned";
  ASSERT_TRUE(FinishOperation(*store_, metrics_.get(), pending, failed, clock_.NowUnixMs()).ok());
  const v1::Operation ended = Op(created->id());
  EXPECT_EQ(ended.state(), v1::OPERATION_STATE_FAILED);
  EXPECT_EQ(ended.error(), "the job's PTC cannot be planned");
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_ACTIVE);
  EXPECT_EQ(MetricValue("reshard_coordinator_operations_total",
                        {{"kind", "resize"}, {"result", "failed"}}),
            1);

  // FAILED is terminal: no ending leaves it, and nothing is written.
  OperationEnding cancel;
  cancel.event = OpEvent::kCancelled;
  cancel.error = "cancelled by client";
  const absl::Status again =
      FinishOperation(*store_, metrics_.get(), ended, cancel, clock_.NowUnixMs());
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_EQ(again.message(),
            "operation \"" + created->id() +
                "\" is FAILED: the operation state machine does not end it by \"cancelled\"");
  EXPECT_EQ(Op(created->id()).error(), "the job's PTC cannot be planned");
  EXPECT_EQ(MetricValue("reshard_coordinator_operations_total",
                        {{"kind", "resize"}, {"result", "aborted"}}),
            0);
}

TEST_P(OperationFinishTest, AnEventThatDoesNotEndIsRefused) {
  const v1::Job job = Register(TwoLayerJob("not-an-end"));
  absl::StatusOr<v1::Operation> created = ResizeTo(job, MakeLayout(2, 2, 1, {"h2", "h3"}, 2));
  ASSERT_TRUE(created.ok()) << created.status();
  OperationEnding planned;
  planned.event = OpEvent::kPlanned;
  const absl::Status s =
      FinishOperation(*store_, metrics_.get(), Op(created->id()), planned, clock_.NowUnixMs());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(), "operation \"" + created->id() +
                             "\" is PENDING: the operation state machine does not end it by "
                             "\"planned\"");
  EXPECT_EQ(Op(created->id()).state(), v1::OPERATION_STATE_PENDING);
}

TEST_P(OperationFinishTest, AStaleReadLosesToTheDriver) {
  const v1::Job job = Register(TwoLayerJob("stale"));
  RegisterAgents({"h0", "h1", "h2"});
  absl::StatusOr<v1::Operation> created = ResizeTo(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(created.ok()) << created.status();
  const v1::Operation stale = Op(created->id());  // PENDING
  Tick();  // the driver plans it and starts its transfer
  ASSERT_EQ(PhaseOf(Op(created->id())), OpPhase::kTransferring);

  OperationEnding cancel;
  cancel.event = OpEvent::kCancelled;
  cancel.error = "cancelled by client";
  const absl::Status s =
      FinishOperation(*store_, metrics_.get(), stale, cancel, clock_.NowUnixMs());
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(s.message(), "operation \"" + created->id() + "\" is TRANSFERRING, not PENDING");
  EXPECT_EQ(Op(created->id()).state(), v1::OPERATION_STATE_TRANSFERRING);
  // Re-read, it ends.
  ASSERT_TRUE(
      FinishOperation(*store_, metrics_.get(), Op(created->id()), cancel, clock_.NowUnixMs()).ok());
  EXPECT_EQ(Op(created->id()).state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_EQ(Op(created->id()).error(), "cancelled by client");
}

RESHARD_LOGIC_ON_BOTH_STORES(OperationFinishTest);

}  // namespace
}  // namespace reshard::coordinator::testing
