// Logic behind AgentService (what host agents call): registration, leases,
// each host's slice of a plan, progress. Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cost/model.h"
#include "reshard/v1/agent.pb.h"
#include "services/coordinator/clock.h"
#include "services/coordinator/logic/task_notifier.h"
#include "services/coordinator/metrics/metrics.h"
#include "services/coordinator/store/store.h"

namespace reshard::coordinator {

class ClusterSecrets;

/// Checks a report's list of shard checksums (field `field`): each entry
/// names a shard of `expected`, at most once, with bytes >= 0; `not_expected`
/// ends the message for an entry outside it (" is not a shard the plan
/// writes on host ..."). InvalidArgument naming the entry's index otherwise.
/// Used for DONE's checksums and PREPARED's source_checksums.
absl::Status CheckShardChecksums(absl::string_view field,
                                 const google::protobuf::RepeatedPtrField<v1::ShardChecksum>& sums,
                                 const std::set<std::pair<int, int>>& expected,
                                 absl::string_view not_expected);

/// WaitForTasks' re-read of the store when no notification came.
inline constexpr int kTaskSafetyRereadMs = 1000;
/// WaitForTasks' longest wait (and its wait for wait_ms 0).
inline constexpr int kMaxTaskWaitMs = 10000;

class AgentApi {
 public:
  struct Options {
    int64_t lease_ms = 10000;
    /// Derives each task's transfer secret (not owned); null: tasks carry
    /// none and agents send no proofs (unit tests).
    ClusterSecrets* secrets = nullptr;
    /// Called (on the reporting thread) after a final report (PREPARED,
    /// DONE, FAILED) is recorded, so that the leader's driver acts on it at
    /// once (LeaderLoop::Kick); may be empty. Must be thread-safe and quick.
    std::function<void()> on_final_report = nullptr;
    /// Wakes WaitForTasks when a host's tasks change (not owned; must
    /// outlive this). Null: WaitForTasks re-reads the store every
    /// wait_poll_ms instead.
    TaskNotifier* notifier = nullptr;
    /// Without a notifier, WaitForTasks polls the store this often.
    int wait_poll_ms = 20;
    /// With one, it re-reads the store at least this often all the same, so
    /// that a lost notification costs at most this much.
    int safety_reread_ms = kTaskSafetyRereadMs;
    /// The cost model (docs/scheduler.md; not owned, outlives this); null: DONE reports teach
    /// nothing.
    cost::CostModel* cost = nullptr;
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
  /// Heartbeat of many hosts with one store call (Store::HeartbeatHosts;
  /// heartbeat_batcher.h): one answer per request, in order. A request's
  /// own error (a bad field, an unknown host, a stale epoch) is its answer
  /// alone; a store failure is every answer's.
  [[nodiscard]] std::vector<absl::StatusOr<v1::HeartbeatResponse>> HeartbeatMany(
      const std::vector<const v1::HeartbeatRequest*>& requests);
  /// The host's slice of an operation's plan (see task.h).
  [[nodiscard]] absl::StatusOr<v1::HostTask> GetTask(const v1::GetTaskRequest& request);
  [[nodiscard]] absl::StatusOr<v1::ReportProgressResponse> ReportProgress(
      const v1::ReportProgressRequest& request);
  /// Long poll (agent_prepare.cc): the host's assigned operations as soon as
  /// one is not in `known_operations`, or after wait_ms (0 or over 10000:
  /// 10000) as they are; earlier when `cancelled` (may be empty) says so
  /// (asked every 100 ms while it sleeps). With a notifier it sleeps until the
  /// host's tasks change, re-reading the store every safety_reread_ms.
  [[nodiscard]] absl::StatusOr<v1::WaitForTasksResponse> WaitForTasks(
      const v1::WaitForTasksRequest& request, const std::function<bool()>& cancelled = {});

  /// The pieces of WaitForTasks for a poll that holds no thread (task_waits.h):
  /// checks the request (fields, the host exists) and returns how long it
  /// waits in ms.
  [[nodiscard]] absl::StatusOr<int> CheckWaitForTasks(const v1::WaitForTasksRequest& request);
  /// The operations assigned to each of `host_ids` now (one store read;
  /// a host with none may be absent).
  [[nodiscard]] absl::StatusOr<std::map<std::string, std::vector<std::string>>>
  AssignedOperationsOfHosts(const std::vector<std::string>& host_ids);
  const Options& options() const { return options_; }

 private:
  /// Exports the agent's own scheduling lag and logs a host that is late by
  /// a heartbeat period or more.
  void NoteAgentHealth(const v1::HeartbeatRequest& request);
  /// The answer to `host_id`'s report of `state` for `op` (as read now), an
  /// operation that left TRANSFERRING: taken when it is a DONE for a
  /// COMMITTED operation whose row of the host is DONE (a retry of the report
  /// that committed it), else "abort". A store error is returned, never read
  /// as "abort" (on which the agent drops the generation it wrote).
  [[nodiscard]] absl::StatusOr<v1::ReportProgressResponse> AnswerAfterTransfer(
      const v1::Operation& op, const std::string& host_id, v1::HostTaskState state);

  /// A stop-free operation's prepare-phase task and transfer-phase task
  /// (agent_prepare.cc; docs/coordinator.md, "Agents prepare"): sets
  /// prepare / prepared, the generations and the plan slice of `task`.
  static void ShapePreparedTask(const OperationRecord& record, const std::string& host_id,
                                v1::HostTask* task);
  /// The states a report may carry in the operation's phase, and for
  /// PREPARED its source checksums; InvalidArgument naming the field.
  static absl::Status CheckReportForPhase(const OperationRecord& record,
                                          const v1::ReportProgressRequest& request);
  /// Records a PREPARED report; true when the operation left its prepare
  /// phase meanwhile (the agent must stop).
  [[nodiscard]] absl::StatusOr<bool> RecordPrepared(const OperationRecord& record,
                                                    const v1::ReportProgressRequest& request);
  void FinalReported() const;
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

  /// Whether `host_id` is registered. Hosts are never deleted, so a host
  /// registered here or read once is known for good: a long poll reads its
  /// host only when this replica has not seen it (10,000 hosts re-poll about
  /// 1,000 times a second, and all at once when they register).
  [[nodiscard]] absl::Status RequireRegistered(const std::string& host_id);

  StorePtr store_;
  const Clock* clock_;
  CoordinatorMetrics* metrics_;
  Options options_;
  std::mutex known_mu_;
  std::set<std::string> known_hosts_;  // guarded by known_mu_
};

}  // namespace reshard::coordinator
