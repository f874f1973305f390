// Logic behind AgentService (what host agents call): registration, leases,
// each host's slice of a plan, progress. Thread-safe.
#pragma once

#include "absl/status/statusor.h"
#include "reshard/v1/agent.pb.h"
#include "services/coordinator/clock.h"
#include "services/coordinator/metrics/metrics.h"
#include "services/coordinator/store/store.h"

namespace reshard::coordinator {

class ClusterSecrets;

class AgentApi {
 public:
  struct Options {
    int64_t lease_ms = 10000;
    /// Derives each task's transfer secret (not owned); null: tasks carry
    /// none and agents send no proofs (unit tests).
    ClusterSecrets* secrets = nullptr;
  };

  /// `metrics` may be null.
  AgentApi(StorePtr store, const Clock* clock, CoordinatorMetrics* metrics, Options options);

  /// Registers a new incarnation of the host (a new epoch). The tasks the
  /// previous incarnation held and had not finished are FAILED (the driver
  /// aborts their operations: peers may have sent bytes to the dead
  /// process); jobs that count the host lost get it back when it holds their
  /// shards intact; the answer names the held jobs that were deleted.
  [[nodiscard]] absl::StatusOr<v1::RegisterAgentResponse> RegisterAgent(
      const v1::RegisterAgentRequest& request);
  /// Extends the lease and tells the agent what to do: operations assigned to
  /// it, generations to release and to discard, held jobs deleted.
  [[nodiscard]] absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request);
  /// The host's slice of an operation's plan (see task.h).
  [[nodiscard]] absl::StatusOr<v1::HostTask> GetTask(const v1::GetTaskRequest& request);
  [[nodiscard]] absl::StatusOr<v1::ReportProgressResponse> ReportProgress(
      const v1::ReportProgressRequest& request);

 private:
  /// FAILs the unfinished tasks of `host_id`'s incarnations before `epoch`.
  [[nodiscard]] absl::Status FailTasksOfEarlierIncarnation(const std::string& host_id,
                                                           int64_t epoch);
  /// Jobs that count `host_id` lost and whose current-generation ranks on it
  /// `request` reports sealed with the committed checksums get it back.
  [[nodiscard]] absl::Status RestoreReturnedHost(const v1::RegisterAgentRequest& request);
  /// Adds to `deleted` those of `held` (job ids an agent holds) that are
  /// deleted.
  [[nodiscard]] absl::Status AddDeletedJobs(
      const google::protobuf::RepeatedPtrField<std::string>& held,
      google::protobuf::RepeatedPtrField<std::string>* deleted);
  /// Adds to `release` the generations of `held` that are neither current
  /// nor pending.
  [[nodiscard]] absl::Status AddStaleGenerations(
      const google::protobuf::RepeatedPtrField<v1::HeldRank>& held,
      google::protobuf::RepeatedPtrField<v1::GenerationRef>* release);

  StorePtr store_;
  const Clock* clock_;
  CoordinatorMetrics* metrics_;
  Options options_;
};

}  // namespace reshard::coordinator
