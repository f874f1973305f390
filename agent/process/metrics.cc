#include "agent/process/metrics.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace reshard::agent {
namespace {

using Clock = std::chrono::steady_clock;

// Worker RPCs on a unix socket: 50 us .. 10 s.
const prometheus::Histogram::BucketBoundaries& RpcBuckets() {
  static const auto* const kBuckets = new prometheus::Histogram::BucketBoundaries{
      0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
      0.025,   0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   10.0};
  return *kBuckets;
}

// A host's slice of an operation: 10 ms .. 2 h (like the coordinator's
// operation histogram).
const prometheus::Histogram::BucketBoundaries& TaskBuckets() {
  static const auto* const kBuckets = new prometheus::Histogram::BucketBoundaries{
      0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200};
  return *kBuckets;
}

constexpr TaskResult kResults[] = {TaskResult::kDone, TaskResult::kFailed, TaskResult::kAborted};

}  // namespace

const char* TaskResultLabel(TaskResult result) {
  switch (result) {
    case TaskResult::kDone:
      return "done";
    case TaskResult::kFailed:
      return "failed";
    case TaskResult::kAborted:
      return "aborted";
  }
  return "unknown";
}

struct AgentMetrics::Impl : public prometheus::Collectable {
  Impl(std::shared_ptr<prometheus::Registry> r, std::function<ProcessUsage()> usage)
      : registry(std::move(r)),
        meter(std::move(usage)),
        task_cpu_family(prometheus::BuildCounter()
                            .Name("reshard_agent_task_cpu_seconds_total")
                            .Help("CPU seconds (user + system, every thread) the agent spent "
                                  "while host tasks ran; added when the last running task ends.")
                            .Register(*registry)),
        task_switches(prometheus::BuildCounter()
                          .Name("reshard_agent_task_context_switches_total")
                          .Help("The agent's context switches while host tasks ran, by kind: "
                                "voluntary (a thread waited: each is a wake-up) or involuntary "
                                "(a thread was preempted).")
                          .Register(*registry)),
        cpu_per_gb_family(prometheus::BuildGauge()
                              .Name("reshard_agent_task_cpu_seconds_per_gb")
                              .Help("The last busy period's CPU seconds per GB (1e9 bytes) the "
                                    "host tasks wrote; a period is a task, or overlapping tasks "
                                    "together.")
                              .Register(*registry)),
        wakeups_per_mb_family(prometheus::BuildGauge()
                                  .Name("reshard_agent_task_wakeups_per_mb")
                                  .Help("The last busy period's voluntary context switches per "
                                        "MB (1e6 bytes) the host tasks wrote.")
                                  .Register(*registry)),
        tasks_started_family(prometheus::BuildCounter()
                                 .Name("reshard_agent_tasks_started_total")
                                 .Help("Host tasks (this host's slice of an operation) started.")
                                 .Register(*registry)),
        tasks_finished(prometheus::BuildCounter()
                           .Name("reshard_agent_tasks_finished_total")
                           .Help("Host tasks finished, by result (done, failed, aborted).")
                           .Register(*registry)),
        tasks_by_route(prometheus::BuildCounter()
                           .Name("reshard_agent_tasks_by_route_total")
                           .Help("Host tasks by the route the executor chose (host, "
                                 "device-direct, device-comm <communicator>, host-staged...).")
                           .Register(*registry)),
        task_duration(prometheus::BuildHistogram()
                          .Name("reshard_agent_task_duration_seconds")
                          .Help("Time from a host task's start to its end, by result.")
                          .Register(*registry)),
        bytes_written_family(prometheus::BuildCounter()
                                 .Name("reshard_agent_task_bytes_written_total")
                                 .Help("Bytes written into new rank buffers on this host by "
                                       "host tasks (local copies, receives, zero fills).")
                                 .Register(*registry)),
        tasks_running_family(prometheus::BuildGauge()
                                 .Name("reshard_agent_tasks_running")
                                 .Help("Host tasks running now.")
                                 .Register(*registry)),
        progress_family(prometheus::BuildGauge()
                            .Name("reshard_agent_task_progress_bytes")
                            .Help("Bytes written so far by the running host tasks (summed).")
                            .Register(*registry)),
        total_family(prometheus::BuildGauge()
                         .Name("reshard_agent_task_total_bytes")
                         .Help("Bytes the running host tasks write on this host (summed).")
                         .Register(*registry)),
        oldest_family(prometheus::BuildGauge()
                          .Name("reshard_agent_task_oldest_running_seconds")
                          .Help("Age of the oldest running host task; 0 when none runs.")
                          .Register(*registry)),
        store_used_family(prometheus::BuildGauge()
                              .Name("reshard_agent_shard_store_used_bytes")
                              .Help("Bytes of rank buffers the shard store holds.")
                              .Register(*registry)),
        store_limit_family(prometheus::BuildGauge()
                               .Name("reshard_agent_shard_store_limit_bytes")
                               .Help("The shard store's memory limit (--memory-limit-bytes).")
                               .Register(*registry)),
        generations_family(prometheus::BuildGauge()
                               .Name("reshard_agent_generations_held")
                               .Help("Distinct (job, generation) pairs with rank buffers here.")
                               .Register(*registry)),
        buffers_family(prometheus::BuildGauge()
                           .Name("reshard_agent_rank_buffers_held")
                           .Help("Rank buffers the shard store holds.")
                           .Register(*registry)),
        device_used_family(prometheus::BuildGauge()
                               .Name("reshard_agent_device_used_bytes")
                               .Help("Device bytes of rank buffers held on each device.")
                               .Register(*registry)),
        device_limit_family(prometheus::BuildGauge()
                                .Name("reshard_agent_device_limit_bytes")
                                .Help("The device store's limit on each device "
                                      "(--device-memory-limit-bytes).")
                                .Register(*registry)),
        pinned_bytes_family(prometheus::BuildGauge()
                                .Name("reshard_agent_pinned_host_bytes")
                                .Help("Pinned host memory the device store holds registered "
                                      "(lent and idle).")
                                .Register(*registry)),
        pinned_registrations_family(prometheus::BuildCounter()
                                        .Name("reshard_agent_pinned_host_registrations_total")
                                        .Help("Registrations of pinned host memory "
                                              "(cudaMallocHost) by the device store's pool.")
                                        .Register(*registry)),
        reachable_family(prometheus::BuildGauge()
                             .Name("reshard_agent_coordinator_reachable")
                             .Help("1 when the last heartbeat reached the coordinator, else 0.")
                             .Register(*registry)),
        heartbeat_failures_family(prometheus::BuildCounter()
                                      .Name("reshard_agent_heartbeat_failures_total")
                                      .Help("Heartbeats that failed (coordinator unreachable, "
                                            "or the host must register again).")
                                      .Register(*registry)),
        registrations(prometheus::BuildCounter()
                          .Name("reshard_agent_registrations_total")
                          .Help("RegisterAgent calls, by result (ok, error).")
                          .Register(*registry)),
        worker_rpc(prometheus::BuildHistogram()
                       .Name("reshard_agent_worker_rpc_duration_seconds")
                       .Help("Worker gRPC handler time (unix socket), by method and status code.")
                       .Register(*registry)),
        worker_cache_bytes_family(
            prometheus::BuildGauge()
                .Name("reshard_agent_worker_cache_bytes")
                .Help("Bytes the worker service's job cache holds (PTCs and layouts of the "
                      "generations held here, worker-token hashes); at most "
                      "--worker-cache-bytes.")
                .Register(*registry)),
        worker_cache_entries_family(
            prometheus::BuildGauge()
                .Name("reshard_agent_worker_cache_entries")
                .Help("Entries of the worker service's job cache, by kind (generation, token).")
                .Register(*registry)),
        task_cpu(task_cpu_family.Add({})),
        task_voluntary(task_switches.Add({{"kind", "voluntary"}})),
        task_involuntary(task_switches.Add({{"kind", "involuntary"}})),
        cpu_per_gb(cpu_per_gb_family.Add({})),
        wakeups_per_mb(wakeups_per_mb_family.Add({})),
        tasks_started(tasks_started_family.Add({})),
        bytes_written(bytes_written_family.Add({})),
        tasks_running(tasks_running_family.Add({})),
        progress(progress_family.Add({})),
        total(total_family.Add({})),
        oldest(oldest_family.Add({})),
        store_used(store_used_family.Add({})),
        store_limit(store_limit_family.Add({})),
        generations(generations_family.Add({})),
        buffers(buffers_family.Add({})),
        reachable(reachable_family.Add({})),
        heartbeat_failures(heartbeat_failures_family.Add({})),
        worker_cache_bytes(worker_cache_bytes_family.Add({})),
        worker_cache_generations(worker_cache_entries_family.Add({{"kind", "generation"}})),
        worker_cache_tokens(worker_cache_entries_family.Add({{"kind", "token"}})),
        registrations_ok(registrations.Add({{"result", "ok"}})),
        registrations_error(registrations.Add({{"result", "error"}})) {
    // Every result series exists (as 0) from the start, so that rate() and
    // alerts see the first failure.
    for (TaskResult r : kResults) {
      tasks_finished.Add({{"result", TaskResultLabel(r)}});
      task_duration.Add({{"result", TaskResultLabel(r)}}, TaskBuckets());
    }
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::function<void()> hook;
    {
      std::lock_guard<std::mutex> l(mu);
      hook = refresh;
      double age = 0;
      if (!running.empty()) {
        Clock::time_point first = Clock::now();
        for (const auto& [token, start] : running) first = std::min(first, start);
        age = std::chrono::duration<double>(Clock::now() - first).count();
      }
      oldest.Set(age);
    }
    if (hook) hook();
    return registry->Collect();
  }

  std::shared_ptr<prometheus::Registry> registry;
  BusyMeter meter;
  prometheus::Family<prometheus::Counter>& task_cpu_family;
  prometheus::Family<prometheus::Counter>& task_switches;
  prometheus::Family<prometheus::Gauge>& cpu_per_gb_family;
  prometheus::Family<prometheus::Gauge>& wakeups_per_mb_family;
  prometheus::Family<prometheus::Counter>& tasks_started_family;
  prometheus::Family<prometheus::Counter>& tasks_finished;
  prometheus::Family<prometheus::Counter>& tasks_by_route;
  prometheus::Family<prometheus::Histogram>& task_duration;
  prometheus::Family<prometheus::Counter>& bytes_written_family;
  prometheus::Family<prometheus::Gauge>& tasks_running_family;
  prometheus::Family<prometheus::Gauge>& progress_family;
  prometheus::Family<prometheus::Gauge>& total_family;
  prometheus::Family<prometheus::Gauge>& oldest_family;
  prometheus::Family<prometheus::Gauge>& store_used_family;
  prometheus::Family<prometheus::Gauge>& store_limit_family;
  prometheus::Family<prometheus::Gauge>& generations_family;
  prometheus::Family<prometheus::Gauge>& buffers_family;
  prometheus::Family<prometheus::Gauge>& device_used_family;
  prometheus::Family<prometheus::Gauge>& device_limit_family;
  prometheus::Family<prometheus::Gauge>& pinned_bytes_family;
  prometheus::Family<prometheus::Counter>& pinned_registrations_family;
  prometheus::Family<prometheus::Gauge>& reachable_family;
  prometheus::Family<prometheus::Counter>& heartbeat_failures_family;
  prometheus::Family<prometheus::Counter>& registrations;
  prometheus::Family<prometheus::Histogram>& worker_rpc;
  prometheus::Family<prometheus::Gauge>& worker_cache_bytes_family;
  prometheus::Family<prometheus::Gauge>& worker_cache_entries_family;
  prometheus::Counter& task_cpu;
  prometheus::Counter& task_voluntary;
  prometheus::Counter& task_involuntary;
  prometheus::Gauge& cpu_per_gb;
  prometheus::Gauge& wakeups_per_mb;
  prometheus::Counter& tasks_started;
  prometheus::Counter& bytes_written;
  prometheus::Gauge& tasks_running;
  prometheus::Gauge& progress;
  prometheus::Gauge& total;
  prometheus::Gauge& oldest;
  prometheus::Gauge& store_used;
  prometheus::Gauge& store_limit;
  prometheus::Gauge& generations;
  prometheus::Gauge& buffers;
  prometheus::Gauge& reachable;
  prometheus::Counter& heartbeat_failures;
  prometheus::Gauge& worker_cache_bytes;
  prometheus::Gauge& worker_cache_generations;
  prometheus::Gauge& worker_cache_tokens;
  prometheus::Counter& registrations_ok;
  prometheus::Counter& registrations_error;

  mutable std::mutex mu;
  std::function<void()> refresh;                 // guarded by mu
  int64_t pinned_registrations = 0;              // counted so far; guarded by mu
  std::map<int64_t, Clock::time_point> running;  // token -> start; guarded by mu
  int64_t next_token = 1;                        // guarded by mu
  // Family::Add builds a throw-away Histogram even when the series exists,
  // so the per-RPC path looks its series up here first. Guarded by mu.
  std::map<prometheus::Labels, prometheus::Histogram*> rpc_series;
};

AgentMetrics::AgentMetrics(std::shared_ptr<prometheus::Registry> registry,
                           std::function<ProcessUsage()> usage)
    : impl_(std::make_shared<Impl>(std::move(registry), std::move(usage))) {}

AgentMetrics::~AgentMetrics() = default;

int64_t AgentMetrics::TaskStarted() {
  impl_->meter.TaskStarted();
  impl_->tasks_started.Increment();
  impl_->tasks_running.Increment();
  std::lock_guard<std::mutex> l(impl_->mu);
  const int64_t token = impl_->next_token++;
  impl_->running[token] = Clock::now();
  return token;
}

void AgentMetrics::TaskProgress(int64_t done_delta, int64_t total_delta) {
  if (done_delta != 0) impl_->progress.Increment(static_cast<double>(done_delta));
  if (done_delta > 0) {
    impl_->bytes_written.Increment(static_cast<double>(done_delta));
    impl_->meter.Wrote(done_delta);
  }
  if (total_delta != 0) impl_->total.Increment(static_cast<double>(total_delta));
}

int64_t AgentMetrics::bytes_written() const {
  return static_cast<int64_t>(impl_->bytes_written.Value());
}

void AgentMetrics::TaskFinished(int64_t token, TaskResult result, double seconds) {
  const std::string label = TaskResultLabel(result);
  impl_->tasks_finished.Add({{"result", label}}).Increment();
  impl_->task_duration.Add({{"result", label}}, TaskBuckets()).Observe(seconds < 0 ? 0 : seconds);
  impl_->tasks_running.Decrement();
  BusyPeriod period;
  if (impl_->meter.TaskFinished(&period)) {
    impl_->task_cpu.Increment(period.cpu_seconds > 0 ? period.cpu_seconds : 0);
    impl_->task_voluntary.Increment(static_cast<double>(std::max<int64_t>(period.voluntary, 0)));
    impl_->task_involuntary.Increment(
        static_cast<double>(std::max<int64_t>(period.involuntary, 0)));
    if (period.bytes > 0) {
      impl_->cpu_per_gb.Set(period.CpuSecondsPerGb());
      impl_->wakeups_per_mb.Set(period.WakeupsPerMb());
    }
  }
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->running.erase(token);
}

void AgentMetrics::SetShardStore(int64_t used_bytes, int64_t limit_bytes, int64_t generations,
                                 int64_t rank_buffers) {
  impl_->store_used.Set(static_cast<double>(used_bytes));
  impl_->store_limit.Set(static_cast<double>(limit_bytes));
  impl_->generations.Set(static_cast<double>(generations));
  impl_->buffers.Set(static_cast<double>(rank_buffers));
}

void AgentMetrics::SetDeviceStore(int device, int64_t used_bytes, int64_t limit_bytes) {
  const std::map<std::string, std::string> labels{{"device", std::to_string(device)}};
  impl_->device_used_family.Add(labels).Set(static_cast<double>(used_bytes));
  impl_->device_limit_family.Add(labels).Set(static_cast<double>(limit_bytes));
}

void AgentMetrics::SetPinnedHost(int64_t registered_bytes, int64_t registrations) {
  impl_->pinned_bytes_family.Add({}).Set(static_cast<double>(registered_bytes));
  prometheus::Counter& counter = impl_->pinned_registrations_family.Add({});
  std::lock_guard<std::mutex> l(impl_->mu);
  if (registrations > impl_->pinned_registrations) {
    counter.Increment(static_cast<double>(registrations - impl_->pinned_registrations));
    impl_->pinned_registrations = registrations;
  }
}

void AgentMetrics::SetWorkerCache(int64_t bytes, int64_t generations, int64_t tokens) {
  impl_->worker_cache_bytes.Set(static_cast<double>(bytes));
  impl_->worker_cache_generations.Set(static_cast<double>(generations));
  impl_->worker_cache_tokens.Set(static_cast<double>(tokens));
}

void AgentMetrics::HeartbeatDone(bool ok) {
  impl_->reachable.Set(ok ? 1 : 0);
  if (!ok) impl_->heartbeat_failures.Increment();
}

void AgentMetrics::TaskRouted(const std::string& route) {
  impl_->tasks_by_route.Add({{"route", route}}).Increment();  // Family::Add is thread-safe
}

void AgentMetrics::RegisterDone(bool ok) {
  (ok ? impl_->registrations_ok : impl_->registrations_error).Increment();
  if (!ok) impl_->reachable.Set(0);
}

void AgentMetrics::WorkerRpcDone(const std::string& method, const std::string& code,
                                 double seconds) {
  prometheus::Histogram* h = nullptr;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    const prometheus::Labels labels{{"method", method}, {"code", code}};
    auto it = impl_->rpc_series.find(labels);
    if (it == impl_->rpc_series.end()) {
      it = impl_->rpc_series.emplace(labels, &impl_->worker_rpc.Add(labels, RpcBuckets())).first;
    }
    h = it->second;
  }
  h->Observe(seconds < 0 ? 0 : seconds);
}

void AgentMetrics::SetRefresh(std::function<void()> refresh) {
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->refresh = std::move(refresh);
}

std::shared_ptr<prometheus::Collectable> AgentMetrics::collectable() const { return impl_; }

}  // namespace reshard::agent
