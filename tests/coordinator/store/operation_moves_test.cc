// The store's phase moves against the state machine (operation_machine.h),
// on both stores (the contract suite): StartTransfer, StartPreparedTransfer and
// CommitOperation refuse a phase the table has no move from
// (FAILED_PRECONDITION naming both phases), lose a race to a stored state
// that moved (ABORTED, as before), and write nothing when they refuse.
#include "gtest/gtest.h"
#include "services/coordinator/store/operation_machine.h"
#include "tests/coordinator/store/store_fixture.h"

namespace reshard::coordinator::store_test {
namespace {

class OperationMovesTest : public StoreContractTest {
 protected:
  void SetUp() override {
    StoreContractTest::SetUp();
    spec_ = test_support::StoreSmallSpec("moves");
    target_ = test_support::MakeLayout(2, 2, 2, {"h2", "h3", "h4", "h5"}, 2);
    ASSERT_TRUE(store_->CreateJob("job-1", spec_, {}).ok());
  }

  // Creates `op_id` (stop-free or not) and plans it: PENDING -> PLANNED.
  void CreatePlanned(const std::string& op_id, bool stop_free) {
    NewOperation op = Resize(op_id, "job-1", 1, target_);
    op.stop_free = stop_free;
    ASSERT_TRUE(store_->CreateOperation(op).ok());
    OperationUpdate u;
    const v1::TransferPlan plan = PlanFor(spec_, target_);
    u.plan = &plan;
    u.stats = plan.stats();
    u.bytes_total = 4096;
    ASSERT_TRUE(store_
                    ->TransitionOperation(op_id, v1::OPERATION_STATE_PENDING,
                                          v1::OPERATION_STATE_PLANNED, u)
                    .ok());
  }

  OpPhase Phase(const std::string& op_id) {
    absl::StatusOr<OperationRecord> r = store_->GetOperation(op_id, false);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? PhaseOf(r->op) : OpPhase::kFailed;
  }

  v1::JobSpec spec_;
  v1::Layout target_;
};

TEST_P(OperationMovesTest, AStopFreeOperationToPrepareHasNoWholePlanTransfer) {
  CreatePlanned("op-1", /*stop_free=*/true);
  ASSERT_EQ(Phase("op-1"), OpPhase::kToPrepare);
  const absl::Status s =
      store_->StartTransfer("op-1", {Progress("h0", v1::HOST_TASK_STATE_ASSIGNED)});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(),
            "operation \"op-1\" is TO_PREPARE: the operation state machine has no move from it "
            "to TRANSFERRING");
  EXPECT_EQ(Phase("op-1"), OpPhase::kToPrepare);
  if (IsPostgres()) {
    EXPECT_EQ(CountRows("SELECT count(*) FROM generations WHERE job_id = $1", "job-1"), 1);
  }
  v1::GenerationRef second;  // no pending generation was inserted
  second.set_job_id("job-1");
  second.set_generation(2);
  EXPECT_EQ(store_->StaleGenerations({second})->size(), 1u);

  // Its prepare is the move the table has; a prepared transfer waits for
  // the cut-over.
  ASSERT_TRUE(store_->StartPrepare("op-1", 1, {Progress("h2", v1::HOST_TASK_STATE_ASSIGNED)}).ok());
  ASSERT_EQ(Phase("op-1"), OpPhase::kPreparing);
  const absl::Status early =
      store_->StartPreparedTransfer("op-1", {Progress("h2", v1::HOST_TASK_STATE_ASSIGNED)}, {});
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition) << early;
  EXPECT_EQ(early.message(),
            "operation \"op-1\" is PREPARING: the operation state machine has no move from it "
            "to PREPARED_TRANSFER");
  EXPECT_EQ(Phase("op-1"), OpPhase::kPreparing);
}

TEST_P(OperationMovesTest, AStopTheWorldOperationMovesAsBeforeAndLosesRacesWithAborted) {
  CreatePlanned("op-1", /*stop_free=*/false);
  ASSERT_EQ(Phase("op-1"), OpPhase::kPlanned);
  const absl::Status prepared =
      store_->StartPreparedTransfer("op-1", {Progress("h2", v1::HOST_TASK_STATE_ASSIGNED)}, {});
  EXPECT_EQ(prepared.code(), absl::StatusCode::kFailedPrecondition) << prepared;
  EXPECT_EQ(prepared.message(),
            "operation \"op-1\" is PLANNED: the operation state machine has no move from it to "
            "PREPARED_TRANSFER");
  const absl::Status early_commit = store_->CommitOperation("op-1");
  EXPECT_EQ(early_commit.code(), absl::StatusCode::kAborted) << early_commit;
  EXPECT_EQ(early_commit.message(), "operation \"op-1\" is PLANNED, not TRANSFERRING");

  ASSERT_TRUE(store_->StartTransfer("op-1", {Progress("h2", v1::HOST_TASK_STATE_ASSIGNED)}).ok());
  ASSERT_EQ(Phase("op-1"), OpPhase::kTransferring);
  const absl::Status again =
      store_->StartTransfer("op-1", {Progress("h2", v1::HOST_TASK_STATE_ASSIGNED)});
  EXPECT_EQ(again.code(), absl::StatusCode::kAborted) << again;
  EXPECT_EQ(again.message(), "operation \"op-1\" is TRANSFERRING, not PLANNED");
  EXPECT_EQ(store_->StartTransfer("op-x", {}).code(), absl::StatusCode::kNotFound);
}

RESHARD_STORE_CONTRACT(OperationMovesTest);

}  // namespace
}  // namespace reshard::coordinator::store_test
