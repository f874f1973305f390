// Store transfer phase (both stores: the contract suite): pending generation, host progress, checksums,
// commit, and what agents are told.
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include "tests/coordinator/store/store_fixture.h"

namespace reshard::coordinator::store_test {
namespace {

using google::protobuf::util::MessageDifferencer;

v1::ShardChecksum Sum(int item, int rank, uint64_t checksum, int64_t bytes) {
  v1::ShardChecksum c;
  c.set_item(item);
  c.set_rank(rank);
  c.set_checksum(checksum);
  c.set_bytes(bytes);
  return c;
}

class TransferTest : public StoreContractTest {
 protected:
  void SetUp() override {
    StoreContractTest::SetUp();
    spec_ = test_support::StoreSmallSpec("llama");
    // dp 1 -> 2: gen 2 puts ranks 0-3 on h0, h1 (as before) and 4-7 on h2, h3.
    target_ = test_support::MakeLayout(2, 2, 2, {"h0", "h1", "h2", "h3"}, 2);
    ASSERT_TRUE(store_->CreateJob("job-1", spec_, {}).ok());
    ASSERT_TRUE(store_->CreateOperation(Resize("op-1", "job-1", 1, target_)).ok());
    OperationUpdate u;
    const v1::TransferPlan plan = PlanFor(spec_, target_);
    u.plan = &plan;
    ASSERT_TRUE(store_
                    ->TransitionOperation("op-1", v1::OPERATION_STATE_PENDING,
                                          v1::OPERATION_STATE_PLANNED, u)
                    .ok());
  }

  void Start() {
    ASSERT_TRUE(store_
                    ->StartTransfer("op-1", {Progress("h0", v1::HOST_TASK_STATE_ASSIGNED, 0, 100),
                                             Progress("h1", v1::HOST_TASK_STATE_ASSIGNED, 0, 100),
                                             Progress("h2", v1::HOST_TASK_STATE_ASSIGNED, 0, 200),
                                             Progress("h3", v1::HOST_TASK_STATE_ASSIGNED, 0, 200)})
                    .ok());
  }

  v1::JobSpec spec_;
  v1::Layout target_;
};

TEST_P(TransferTest, StartTransferNeedsAPlannedOperation) {
  ASSERT_TRUE(store_
                  ->TransitionOperation("op-1", v1::OPERATION_STATE_PLANNED,
                                        v1::OPERATION_STATE_ABORTED, {})
                  .ok());
  const absl::Status s =
      store_->StartTransfer("op-1", {Progress("h0", v1::HOST_TASK_STATE_ASSIGNED)});
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(s.message(), "operation \"op-1\" is ABORTED, not PLANNED");
  EXPECT_EQ(store_->StartTransfer("op-x", {}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_
                ->StartTransfer("op-1", {Progress("h0", v1::HOST_TASK_STATE_ASSIGNED),
                                         Progress("h0", v1::HOST_TASK_STATE_ASSIGNED)})
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(TransferTest, ProgressIsRecordedPerHostAndSummed) {
  Start();
  EXPECT_EQ(store_->GetOperation("op-1", false)->op.state(), v1::OPERATION_STATE_TRANSFERRING);
  EXPECT_EQ(*store_->AssignedOperations("h2"), std::vector<std::string>{"op-1"});
  EXPECT_TRUE(store_->AssignedOperations("h9")->empty());

  ASSERT_TRUE(
      store_->RecordHostProgress("op-1", Progress("h2", v1::HOST_TASK_STATE_RUNNING, 50, 200), {})
          .ok());
  ASSERT_TRUE(
      store_->RecordHostProgress("op-1", Progress("h3", v1::HOST_TASK_STATE_DONE, 200, 200), {})
          .ok());
  // A late RUNNING report does not undo DONE.
  ASSERT_TRUE(
      store_->RecordHostProgress("op-1", Progress("h3", v1::HOST_TASK_STATE_RUNNING, 150, 0), {})
          .ok());
  absl::StatusOr<std::vector<HostProgress>> rows = store_->GetHostProgress("op-1");
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 4u);
  EXPECT_EQ((*rows)[2].host_id, "h2");
  EXPECT_EQ((*rows)[2].state, v1::HOST_TASK_STATE_RUNNING);
  EXPECT_EQ((*rows)[2].bytes_done, 50);
  EXPECT_EQ((*rows)[3].state, v1::HOST_TASK_STATE_DONE);
  EXPECT_EQ((*rows)[3].bytes_total, 200);
  EXPECT_EQ(store_->GetOperation("op-1", false)->op.bytes_done(), 50 + 150);
  // Done hosts are no longer assigned.
  EXPECT_TRUE(store_->AssignedOperations("h3")->empty());

  const absl::Status stranger =
      store_->RecordHostProgress("op-1", Progress("h9", v1::HOST_TASK_STATE_RUNNING), {});
  EXPECT_EQ(stranger.code(), absl::StatusCode::kNotFound) << stranger;
  EXPECT_EQ(store_->GetHostProgress("op-x").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(TransferTest, FailedHostKeepsItsError) {
  Start();
  HostProgress failed = Progress("h1", v1::HOST_TASK_STATE_FAILED, 10, 100);
  failed.error = "ucx: connection reset by peer";
  ASSERT_TRUE(store_->RecordHostProgress("op-1", failed, {}).ok());
  absl::StatusOr<std::vector<HostProgress>> rows = store_->GetHostProgress("op-1");
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ((*rows)[1].state, v1::HOST_TASK_STATE_FAILED);
  EXPECT_EQ((*rows)[1].error, failed.error);
}

TEST_P(TransferTest, CommitMakesThePendingGenerationCurrentInOneGo) {
  Start();
  const std::vector<v1::ShardChecksum> h2_sums = {Sum(0, 4, 0xdeadbeefcafef00dULL, 512),
                                                  Sum(3, 4, 7, 64), Sum(0, 5, 1, 512)};
  const std::vector<v1::ShardChecksum> h3_sums = {Sum(1, 6, 0xffffffffffffffffULL, 96),
                                                  Sum(2, 7, 42, 256)};
  ASSERT_TRUE(
      store_
          ->RecordHostProgress("op-1", Progress("h2", v1::HOST_TASK_STATE_DONE, 200, 200), h2_sums)
          .ok());
  ASSERT_TRUE(
      store_
          ->RecordHostProgress("op-1", Progress("h3", v1::HOST_TASK_STATE_DONE, 200, 200), h3_sums)
          .ok());
  // Checksums for a rank the pending generation does not have: rejected whole.
  EXPECT_EQ(
      store_
          ->RecordHostProgress("op-1", Progress("h0", v1::HOST_TASK_STATE_DONE), {Sum(0, 99, 1, 1)})
          .code(),
      absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(store_->GetJob("job-1", false)->layout_epoch(), 0);
  ASSERT_TRUE(store_->CommitOperation("op-1").ok());

  absl::StatusOr<v1::Job> job = store_->GetJob("job-1", false);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->generation(), 2);
  EXPECT_EQ(job->layout_epoch(), 1);  // a resize: the layout's world changes
  EXPECT_EQ(job->state(), v1::JOB_STATE_ACTIVE);
  EXPECT_TRUE(job->active_operation_id().empty());
  EXPECT_TRUE(MessageDifferencer::Equals(job->layout(), target_));
  absl::StatusOr<OperationRecord> op = store_->GetOperation("op-1", false);
  EXPECT_EQ(op->op.state(), v1::OPERATION_STATE_COMMITTED);
  EXPECT_TRUE(store_->ListActiveOperations()->empty());

  // Generation 1 (ranks on h0, h1) is retired; agents there may free it.
  absl::StatusOr<std::vector<v1::GenerationRef>> release = store_->GenerationsToRelease("h0");
  ASSERT_TRUE(release.ok());
  ASSERT_EQ(release->size(), 1u);
  EXPECT_EQ((*release)[0].generation(), 1);
  EXPECT_TRUE(store_->GenerationsToRelease("h2")->empty());
  EXPECT_TRUE(store_->GenerationsToDiscard("h0")->empty());

  absl::StatusOr<std::vector<v1::ShardChecksum>> sums = store_->GetGenerationChecksums("job-1", 2);
  ASSERT_TRUE(sums.ok()) << sums.status();
  std::vector<v1::ShardChecksum> expected = {h2_sums[0], h2_sums[1], h2_sums[2], h3_sums[0],
                                             h3_sums[1]};
  ASSERT_EQ(sums->size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(MessageDifferencer::Equals((*sums)[i], expected[i])) << (*sums)[i].DebugString();
  }

  // Everything after the commit is refused.
  const absl::Status again = store_->CommitOperation("op-1");
  EXPECT_EQ(again.code(), absl::StatusCode::kAborted) << again;
  EXPECT_EQ(again.message(), "operation \"op-1\" is COMMITTED, not TRANSFERRING");
  const absl::Status late =
      store_->RecordHostProgress("op-1", Progress("h2", v1::HOST_TASK_STATE_DONE), {});
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  // The next operation starts from generation 2.
  EXPECT_EQ(store_->CreateOperation(Resize("op-2", "job-1", 2, spec_.layout()))->to_generation(),
            3);
}

TEST_P(TransferTest, CommitNeedsATransferringOperation) {
  const absl::Status s = store_->CommitOperation("op-1");
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(store_->GetJob("job-1", false)->generation(), 1);
  EXPECT_EQ(store_->CommitOperation("op-x").code(), absl::StatusCode::kNotFound);
}

RESHARD_STORE_CONTRACT(TransferTest);

}  // namespace
}  // namespace reshard::coordinator::store_test
