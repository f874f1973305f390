// Contract tests written for both stores from the start (the others were
// PgStore's tests first): change-feed versions (migrations/0016, 0020), dataset
// steps, rank failures, and the lost hosts of jobs.
#include <gtest/gtest.h>

#include "tests/coordinator/store/store_fixture.h"

namespace reshard::coordinator::store_test {
namespace {

using ContractTest = StoreContractTest;

v1::DatasetState Dataset() {
  v1::DatasetState d;
  d.mutable_dataset()->set_id("tokens");
  d.mutable_dataset()->set_num_samples(1000);
  d.set_global_batch(10);
  d.set_layout_fingerprint("sha256:a");
  return d;
}

StepCommit Step(int64_t generation, int64_t step) {
  return StepCommit{"job-1", generation, step, step * 10, "sha256:a"};
}

int64_t JobVersion(Store& store, const std::string& job_id) {
  absl::StatusOr<v1::Job> job = store.GetJob(job_id, false);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? job->version() : -1;
}

int64_t OpVersion(Store& store, const std::string& operation_id) {
  absl::StatusOr<OperationRecord> op = store.GetOperation(operation_id, false);
  EXPECT_TRUE(op.ok()) << op.status();
  return op.ok() ? op->op.version() : -1;
}

// Versions are per job and per operation (migration 0020): each committed
// change of a job (one transaction, however many of its rows it writes)
// advances that job's version by exactly 1, whatever other jobs do; a read or
// a heartbeat takes none. So a tenant's versions tell it nothing about other
// tenants' changes (issue 31, defect 8: one global sequence told it how many
// changes others committed between two of its own versions).
TEST_P(ContractTest, EveryChangeOfAJobAdvancesItsOwnVersionByOne) {
  const v1::JobSpec spec = test_support::StoreSmallSpec("llama", "team-a");
  const v1::DatasetState dataset = Dataset();
  ASSERT_TRUE(store_->CreateJob("job-1", spec, {}, &dataset).ok());
  ASSERT_TRUE(
      store_->CreateJob("job-2", test_support::StoreSmallSpec("other", "team-b"), {}, &dataset)
          .ok());
  EXPECT_EQ(JobVersion(*store_, "job-1"), 1);  // its dataset state is the same change
  EXPECT_EQ(JobVersion(*store_, "job-2"), 1);
  EXPECT_EQ(JobVersion(*store_, "job-1"), 1);  // a read changes nothing

  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h0"), 1000, 2000).ok());
  ASSERT_TRUE(store_->Heartbeat("h0", 1, 1500, 3000).ok());
  EXPECT_EQ(JobVersion(*store_, "job-1"), 1);

  // Interleaved with the other tenant's changes: +1 per own change, never more.
  auto step_of = [](const std::string& job, int64_t step) {
    return StepCommit{job, 1, step, step * 10, "sha256:a"};
  };
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(store_->CommitStep(step_of("job-2", 2 * step - 1)).ok());
    ASSERT_TRUE(store_->CommitStep(step_of("job-2", 2 * step)).ok());
    ASSERT_TRUE(store_->CommitStep(step_of("job-1", step)).ok());
    EXPECT_EQ(JobVersion(*store_, "job-1"), 1 + step) << "step " << step;
    EXPECT_EQ(JobVersion(*store_, "job-2"), 1 + 2 * step) << "step " << step;
  }
  ASSERT_TRUE(store_->CommitStep(step_of("job-1", 3)).ok());  // a retry: nothing written
  EXPECT_EQ(JobVersion(*store_, "job-1"), 4);
  RankFailureReport other_failure{"job-2", 1, 0, "oom", "worker"};
  ASSERT_TRUE(store_->RecordRankFailure(other_failure).ok());
  RankFailureReport failure{"job-1", 1, 2, "oom", "worker"};
  ASSERT_TRUE(store_->RecordRankFailure(failure).ok());
  EXPECT_EQ(JobVersion(*store_, "job-1"), 5);
  EXPECT_EQ(JobVersion(*store_, "job-2"), 8);

  // A new operation and each of its moves: the operation's own versions
  // count from 1; the job shows its active operation (one change each).
  const v1::Layout target = test_support::MakeLayout(2, 2, 2, {"h0", "h1", "h2", "h3"}, 2);
  ASSERT_TRUE(store_->CreateOperation(Resize("op-1", "job-1", 1, target)).ok());
  EXPECT_EQ(OpVersion(*store_, "op-1"), 1);
  EXPECT_EQ(JobVersion(*store_, "job-1"), 6);
  OperationUpdate update;
  const v1::TransferPlan plan = PlanFor(spec, target);
  update.plan = &plan;
  ASSERT_TRUE(store_
                  ->TransitionOperation("op-1", v1::OPERATION_STATE_PENDING,
                                        v1::OPERATION_STATE_PLANNED, update)
                  .ok());
  EXPECT_EQ(OpVersion(*store_, "op-1"), 2);
  EXPECT_EQ(JobVersion(*store_, "job-1"), 7);  // its state shows on the job
  ASSERT_TRUE(store_
                  ->StartTransfer("op-1", {Progress("h0", v1::HOST_TASK_STATE_ASSIGNED),
                                           Progress("h2", v1::HOST_TASK_STATE_ASSIGNED)})
                  .ok());
  EXPECT_EQ(OpVersion(*store_, "op-1"), 3);
  EXPECT_EQ(JobVersion(*store_, "job-1"), 8);
  ASSERT_TRUE(
      store_->RecordHostProgress("op-1", Progress("h2", v1::HOST_TASK_STATE_RUNNING, 5, 10), {})
          .ok());
  EXPECT_EQ(OpVersion(*store_, "op-1"), 4);
  const int64_t before_commit = JobVersion(*store_, "job-1");
  ASSERT_TRUE(store_->CommitOperation("op-1").ok());
  EXPECT_EQ(OpVersion(*store_, "op-1"), 5);
  EXPECT_EQ(JobVersion(*store_, "job-1"), before_commit + 1);
  EXPECT_EQ(JobVersion(*store_, "job-2"), 8);  // another job's changes are not its own

  // A host of the job's current generation lost, then back: one change of
  // each job that has ranks on it, each.
  ASSERT_TRUE(store_->ExpireLeases(1'000'000).ok());
  EXPECT_EQ(JobVersion(*store_, "job-1"), before_commit + 2);
  EXPECT_EQ(JobVersion(*store_, "job-2"), 9);  // h0 holds ranks of job-2 too
  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h0"), 2000, 3000).ok());
  EXPECT_EQ(JobVersion(*store_, "job-1"), before_commit + 3);
}

TEST_P(ContractTest, DatasetStepsRankFailuresAndLostHostsOfAJob) {
  const v1::JobSpec spec = test_support::StoreSmallSpec("llama");
  const v1::DatasetState dataset = Dataset();
  ASSERT_TRUE(store_->CreateJob("job-1", spec, {}, &dataset).ok());
  absl::StatusOr<v1::DatasetState> stepped = store_->CommitStep(Step(1, 2));
  ASSERT_TRUE(stepped.ok()) << stepped.status();
  EXPECT_EQ(stepped->step(), 2);
  EXPECT_EQ(stepped->cursor(), 20);
  EXPECT_EQ(stepped->committed_generation(), 1);
  EXPECT_EQ(store_->GetJob("job-1", false)->dataset_state().cursor(), 20);
  const absl::Status stale = store_->CommitStep(Step(2, 3)).status();
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
  EXPECT_EQ(store_->CommitStep(StepCommit{"nope", 1, 1, 10, ""}).status().code(),
            absl::StatusCode::kNotFound);

  RankFailureReport failure{"job-1", 1, 3, "oom", "worker"};
  ASSERT_TRUE(store_->RecordRankFailure(failure).ok());
  failure.reason = "nccl timeout";
  ASSERT_TRUE(store_->RecordRankFailure(failure).ok());  // replaces the reason
  failure.rank = 1;
  ASSERT_TRUE(store_->RecordRankFailure(failure).ok());
  absl::StatusOr<v1::Job> job = store_->GetJob("job-1", false);
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->failed_ranks_size(), 2);
  EXPECT_EQ(job->failed_ranks(0).rank(), 1);
  EXPECT_EQ(job->failed_ranks(1).rank(), 3);
  EXPECT_EQ(job->failed_ranks(1).reason(), "nccl timeout");
  failure.generation = 2;
  const absl::Status aborted = store_->RecordRankFailure(failure).status();
  EXPECT_EQ(aborted.code(), absl::StatusCode::kAborted) << aborted;
  EXPECT_EQ(aborted.message(), "job \"job-1\" is at generation 1, not 2 any more; retry");

  // h0 holds ranks of generation 1: its lease runs out, the job is DEGRADED
  // until the host comes back with the shards and is restored.
  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h0"), 1000, 2000).ok());
  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h1"), 1000, 9000).ok());
  EXPECT_EQ(*store_->ExpireLeases(3000), std::vector<std::string>{"h0"});
  EXPECT_EQ(*store_->JobsLostOnHost("h0"), std::vector<std::string>{"job-1"});
  EXPECT_EQ(*store_->SettleJobLiveness("job-1"), v1::JOB_STATE_DEGRADED);
  job = store_->GetJob("job-1", false);
  EXPECT_EQ(std::vector<std::string>(job->lost_hosts().begin(), job->lost_hosts().end()),
            std::vector<std::string>{"h0"});
  ASSERT_TRUE(store_->RegisterHost(test_support::MakeHost("h0"), 3500, 9000).ok());
  EXPECT_EQ(store_->GetJob("job-1", false)->state(), v1::JOB_STATE_DEGRADED);  // still persisted
  ASSERT_TRUE(store_->RestoreLostHost("job-1", "h0").ok());
  EXPECT_EQ(store_->GetJob("job-1", false)->state(), v1::JOB_STATE_ACTIVE);
  EXPECT_TRUE(store_->JobsLostOnHost("h0")->empty());
  EXPECT_TRUE(store_->GetJob("job-1", false)->lost_hosts().empty());
  EXPECT_EQ(*store_->DeletedJobs({"job-9", "job-1", "job-8"}),
            (std::vector<std::string>{"job-9", "job-8"}));
}

// Operation.phase is derived, not stored: both stores fill it from the row
// (SetDerivedFields, operation_machine.h) on every read.
TEST_P(ContractTest, OperationPhaseIsReadOffTheRow) {
  ASSERT_TRUE(store_->CreateJob("job-1", test_support::StoreSmallSpec("llama"), {}).ok());
  const v1::Layout target = test_support::MakeLayout(2, 2, 2, {"h0", "h1", "h2", "h3"}, 2);
  absl::StatusOr<v1::Operation> created =
      store_->CreateOperation(Resize("op-1", "job-1", 1, target));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->phase(), "PENDING");
  absl::StatusOr<OperationRecord> r = store_->GetOperation("op-1", false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->op.phase(), "PENDING");

  OperationUpdate cancel;
  cancel.error = "cancelled by client";
  ASSERT_TRUE(store_
                  ->TransitionOperation("op-1", v1::OPERATION_STATE_PENDING,
                                        v1::OPERATION_STATE_ABORTED, cancel)
                  .ok());
  r = store_->GetOperation("op-1", false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->op.state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_EQ(r->op.phase(), "ABORTED");
  // ABORTED is final: the state machine has no move out of it.
  const absl::Status again = store_->TransitionOperation(
      "op-1", v1::OPERATION_STATE_ABORTED, v1::OPERATION_STATE_FAILED, {});
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
}

RESHARD_STORE_CONTRACT(ContractTest);

}  // namespace
}  // namespace reshard::coordinator::store_test
