// The coordinator's Prometheus metrics, declared in one place.
// Names: reshard_coordinator_<thing>_<unit>. Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "reshard/v1/agent.pb.h"
#include "reshard/v1/coordinator.pb.h"

namespace prometheus {
class Registry;
}

namespace reshard::coordinator {

class CoordinatorMetrics {
 public:
  /// Registers every family in `registry`.
  explicit CoordinatorMetrics(std::shared_ptr<prometheus::Registry> registry);
  ~CoordinatorMetrics();

  /// reshard_coordinator_operations_total{kind, result} and
  /// reshard_coordinator_operation_duration_seconds{kind} (histogram).
  void OperationFinished(v1::OperationKind kind, v1::OperationState result, double seconds);
  /// reshard_coordinator_stop_free_seconds{phase="prepare"|"pause"}
  /// (histogram), at a stop-free operation's commit (Operation's
  /// prepare_seconds and pause_seconds).
  void StopFreeCommitted(double prepare_seconds, double pause_seconds);
  /// reshard_coordinator_operation_prediction_ratio{kind} (histogram): a
  /// committed operation's actual seconds over the cost model's prediction
  /// (docs/scheduler.md); reshard_coordinator_host_cpu_seconds_per_gb{host}
  /// (gauge) is set by HostCpuPerByte.
  void PredictionChecked(v1::OperationKind kind, double actual_seconds, double predicted_seconds);
  /// reshard_coordinator_host_cpu_seconds_per_gb{host}: the agent's CPU
  /// seconds per GB its tasks moved, as the cost model learned it.
  void HostCpuPerByte(const std::string& host, double cpu_seconds_per_byte);
  /// reshard_coordinator_stop_free_bytes_total{kind="precopied"|
  /// "skipped_unchanged"}: a prepared operation's transfer started.
  void PreparedBytes(int64_t precopied, int64_t skipped_unchanged);
  /// reshard_coordinator_planned_bytes_total{locality="local"|"cross_host"}.
  void PlannedBytes(int64_t local, int64_t cross_host);
  /// reshard_coordinator_jobs{state} (gauge).
  void SetJobs(v1::JobState state, int64_t count);
  /// reshard_coordinator_jobs_with_lost_hosts (gauge).
  void SetJobsWithLostHosts(int64_t count);
  /// reshard_coordinator_hosts{state} (gauge).
  void SetHosts(v1::HostState state, int64_t count);
  /// reshard_coordinator_rpc_duration_seconds{method, code} (histogram).
  void RpcDone(const std::string& method, const std::string& code, double seconds);
  /// reshard_coordinator_store_duration_seconds{statement} (histogram).
  void StoreStatement(const std::string& statement, double seconds);
  /// reshard_coordinator_active_operations{state} (gauge: pending, planned,
  /// transferring) and reshard_coordinator_oldest_active_operation_seconds
  /// (gauge: age of the oldest unfinished operation, 0 when none).
  void SetActiveOperations(v1::OperationState state, int64_t count);
  void SetOldestActiveOperationSeconds(double seconds);
  /// reshard_coordinator_leader (gauge, 1 on the replica driving operations).
  void SetLeader(bool leader);
  /// reshard_coordinator_retention_pruned_rows_total{table} (counter: rows
  /// the retention policy deleted from `table`, "generations" or
  /// "operations"; rows deleted with them by ON DELETE CASCADE not counted).
  void RetentionPruned(const std::string& table, int64_t rows);
  /// reshard_coordinator_watch_streams{method} (gauge: WatchJob and
  /// WatchOperation streams open now, server/stream_limits.h).
  void SetWatchStreams(const std::string& method, int64_t count);
  /// reshard_coordinator_watch_streams_refused_total{limit="per_identity"|
  /// "total"} (counter: streams refused RESOURCE_EXHAUSTED by that limit).
  void WatchStreamRefused(const std::string& limit);
  /// reshard_coordinator_lease_judgement_suspended_total{reason="late_pass"|
  /// "heartbeat_backlog"|"mass_expiry"} (counter: driver passes that judged
  /// no lease because the coordinator doubted itself, logic/lease_judge.h)
  /// and reshard_coordinator_lease_judgement_suspended (gauge: 1 while it
  /// does; `reason` "" clears it).
  void LeaseJudgementSuspended(const std::string& reason);
  /// reshard_coordinator_agent_heartbeat_lag_seconds (histogram: how much
  /// later than planned each agent's heartbeat left, as the agent measured).
  void AgentHeartbeatLag(double seconds);

  std::shared_ptr<prometheus::Registry> registry() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace reshard::coordinator
