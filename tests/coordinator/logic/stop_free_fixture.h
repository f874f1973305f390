// The fixture of the stop-free tests (stop_free_test.cc,
// stop_free_prepare_test.cc): a job with a dataset state, stop-free
// resizes, MarkPrepared, cut-over checkpoints, and the agents' prepare
// played through AgentApi (docs/coordinator.md, "Agents prepare").
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "services/coordinator/logic/task.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {

class StopFreeTest : public LogicTest {
 protected:
  static constexpr int64_t kBatch = 8;
  using ChecksumOf = std::function<uint64_t(int item, int rank)>;

  v1::Job RegisterWithData(const std::string& name) {
    v1::RegisterJobRequest r;
    *r.mutable_spec() = test_support::TwoLayerJob(name);
    v1::DatasetState* d = r.mutable_dataset_state();
    d->mutable_dataset()->set_id("tokens");
    d->mutable_dataset()->set_num_samples(1000);
    d->mutable_dataset()->set_fingerprint("sha1:abc");
    d->mutable_order()->set_seed(7);
    d->mutable_order()->set_shuffle(v1::SHUFFLE_FULL);
    d->set_global_batch(kBatch);
    absl::StatusOr<v1::RegisterJobResponse> reply = api_->RegisterJob(r);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? reply->job() : v1::Job();
  }

  absl::StatusOr<v1::Operation> StopFreeResize(const v1::Job& job, const v1::Layout& target) {
    v1::ResizeRequest r;
    r.set_job_id(job.id());
    r.set_expected_generation(job.generation());
    *r.mutable_placement() = target.placement();
    *r.mutable_config() = target.config();
    r.set_stop_free(true);
    return api_->Resize(r);
  }

  absl::StatusOr<v1::Operation> MarkPrepared(const std::string& operation_id) {
    v1::MarkPreparedRequest r;
    r.set_operation_id(operation_id);
    return api_->MarkPrepared(r);
  }

  /// The old layout's checkpoint of `step` (cursor step x kBatch), cutting
  /// over `operation_id` when non-empty.
  absl::StatusOr<v1::Operation> CheckpointAt(const v1::Job& job, int64_t step,
                                             const std::string& operation_id) {
    v1::CheckpointRequest r;
    r.set_job_id(job.id());
    r.set_expected_generation(Job(job.id()).generation());
    r.set_with_step(true);
    r.set_step(step);
    r.set_cursor(step * kBatch);
    r.set_layout_fingerprint(job.dataset_state().layout_fingerprint());
    r.set_cut_over_operation_id(operation_id);
    return api_->Checkpoint(r);
  }

  void CompleteAll(const std::string& operation_id) {
    for (const std::string& host : Participants(operation_id)) CompleteTask(host, operation_id);
  }

  /// The operation's stored plan.
  v1::TransferPlan PlanOf(const std::string& operation_id) {
    absl::StatusOr<OperationRecord> record = store_->GetOperation(operation_id, true);
    EXPECT_TRUE(record.ok()) << record.status();
    return record.ok() && record->plan.has_value() ? *record->plan : v1::TransferPlan();
  }

  absl::StatusOr<v1::HostTask> GetTask(const std::string& host, const std::string& operation_id) {
    v1::GetTaskRequest r;
    r.set_host_id(host);
    r.set_operation_id(operation_id);
    return agents_->GetTask(r);
  }

  /// A PREPARED report of `host` naming `sum` for every source shard it
  /// reads (the checksums of generation G the prepare copied from).
  v1::ReportProgressRequest PreparedReport(const std::string& host, const std::string& operation_id,
                                           const ChecksumOf& sum = ShardChecksumOf) {
    v1::ReportProgressRequest r;
    r.set_host_id(host);
    r.set_operation_id(operation_id);
    r.set_state(v1::HOST_TASK_STATE_PREPARED);
    for (const auto& [item, rank] : ShardsReadOnHost(PlanOf(operation_id), host)) {
      v1::ShardChecksum* c = r.add_source_checksums();
      c->set_item(item);
      c->set_rank(rank);
      c->set_checksum(sum(item, rank));
      c->set_bytes(4);  // as CompleteTask reports them
    }
    return r;
  }

  /// What a well-behaved agent does with its prepare task: GetTask
  /// (prepare), RUNNING, then PREPARED (PreparedReport).
  void PrepareHost(const std::string& host, const std::string& operation_id,
                   const ChecksumOf& sum = ShardChecksumOf) {
    absl::StatusOr<v1::HostTask> task = GetTask(host, operation_id);
    ASSERT_TRUE(task.ok()) << host << ": " << task.status();
    ASSERT_TRUE(task->prepare()) << host;
    v1::ReportProgressRequest running;
    running.set_host_id(host);
    running.set_operation_id(operation_id);
    running.set_state(v1::HOST_TASK_STATE_RUNNING);
    ASSERT_TRUE(agents_->ReportProgress(running).ok());
    absl::StatusOr<v1::ReportProgressResponse> reply =
        agents_->ReportProgress(PreparedReport(host, operation_id, sum));
    ASSERT_TRUE(reply.ok()) << host << ": " << reply.status();
    EXPECT_FALSE(reply->abort());
  }

  void PrepareAll(const std::string& operation_id, const ChecksumOf& sum = ShardChecksumOf) {
    for (const std::string& host : Participants(operation_id)) PrepareHost(host, operation_id, sum);
  }

  /// The hosts of the operation's plan (every one gets a task row).
  std::vector<std::string> PlanHosts(const std::string& operation_id) {
    std::vector<std::string> hosts;
    for (const auto& [host, bytes] : BytesWrittenByHost(PlanOf(operation_id))) {
      hosts.push_back(host);
    }
    return hosts;
  }
};

}  // namespace reshard::coordinator::testing
