// The agent's Prometheus metrics, declared in one place. Names:
// reshard_agent_<thing>_<unit>. Serving them (prometheus-cpp::pull, the
// --metrics-listen flag) is main.cc's business. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "agent/process/busy_meter.h"

namespace prometheus {
class Collectable;
class Registry;
}  // namespace prometheus

namespace reshard::agent {

/// How a host task ended, the `result` label of the task metrics.
enum class TaskResult { kDone, kFailed, kAborted };

/// "done", "failed", "aborted".
const char* TaskResultLabel(TaskResult result);

class AgentMetrics {
 public:
  /// Registers every family in `registry`.
  explicit AgentMetrics(std::shared_ptr<prometheus::Registry> registry,
                        std::function<ProcessUsage()> usage = SampleProcessUsage);
  ~AgentMetrics();
  AgentMetrics(const AgentMetrics&) = delete;
  AgentMetrics& operator=(const AgentMetrics&) = delete;

  /// reshard_agent_tasks_started_total, reshard_agent_tasks_running +1.
  /// Returns the task's token for TaskFinished. The first task of a busy
  /// period (no task ran before it) starts the period's cost (BusyMeter).
  int64_t TaskStarted();
  /// reshard_agent_task_progress_bytes / reshard_agent_task_total_bytes
  /// (gauges, summed over running tasks) move by the deltas;
  /// reshard_agent_task_bytes_written_total grows by a positive `done_delta`.
  void TaskProgress(int64_t done_delta, int64_t total_delta);
  /// The bytes TaskProgress counted written so far (what the heartbeat
  /// tells): reshard_agent_task_bytes_written_total's value (a double, exact
  /// up to 2^53 bytes).
  int64_t bytes_written() const;
  /// reshard_agent_tasks_finished_total{result},
  /// reshard_agent_task_duration_seconds{result} (histogram),
  /// reshard_agent_tasks_running -1. The last task of a busy period adds
  /// its cost: reshard_agent_task_cpu_seconds_total and
  /// reshard_agent_task_context_switches_total{kind} (counters), and
  /// reshard_agent_task_cpu_seconds_per_gb and
  /// reshard_agent_task_wakeups_per_mb (gauges: the period's CPU seconds per
  /// GB written and voluntary context switches per MB written; unchanged by
  /// a period that wrote nothing).
  void TaskFinished(int64_t token, TaskResult result, double seconds);
  /// reshard_agent_tasks_by_route_total{route}: a task took `route`
  /// (TaskExecutor::ExecuteInfo::route).
  void TaskRouted(const std::string& route);

  /// reshard_agent_shard_store_used_bytes, reshard_agent_shard_store_limit_bytes,
  /// reshard_agent_generations_held, reshard_agent_rank_buffers_held (gauges).
  void SetShardStore(int64_t used_bytes, int64_t limit_bytes, int64_t generations,
                     int64_t rank_buffers);

  /// reshard_agent_device_used_bytes{device} and
  /// reshard_agent_device_limit_bytes{device} (gauges): device bytes of the
  /// device store's rank buffers on each device, and its limit there.
  void SetDeviceStore(int device, int64_t used_bytes, int64_t limit_bytes);

  /// reshard_agent_pinned_host_bytes (gauge) and
  /// reshard_agent_pinned_host_registrations_total (counter): the device
  /// store's pinned host memory registered now, and the registrations made
  /// since the agent started (`registrations`, a running total: the counter
  /// advances by what it grew). Agents without a device API never call it,
  /// so they export neither series.
  void SetPinnedHost(int64_t registered_bytes, int64_t registrations);

  /// reshard_agent_worker_cache_bytes and
  /// reshard_agent_worker_cache_entries{kind="generation"|"token"} (gauges):
  /// what the worker service's job cache holds (job_cache.h).
  void SetWorkerCache(int64_t bytes, int64_t generations, int64_t tokens);

  /// reshard_agent_coordinator_reachable (gauge 0/1); a failure also counts
  /// reshard_agent_heartbeat_failures_total.
  void HeartbeatDone(bool ok);
  /// reshard_agent_registrations_total{result="ok"|"error"}.
  void RegisterDone(bool ok);

  /// reshard_agent_worker_rpc_duration_seconds{method, code} (histogram).
  void WorkerRpcDone(const std::string& method, const std::string& code, double seconds);

  /// `refresh` runs before every collection (e.g. to read the shard store's
  /// gauges); it must not call Collect. Set before serving.
  void SetRefresh(std::function<void()> refresh);
  /// What the HTTP exposer serves: runs the refresh hook, computes
  /// reshard_agent_task_oldest_running_seconds, then collects the registry.
  std::shared_ptr<prometheus::Collectable> collectable() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace reshard::agent
