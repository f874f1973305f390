// An operation's phases (store/operation_machine.h) as the real driver,
// AgentApi and SchedulerApi move it, against PostgreSQL: a stop-free resize
// walks PENDING, PREPARING, PREPARED, CUTTING_OVER, PREPARED_TRANSFER,
// COMMITTED, its cut-over checkpoint PENDING to COMMITTED, and every phase
// seen follows the one before by a path of the table.
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/coordinator/store/operation_machine.h"
#include "tests/coordinator/logic/stop_free_fixture.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::MakeLayout;

class OperationPhasesTest : public StopFreeTest {
 protected:
  // The operation's phase now, recorded; checked against the one before.
  OpPhase Saw(const std::string& operation_id) {
    const OpPhase phase = PhaseOf(Op(operation_id));
    std::vector<OpPhase>& seen = seen_[operation_id];
    if (!seen.empty()) {
      EXPECT_TRUE(PathExists(seen.back(), phase))
          << operation_id << ": " << PhaseName(seen.back()) << " -> " << PhaseName(phase);
    }
    if (seen.empty() || seen.back() != phase) seen.push_back(phase);
    return phase;
  }

  std::vector<std::string> Names(const std::string& operation_id) {
    std::vector<std::string> names;
    for (OpPhase p : seen_[operation_id]) names.emplace_back(PhaseName(p));
    return names;
  }

  std::map<std::string, std::vector<OpPhase>> seen_;
};

TEST_P(OperationPhasesTest, AStopFreeResizeWalksItsPhases) {
  const v1::Job job = RegisterWithData("phases");
  RegisterAgents({"h0", "h1", "h2"});
  absl::StatusOr<v1::Operation> op = StopFreeResize(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(Saw(op->id()), OpPhase::kPending);
  Tick();  // planned, and its agents' prepare started, in one pass
  EXPECT_EQ(Saw(op->id()), OpPhase::kPreparing);
  PrepareAll(op->id());
  EXPECT_EQ(Saw(op->id()), OpPhase::kPrepared);
  ASSERT_TRUE(MarkPrepared(op->id()).ok());
  EXPECT_EQ(Saw(op->id()), OpPhase::kPrepared);  // the workers' half is no phase
  Tick();
  EXPECT_EQ(Saw(op->id()), OpPhase::kPrepared);

  absl::StatusOr<v1::Operation> cut = CheckpointAt(job, 3, op->id());
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(Saw(op->id()), OpPhase::kCuttingOver);
  EXPECT_EQ(Saw(cut->id()), OpPhase::kPending);
  Tick();
  EXPECT_EQ(Saw(cut->id()), OpPhase::kTransferring);
  EXPECT_EQ(Saw(op->id()), OpPhase::kCuttingOver);
  CompleteAll(cut->id());
  Tick();  // the checkpoint commits, then the prepared transfer starts
  EXPECT_EQ(Saw(cut->id()), OpPhase::kCommitted);
  Tick();
  EXPECT_EQ(Saw(op->id()), OpPhase::kPreparedTransfer);
  CompleteAll(op->id());
  Tick();
  EXPECT_EQ(Saw(op->id()), OpPhase::kCommitted) << Op(op->id()).error();

  EXPECT_EQ(Names(op->id()), (std::vector<std::string>{"PENDING", "PREPARING", "PREPARED",
                                                        "CUTTING_OVER", "PREPARED_TRANSFER",
                                                        "COMMITTED"}));
  EXPECT_EQ(Names(cut->id()),
            (std::vector<std::string>{"PENDING", "TRANSFERRING", "COMMITTED"}));
}

TEST_P(OperationPhasesTest, ACancelEndsAPreparingOperationTheOneWay) {
  const v1::Job job = RegisterWithData("cancel-phases");
  RegisterAgents({"h0", "h1", "h2"});
  absl::StatusOr<v1::Operation> op = StopFreeResize(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(op.ok()) << op.status();
  Tick();
  ASSERT_EQ(Saw(op->id()), OpPhase::kPreparing);
  v1::CancelOperationRequest request;
  request.set_operation_id(op->id());
  absl::StatusOr<v1::Operation> cancelled = api_->CancelOperation(request);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(Saw(op->id()), OpPhase::kAborted);
  EXPECT_EQ(cancelled->error(), "cancelled by client");
  Tick();  // nothing leaves a terminal phase
  EXPECT_EQ(Saw(op->id()), OpPhase::kAborted);
  EXPECT_EQ(Names(op->id()), (std::vector<std::string>{"PREPARING", "ABORTED"}));
}

RESHARD_LOGIC_ON_BOTH_STORES(OperationPhasesTest);

}  // namespace
}  // namespace reshard::coordinator::testing
