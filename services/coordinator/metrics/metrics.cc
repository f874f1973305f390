#include "services/coordinator/metrics/metrics.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "common/rpc/enum_name.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace reshard::coordinator {
namespace {

// RPCs and SQL statements: 100 us .. 10 s.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* const kBuckets = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
      0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,  10.0};
  return *kBuckets;
}

// Whole operations: planning plus transfers of up to terabytes, 10 ms .. 2 h.
const prometheus::Histogram::BucketBoundaries& OperationBuckets() {
  static const auto* const kBuckets = new prometheus::Histogram::BucketBoundaries{
      0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200};
  return *kBuckets;
}

// Family::Add builds a throw-away Histogram (bucket vector included) even
// when the series exists, so the hot paths (every RPC, every statement) look
// their series up here first.
class HistogramCache {
 public:
  HistogramCache(prometheus::Family<prometheus::Histogram>& family,
                 const prometheus::Histogram::BucketBoundaries& buckets)
      : family_(family), buckets_(buckets) {}

  prometheus::Histogram& Get(const prometheus::Labels& labels) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = series_.find(labels);
    if (it != series_.end()) return *it->second;
    prometheus::Histogram& h = family_.Add(labels, buckets_);
    series_.emplace(labels, &h);
    return h;
  }

 private:
  prometheus::Family<prometheus::Histogram>& family_;
  const prometheus::Histogram::BucketBoundaries& buckets_;
  std::mutex mu_;
  std::map<prometheus::Labels, prometheus::Histogram*> series_;
};

}  // namespace

struct CoordinatorMetrics::Impl {
  explicit Impl(std::shared_ptr<prometheus::Registry> r)
      : registry(std::move(r)),
        operations(prometheus::BuildCounter()
                       .Name("reshard_coordinator_operations_total")
                       .Help("Operations that reached a final state, by kind and result.")
                       .Register(*registry)),
        operation_duration(
            prometheus::BuildHistogram()
                .Name("reshard_coordinator_operation_duration_seconds")
                .Help("Time from an operation's creation to its final state, by kind.")
                .Register(*registry)),
        planned_bytes(prometheus::BuildCounter()
                          .Name("reshard_coordinator_planned_bytes_total")
                          .Help("Bytes in committed-to plans, copied within a host (local) or "
                                "crossing hosts (cross_host).")
                          .Register(*registry)),
        jobs(prometheus::BuildGauge()
                 .Name("reshard_coordinator_jobs")
                 .Help("Jobs by state.")
                 .Register(*registry)),
        jobs_with_lost_hosts(prometheus::BuildGauge()
                                 .Name("reshard_coordinator_jobs_with_lost_hosts")
                                 .Help("Jobs whose current generation uses a lost host.")
                                 .Register(*registry)),
        hosts(prometheus::BuildGauge()
                  .Name("reshard_coordinator_hosts")
                  .Help("Registered hosts by state.")
                  .Register(*registry)),
        rpc_duration(prometheus::BuildHistogram()
                         .Name("reshard_coordinator_rpc_duration_seconds")
                         .Help("gRPC handler time, by method and status code.")
                         .Register(*registry)),
        store_duration(prometheus::BuildHistogram()
                           .Name("reshard_coordinator_store_duration_seconds")
                           .Help("Store statement time (transaction included), by statement.")
                           .Register(*registry)),
        active_operations(prometheus::BuildGauge()
                              .Name("reshard_coordinator_active_operations")
                              .Help("Unfinished operations by state (pending, planned, "
                                    "transferring); set by the leader.")
                              .Register(*registry)),
        oldest_active_family(prometheus::BuildGauge()
                                 .Name("reshard_coordinator_oldest_active_operation_seconds")
                                 .Help("Age of the oldest unfinished operation, 0 when none; set "
                                       "by the leader.")
                                 .Register(*registry)),
        leader_family(prometheus::BuildGauge()
                          .Name("reshard_coordinator_leader")
                          .Help("1 on the replica that drives operations, else 0.")
                          .Register(*registry)),
        retention_pruned(prometheus::BuildCounter()
                             .Name("reshard_coordinator_retention_pruned_rows_total")
                             .Help("Rows deleted by the retention policy, by table.")
                             .Register(*registry)),
        stop_free_family(
            prometheus::BuildHistogram()
                .Name("reshard_coordinator_stop_free_seconds")
                .Help("Committed stop-free operations: phase=\"prepare\" from creation to "
                      "prepared (new workers warm, the old layout training on), "
                      "phase=\"pause\" from the cut-over to the commit.")
                .Register(*registry)),
        prediction_ratio(prometheus::BuildHistogram()
                             .Name("reshard_coordinator_operation_prediction_ratio")
                             .Help("Committed operations with a cost prediction: actual seconds "
                                   "(planned to committed) over predicted, by kind.")
                             .Register(*registry)),
        host_cpu_per_gb(prometheus::BuildGauge()
                            .Name("reshard_coordinator_host_cpu_seconds_per_gb")
                            .Help("The agent's CPU seconds per GB its tasks moved (in, out and "
                                  "local), as the cost model learned it, by host.")
                            .Register(*registry)),
        stop_free_bytes(prometheus::BuildCounter()
                            .Name("reshard_coordinator_stop_free_bytes_total")
                            .Help("Stop-free operations whose transfer started after their "
                                  "agents prepared: kind=\"precopied\" bytes the prepare "
                                  "wrote, kind=\"skipped_unchanged\" plan bytes not moved "
                                  "again at the cut-over.")
                            .Register(*registry)),
        watch_streams(prometheus::BuildGauge()
                          .Name("reshard_coordinator_watch_streams")
                          .Help("Watch streams open now, by method (WatchJob, WatchOperation).")
                          .Register(*registry)),
        watch_streams_refused(prometheus::BuildCounter()
                                  .Name("reshard_coordinator_watch_streams_refused_total")
                                  .Help("Watch streams refused RESOURCE_EXHAUSTED, by the limit "
                                        "reached (per_identity, total).")
                                  .Register(*registry)),
        lease_judgement_suspended(
            prometheus::BuildCounter()
                .Name("reshard_coordinator_lease_judgement_suspended_total")
                .Help("Driver passes that judged no lease or stall because the coordinator "
                      "doubted itself, by reason (late_pass, heartbeat_backlog, mass_expiry).")
                .Register(*registry)),
        lease_judgement_suspended_now(
            prometheus::BuildGauge()
                .Name("reshard_coordinator_lease_judgement_suspended")
                .Help("1 while the leader judges no lease because it doubts itself.")
                .Register(*registry)
                .Add({})),
        heartbeat_lag(prometheus::BuildHistogram()
                          .Name("reshard_coordinator_agent_heartbeat_lag_seconds")
                          .Help("How much later than planned agents' heartbeats left, as each "
                                "agent measured its own scheduling lag.")
                          .Register(*registry)
                          .Add({}, prometheus::Histogram::BucketBoundaries{
                                       0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30})),
        planned_local(planned_bytes.Add({{"locality", "local"}})),
        planned_cross_host(planned_bytes.Add({{"locality", "cross_host"}})),
        lost_hosts_jobs(jobs_with_lost_hosts.Add({})),
        oldest_active(oldest_active_family.Add({})),
        leader(leader_family.Add({})),
        rpc_series(rpc_duration, LatencyBuckets()),
        store_series(store_duration, LatencyBuckets()) {}

  std::shared_ptr<prometheus::Registry> registry;
  prometheus::Family<prometheus::Counter>& operations;
  prometheus::Family<prometheus::Histogram>& operation_duration;
  prometheus::Family<prometheus::Counter>& planned_bytes;
  prometheus::Family<prometheus::Gauge>& jobs;
  prometheus::Family<prometheus::Gauge>& jobs_with_lost_hosts;
  prometheus::Family<prometheus::Gauge>& hosts;
  prometheus::Family<prometheus::Histogram>& rpc_duration;
  prometheus::Family<prometheus::Histogram>& store_duration;
  prometheus::Family<prometheus::Gauge>& active_operations;
  prometheus::Family<prometheus::Gauge>& oldest_active_family;
  prometheus::Family<prometheus::Gauge>& leader_family;
  prometheus::Family<prometheus::Counter>& retention_pruned;
  prometheus::Family<prometheus::Histogram>& stop_free_family;
  prometheus::Family<prometheus::Histogram>& prediction_ratio;
  prometheus::Family<prometheus::Gauge>& host_cpu_per_gb;
  prometheus::Family<prometheus::Counter>& stop_free_bytes;
  prometheus::Family<prometheus::Gauge>& watch_streams;
  prometheus::Family<prometheus::Counter>& watch_streams_refused;
  prometheus::Family<prometheus::Counter>& lease_judgement_suspended;
  prometheus::Gauge& lease_judgement_suspended_now;
  prometheus::Histogram& heartbeat_lag;
  // Series without variable labels, created once so that they are exported
  // (as 0) before anything happens.
  prometheus::Counter& planned_local;
  prometheus::Counter& planned_cross_host;
  prometheus::Gauge& lost_hosts_jobs;
  prometheus::Gauge& oldest_active;
  prometheus::Gauge& leader;
  HistogramCache rpc_series;
  HistogramCache store_series;
};

CoordinatorMetrics::CoordinatorMetrics(std::shared_ptr<prometheus::Registry> registry)
    : impl_(std::make_unique<Impl>(std::move(registry))) {
  for (v1::OperationState state : {v1::OPERATION_STATE_PENDING, v1::OPERATION_STATE_PLANNED,
                                   v1::OPERATION_STATE_TRANSFERRING}) {
    SetActiveOperations(state, 0);
  }
  // Every (kind, final result) series from the start, at 0, so that
  // increase() and alerts see an operation's first failure.
  for (v1::OperationKind kind : {v1::OPERATION_KIND_RESIZE, v1::OPERATION_KIND_MIGRATE,
                                 v1::OPERATION_KIND_RECOVER, v1::OPERATION_KIND_CHECKPOINT}) {
    for (v1::OperationState result :
         {v1::OPERATION_STATE_COMMITTED, v1::OPERATION_STATE_ABORTED, v1::OPERATION_STATE_FAILED}) {
      impl_->operations.Add({{"kind", rpc::EnumShortName(kind, rpc::NameCase::kLower)},
                             {"result", rpc::EnumShortName(result, rpc::NameCase::kLower)}});
    }
  }
  for (const char* method : {"WatchJob", "WatchOperation"}) SetWatchStreams(method, 0);
  for (const char* limit : {"per_identity", "total"}) {
    impl_->watch_streams_refused.Add({{"limit", limit}});
  }
  for (const char* reason : {"late_pass", "heartbeat_backlog", "mass_expiry"}) {
    impl_->lease_judgement_suspended.Add({{"reason", reason}});
  }
}

CoordinatorMetrics::~CoordinatorMetrics() = default;

// Family::Add returns the existing series for labels seen before (the
// buckets argument is then ignored), and is thread-safe. Operations are rare.
void CoordinatorMetrics::OperationFinished(v1::OperationKind kind, v1::OperationState result,
                                           double seconds) {
  const std::string kind_label = rpc::EnumShortName(kind, rpc::NameCase::kLower);
  impl_->operations
      .Add({{"kind", kind_label}, {"result", rpc::EnumShortName(result, rpc::NameCase::kLower)}})
      .Increment();
  impl_->operation_duration.Add({{"kind", kind_label}}, OperationBuckets())
      .Observe(seconds < 0 ? 0 : seconds);
}

void CoordinatorMetrics::StopFreeCommitted(double prepare_seconds, double pause_seconds) {
  impl_->stop_free_family.Add({{"phase", "prepare"}}, OperationBuckets())
      .Observe(prepare_seconds < 0 ? 0 : prepare_seconds);
  impl_->stop_free_family.Add({{"phase", "pause"}}, OperationBuckets())
      .Observe(pause_seconds < 0 ? 0 : pause_seconds);
}

void CoordinatorMetrics::PredictionChecked(v1::OperationKind kind, double actual_seconds,
                                           double predicted_seconds) {
  if (!(predicted_seconds > 0)) return;
  static const prometheus::Histogram::BucketBoundaries kRatios = {0.5, 0.67, 0.8, 0.9, 1.0,
                                                                  1.1, 1.25, 1.5, 2.0, 4.0};
  impl_->prediction_ratio.Add({{"kind", rpc::EnumShortName(kind, rpc::NameCase::kLower)}}, kRatios)
      .Observe(actual_seconds / predicted_seconds);
}

void CoordinatorMetrics::HostCpuPerByte(const std::string& host, double cpu_seconds_per_byte) {
  impl_->host_cpu_per_gb.Add({{"host", host}}).Set(cpu_seconds_per_byte * 1e9);
}

void CoordinatorMetrics::PreparedBytes(int64_t precopied, int64_t skipped_unchanged) {
  impl_->stop_free_bytes.Add({{"kind", "precopied"}})
      .Increment(static_cast<double>(std::max<int64_t>(0, precopied)));
  impl_->stop_free_bytes.Add({{"kind", "skipped_unchanged"}})
      .Increment(static_cast<double>(std::max<int64_t>(0, skipped_unchanged)));
}

void CoordinatorMetrics::RetentionPruned(const std::string& table, int64_t rows) {
  // Added even for 0 rows, so that the series exists from the first prune.
  prometheus::Counter& c = impl_->retention_pruned.Add({{"table", table}});
  if (rows > 0) c.Increment(static_cast<double>(rows));
}

void CoordinatorMetrics::SetWatchStreams(const std::string& method, int64_t count) {
  impl_->watch_streams.Add({{"method", method}}).Set(static_cast<double>(count));
}

void CoordinatorMetrics::WatchStreamRefused(const std::string& limit) {
  impl_->watch_streams_refused.Add({{"limit", limit}}).Increment();
}

void CoordinatorMetrics::LeaseJudgementSuspended(const std::string& reason) {
  impl_->lease_judgement_suspended_now.Set(reason.empty() ? 0 : 1);
  if (!reason.empty()) impl_->lease_judgement_suspended.Add({{"reason", reason}}).Increment();
}

void CoordinatorMetrics::AgentHeartbeatLag(double seconds) { impl_->heartbeat_lag.Observe(seconds); }

void CoordinatorMetrics::PlannedBytes(int64_t local, int64_t cross_host) {
  if (local > 0) impl_->planned_local.Increment(static_cast<double>(local));
  if (cross_host > 0) impl_->planned_cross_host.Increment(static_cast<double>(cross_host));
}

void CoordinatorMetrics::SetJobs(v1::JobState state, int64_t count) {
  impl_->jobs.Add({{"state", rpc::EnumShortName(state, rpc::NameCase::kLower)}})
      .Set(static_cast<double>(count));
}

void CoordinatorMetrics::SetJobsWithLostHosts(int64_t count) {
  impl_->lost_hosts_jobs.Set(static_cast<double>(count));
}

void CoordinatorMetrics::SetHosts(v1::HostState state, int64_t count) {
  impl_->hosts.Add({{"state", rpc::EnumShortName(state, rpc::NameCase::kLower)}})
      .Set(static_cast<double>(count));
}

void CoordinatorMetrics::RpcDone(const std::string& method, const std::string& code,
                                 double seconds) {
  impl_->rpc_series.Get({{"method", method}, {"code", code}}).Observe(seconds < 0 ? 0 : seconds);
}

void CoordinatorMetrics::StoreStatement(const std::string& statement, double seconds) {
  impl_->store_series.Get({{"statement", statement}}).Observe(seconds < 0 ? 0 : seconds);
}

void CoordinatorMetrics::SetActiveOperations(v1::OperationState state, int64_t count) {
  impl_->active_operations.Add({{"state", rpc::EnumShortName(state, rpc::NameCase::kLower)}})
      .Set(static_cast<double>(count));
}

void CoordinatorMetrics::SetOldestActiveOperationSeconds(double seconds) {
  impl_->oldest_active.Set(seconds < 0 ? 0 : seconds);
}

void CoordinatorMetrics::SetLeader(bool leader) { impl_->leader.Set(leader ? 1 : 0); }

std::shared_ptr<prometheus::Registry> CoordinatorMetrics::registry() const {
  return impl_->registry;
}

}  // namespace reshard::coordinator
