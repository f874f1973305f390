// Store operations (both stores: the contract suite): creation checks,
// compare-and-set transitions, abort.
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include "tests/coordinator/store/store_fixture.h"

namespace reshard::coordinator::store_test {
namespace {

using google::protobuf::util::MessageDifferencer;

class OperationsTest : public StoreContractTest {
 protected:
  void SetUp() override {
    StoreContractTest::SetUp();
    spec_ = test_support::StoreSmallSpec("llama");
    target_ = test_support::MakeLayout(2, 2, 2, {"h2", "h3", "h4", "h5"}, 2);
    ASSERT_TRUE(store_->CreateJob("job-1", spec_, {}).ok());
  }

  // PENDING -> PLANNED with the real plan.
  void Plan(const std::string& op_id) {
    OperationUpdate u;
    const v1::TransferPlan plan = PlanFor(spec_, target_);
    u.plan = &plan;
    u.stats = u.plan->stats();
    u.bytes_total = 4096;
    ASSERT_TRUE(store_
                    ->TransitionOperation(op_id, v1::OPERATION_STATE_PENDING,
                                          v1::OPERATION_STATE_PLANNED, u)
                    .ok());
  }

  v1::JobSpec spec_;
  v1::Layout target_;
};

TEST_P(OperationsTest, CreateMakesAPendingOperationAndMarksTheJob) {
  absl::StatusOr<v1::Operation> op =
      store_->CreateOperation(Resize("op-1", "job-1", 1, target_, Key("k", "Resize", "h")));
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(op->id(), "op-1");
  EXPECT_EQ(op->job_id(), "job-1");
  EXPECT_EQ(op->kind(), v1::OPERATION_KIND_RESIZE);
  EXPECT_EQ(op->state(), v1::OPERATION_STATE_PENDING);
  EXPECT_EQ(op->from_generation(), 1);
  EXPECT_EQ(op->to_generation(), 2);
  EXPECT_EQ(op->idempotency_key(), "k");
  EXPECT_TRUE(MessageDifferencer::Equals(op->target_layout(), target_));
  EXPECT_GT(op->created_unix_ms(), 0);

  absl::StatusOr<v1::Job> job = store_->GetJob("job-1", false);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::JOB_STATE_RECONFIGURING);
  EXPECT_EQ(job->active_operation_id(), "op-1");
  absl::StatusOr<std::vector<std::string>> active = store_->ListActiveOperations();
  ASSERT_TRUE(active.ok());
  EXPECT_EQ(*active, std::vector<std::string>{"op-1"});
}

TEST_P(OperationsTest, LostHostsAndRanksAreKept) {
  NewOperation n = Resize("op-1", "job-1", 1, target_);
  n.kind = v1::OPERATION_KIND_RECOVER;
  n.lost_hosts = {"h1", "host \"quoted\" \\ odd"};
  n.lost_ranks = {2, 3};
  ASSERT_TRUE(store_->CreateOperation(n).ok());
  absl::StatusOr<OperationRecord> r = store_->GetOperation("op-1", true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->lost_hosts, n.lost_hosts);
  EXPECT_EQ(r->lost_ranks, n.lost_ranks);
  EXPECT_FALSE(r->plan.has_value());  // not planned yet
  EXPECT_EQ(r->op.kind(), v1::OPERATION_KIND_RECOVER);
}

TEST_P(OperationsTest, MissingJobIsNotFound) {
  const absl::Status s = store_->CreateOperation(Resize("op-1", "job-x", 1, target_)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(s.message(), "job \"job-x\" not found");
}

TEST_P(OperationsTest, ExpectedGenerationMismatchIsAborted) {
  const absl::Status s = store_->CreateOperation(Resize("op-1", "job-1", 2, target_)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(s.message(), "job \"job-1\" is at generation 1, request expected 2");
  EXPECT_EQ(store_->CreateOperation(Resize("op-1", "job-1", 0, target_)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A failed mutation changes nothing.
  EXPECT_EQ(store_->GetJob("job-1", false)->state(), v1::JOB_STATE_ACTIVE);
  EXPECT_EQ(store_->GetOperation("op-1", false).status().code(), absl::StatusCode::kNotFound);
}

TEST_P(OperationsTest, SecondActiveOperationIsFailedPreconditionNamingTheFirst) {
  ASSERT_TRUE(store_->CreateOperation(Resize("op-1", "job-1", 1, target_)).ok());
  Plan("op-1");
  const absl::Status s = store_->CreateOperation(Resize("op-2", "job-1", 1, target_)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(), "job \"job-1\" has active operation \"op-1\" (PLANNED)");
}

TEST_P(OperationsTest, RetryWithTheSameKeyReturnsTheFirstOperationAsItIsNow) {
  const Idempotency key = Key("k1", "Resize", "hash-1");
  ASSERT_TRUE(store_->CreateOperation(Resize("op-1", "job-1", 1, target_, key)).ok());
  Plan("op-1");
  // The retry has a new operation id; the first operation (now PLANNED) is
  // the answer, although it is active and blocks any other.
  absl::StatusOr<v1::Operation> again =
      store_->CreateOperation(Resize("op-2", "job-1", 1, target_, key));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->id(), "op-1");
  EXPECT_EQ(again->state(), v1::OPERATION_STATE_PLANNED);

  const absl::Status other =
      store_->CreateOperation(Resize("op-3", "job-1", 1, target_, Key("k1", "Resize", "hash-2")))
          .status();
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument) << other;
  EXPECT_NE(other.message().find("k1"), absl::string_view::npos);
}

TEST_P(OperationsTest, TransitionIsACompareAndSet) {
  ASSERT_TRUE(store_->CreateOperation(Resize("op-1", "job-1", 1, target_)).ok());
  Plan("op-1");
  absl::StatusOr<OperationRecord> r = store_->GetOperation("op-1", true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->op.state(), v1::OPERATION_STATE_PLANNED);
  ASSERT_TRUE(r->plan.has_value());
  EXPECT_TRUE(MessageDifferencer::Equals(*r->plan, PlanFor(spec_, target_)));
  EXPECT_TRUE(MessageDifferencer::Equals(r->op.stats(), r->plan->stats()));
  EXPECT_EQ(r->op.bytes_total(), 4096);
  EXPECT_FALSE(store_->GetOperation("op-1", false)->plan.has_value());

  // A second driver (or a cancel) that still thinks it is PENDING loses.
  const absl::Status lost = store_->TransitionOperation("op-1", v1::OPERATION_STATE_PENDING,
                                                        v1::OPERATION_STATE_FAILED, {});
  EXPECT_EQ(lost.code(), absl::StatusCode::kAborted) << lost;
  EXPECT_EQ(lost.message(), "operation \"op-1\" is PLANNED, not PENDING");
  EXPECT_EQ(store_
                ->TransitionOperation("op-x", v1::OPERATION_STATE_PENDING,
                                      v1::OPERATION_STATE_PLANNED, {})
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store_
                ->TransitionOperation("op-1", v1::OPERATION_STATE_TRANSFERRING,
                                      v1::OPERATION_STATE_COMMITTED, {})
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Unset fields are kept.
  OperationUpdate only_error;
  only_error.error = "cancelled by client";
  ASSERT_TRUE(store_
                  ->TransitionOperation("op-1", v1::OPERATION_STATE_PLANNED,
                                        v1::OPERATION_STATE_ABORTED, only_error)
                  .ok());
  r = store_->GetOperation("op-1", true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->op.state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_EQ(r->op.error(), "cancelled by client");
  EXPECT_TRUE(r->plan.has_value());
  EXPECT_EQ(r->op.bytes_total(), 4096);
  // A final state is never left, and only the state machine's moves exist
  // (operation_machine.h): refused before the row is read.
  const absl::Status from_final = store_->TransitionOperation(
      "op-1", v1::OPERATION_STATE_ABORTED, v1::OPERATION_STATE_FAILED, {});
  EXPECT_EQ(from_final.code(), absl::StatusCode::kFailedPrecondition) << from_final;
  EXPECT_EQ(from_final.message(),
            "operation \"op-1\": the operation state machine has no move from ABORTED to FAILED");
  const absl::Status back = store_->TransitionOperation("op-1", v1::OPERATION_STATE_PLANNED,
                                                        v1::OPERATION_STATE_PENDING, {});
  EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition) << back;
  EXPECT_EQ(back.message(),
            "operation \"op-1\": the operation state machine has no move from PLANNED to PENDING");
  EXPECT_EQ(store_
                ->TransitionOperation("op-1", v1::OPERATION_STATE_PLANNED,
                                      v1::OPERATION_STATE_PLANNED, {})
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_P(OperationsTest, ThePlanningTransitionStoresThePredictionAndItsTime) {
  ASSERT_TRUE(store_->CreateOperation(Resize("op-1", "job-1", 1, target_)).ok());
  absl::StatusOr<OperationRecord> r = store_->GetOperation("op-1", false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->op.has_prediction());
  EXPECT_EQ(r->op.planned_unix_ms(), 0);
  OperationUpdate u;
  const v1::TransferPlan plan = PlanFor(spec_, target_);
  u.plan = &plan;
  u.prediction.emplace();
  u.prediction->set_seconds(2.5);
  u.prediction->set_critical_host("h3");
  u.prediction->add_hosts()->set_host("h3");
  ASSERT_TRUE(
      store_
          ->TransitionOperation("op-1", v1::OPERATION_STATE_PENDING, v1::OPERATION_STATE_PLANNED, u)
          .ok());
  r = store_->GetOperation("op-1", false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(MessageDifferencer::Equals(r->op.prediction(), *u.prediction));
  const int64_t planned = r->op.planned_unix_ms();
  EXPECT_GE(planned, r->op.created_unix_ms());
  EXPECT_EQ(r->op.actual_seconds(), 0);  // not over
  // A later transition without a plan keeps both.
  OperationUpdate abort;
  abort.error = "cancelled by client";
  ASSERT_TRUE(store_
                  ->TransitionOperation("op-1", v1::OPERATION_STATE_PLANNED,
                                        v1::OPERATION_STATE_ABORTED, abort)
                  .ok());
  r = store_->GetOperation("op-1", false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->op.planned_unix_ms(), planned);
  EXPECT_EQ(r->op.prediction().seconds(), 2.5);
  EXPECT_EQ(r->op.actual_seconds(), 0);  // it did not commit
}

TEST_P(OperationsTest, AbortDuringTransferDiscardsThePendingGeneration) {
  ASSERT_TRUE(store_->CreateOperation(Resize("op-1", "job-1", 1, target_)).ok());
  Plan("op-1");
  ASSERT_TRUE(store_
                  ->StartTransfer("op-1", {Progress("h0", v1::HOST_TASK_STATE_ASSIGNED),
                                           Progress("h2", v1::HOST_TASK_STATE_ASSIGNED)})
                  .ok());
  OperationUpdate why;
  why.error = "host \"h2\" lost (lease expired) during transfer";
  ASSERT_TRUE(store_
                  ->TransitionOperation("op-1", v1::OPERATION_STATE_TRANSFERRING,
                                        v1::OPERATION_STATE_ABORTED, why)
                  .ok());

  absl::StatusOr<v1::Job> job = store_->GetJob("job-1", false);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::JOB_STATE_ACTIVE);
  EXPECT_EQ(job->generation(), 1);
  EXPECT_TRUE(job->active_operation_id().empty());
  EXPECT_TRUE(MessageDifferencer::Equals(job->layout(), spec_.layout()));
  absl::StatusOr<std::vector<v1::GenerationRef>> discard = store_->GenerationsToDiscard("h2");
  ASSERT_TRUE(discard.ok());
  ASSERT_EQ(discard->size(), 1u);
  EXPECT_EQ((*discard)[0].job_id(), "job-1");
  EXPECT_EQ((*discard)[0].generation(), 2);
  EXPECT_TRUE(store_->GenerationsToDiscard("h0")->empty());  // no rank of gen 2 there
  EXPECT_TRUE(store_->AssignedOperations("h2")->empty());
  EXPECT_EQ(store_->GetOperation("op-1", false)->op.error(), why.error);

  // The discarded number is not reused: the next operation builds gen 3.
  absl::StatusOr<v1::Operation> next = store_->CreateOperation(Resize("op-2", "job-1", 1, target_));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->to_generation(), 3);
}

TEST_P(OperationsTest, FailingBeforeTransferReturnsTheJobToActive) {
  ASSERT_TRUE(store_->CreateOperation(Resize("op-1", "job-1", 1, target_)).ok());
  OperationUpdate why;
  why.error = std::string(5000, 'x') + "\xc3\xa9";
  ASSERT_TRUE(store_
                  ->TransitionOperation("op-1", v1::OPERATION_STATE_PENDING,
                                        v1::OPERATION_STATE_FAILED, why)
                  .ok());
  EXPECT_EQ(store_->GetJob("job-1", false)->state(), v1::JOB_STATE_ACTIVE);
  EXPECT_EQ(store_->GetOperation("op-1", false)->op.error(), std::string(4096, 'x'));
  EXPECT_TRUE(store_->ListActiveOperations()->empty());
  EXPECT_EQ(store_->CreateOperation(Resize("op-2", "job-1", 1, target_))->to_generation(), 2);
}

TEST_P(OperationsTest, ListOperationsForJobIsNewestFirst) {
  ASSERT_TRUE(store_->CreateOperation(Resize("op-1", "job-1", 1, target_)).ok());
  ASSERT_TRUE(store_
                  ->TransitionOperation("op-1", v1::OPERATION_STATE_PENDING,
                                        v1::OPERATION_STATE_ABORTED, {})
                  .ok());
  ASSERT_TRUE(store_->CreateOperation(Resize("op-2", "job-1", 1, target_)).ok());
  absl::StatusOr<std::vector<v1::Operation>> ops = store_->ListOperationsForJob("job-1");
  ASSERT_TRUE(ops.ok()) << ops.status();
  ASSERT_EQ(ops->size(), 2u);
  EXPECT_EQ((*ops)[0].id(), "op-2");
  EXPECT_EQ((*ops)[1].id(), "op-1");
  EXPECT_EQ(store_->ListOperationsForJob("job-x").status().code(), absl::StatusCode::kNotFound);
}

RESHARD_STORE_CONTRACT(OperationsTest);

}  // namespace
}  // namespace reshard::coordinator::store_test
