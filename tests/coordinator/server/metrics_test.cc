// Unit tests of CoordinatorMetrics: every family is registered once, under
// its documented name, with the documented labels.
#include "services/coordinator/metrics/metrics.h"

#include <map>
#include <set>

#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace reshard::coordinator {
namespace {

std::map<std::string, const prometheus::MetricFamily*> ByName(
    const std::vector<prometheus::MetricFamily>& families) {
  std::map<std::string, const prometheus::MetricFamily*> out;
  for (const auto& f : families) out[f.name] = &f;
  return out;
}

std::map<std::string, std::string> Labels(const prometheus::ClientMetric& m) {
  std::map<std::string, std::string> out;
  for (const auto& l : m.label) out[l.name] = l.value;
  return out;
}

TEST(MetricsTest, FamiliesAndLabels) {
  auto registry = std::make_shared<prometheus::Registry>();
  CoordinatorMetrics metrics(registry);
  EXPECT_EQ(metrics.registry(), registry);

  // Before anything happens, the unlabelled series exist (as 0).
  {
    const std::vector<prometheus::MetricFamily> initial = registry->Collect();
    auto families = ByName(initial);
    ASSERT_TRUE(families.count("reshard_coordinator_leader"));
    EXPECT_EQ(families["reshard_coordinator_leader"]->metric.at(0).gauge.value, 0);
    EXPECT_TRUE(families.count("reshard_coordinator_planned_bytes_total"));
    EXPECT_TRUE(families.count("reshard_coordinator_jobs_with_lost_hosts"));
  }

  metrics.OperationFinished(v1::OPERATION_KIND_RESIZE, v1::OPERATION_STATE_COMMITTED, 2.5);
  metrics.OperationFinished(v1::OPERATION_KIND_RESIZE, v1::OPERATION_STATE_COMMITTED, 0.5);
  metrics.OperationFinished(v1::OPERATION_KIND_RECOVER, v1::OPERATION_STATE_FAILED, 1);
  metrics.PlannedBytes(100, 50);
  metrics.PlannedBytes(1, 0);
  metrics.SetJobs(v1::JOB_STATE_ACTIVE, 7);
  metrics.SetJobs(v1::JOB_STATE_ACTIVE, 6);
  metrics.SetJobsWithLostHosts(2);
  metrics.SetHosts(v1::HOST_STATE_LOST, 3);
  metrics.RpcDone("GetJob", "OK", 0.001);
  metrics.RpcDone("GetJob", "OK", 0.002);
  metrics.RpcDone("GetJob", "NOT_FOUND", 0.003);
  metrics.StoreStatement("get_job", 0.0004);
  metrics.SetLeader(true);
  metrics.LeaseJudgementSuspended("late_pass");
  metrics.LeaseJudgementSuspended("late_pass");
  metrics.LeaseJudgementSuspended("mass_expiry");
  metrics.AgentHeartbeatLag(0.002);
  metrics.AgentHeartbeatLag(1.5);

  const std::vector<prometheus::MetricFamily> collected = registry->Collect();
  auto families = ByName(collected);
  const std::set<std::string> expected = {"reshard_coordinator_operations_total",
                                          "reshard_coordinator_operation_duration_seconds",
                                          "reshard_coordinator_planned_bytes_total",
                                          "reshard_coordinator_jobs",
                                          "reshard_coordinator_jobs_with_lost_hosts",
                                          "reshard_coordinator_hosts",
                                          "reshard_coordinator_rpc_duration_seconds",
                                          "reshard_coordinator_store_duration_seconds",
                                          "reshard_coordinator_active_operations",
                                          "reshard_coordinator_oldest_active_operation_seconds",
                                          "reshard_coordinator_leader",
                                          "reshard_coordinator_watch_streams",
                                          "reshard_coordinator_watch_streams_refused_total",
                                          "reshard_coordinator_lease_judgement_suspended_total",
                                          "reshard_coordinator_lease_judgement_suspended",
                                          "reshard_coordinator_agent_heartbeat_lag_seconds"};
  std::set<std::string> names;
  for (const auto& f : collected) {
    EXPECT_TRUE(names.insert(f.name).second) << f.name << " registered twice";
  }
  EXPECT_EQ(names, expected);

  const auto& ops = *families["reshard_coordinator_operations_total"];
  // Every kind x final result exists from the start (at 0), so alerts see a first failure.
  ASSERT_EQ(ops.metric.size(), 12u);  // 4 kinds x 3 results
  for (const auto& m : ops.metric) {
    const auto labels = Labels(m);
    double want = 0;
    if (labels.at("kind") == "resize" && labels.at("result") == "committed") want = 2;
    if (labels.at("kind") == "recover" && labels.at("result") == "failed") want = 1;
    EXPECT_EQ(m.counter.value, want) << labels.at("kind") << " " << labels.at("result");
  }
  for (const auto& m : families["reshard_coordinator_operation_duration_seconds"]->metric) {
    if (Labels(m).at("kind") == "resize") {
      EXPECT_EQ(m.histogram.sample_count, 2u);
      EXPECT_DOUBLE_EQ(m.histogram.sample_sum, 3.0);
    }
  }
  for (const auto& m : families["reshard_coordinator_planned_bytes_total"]->metric) {
    EXPECT_EQ(m.counter.value, Labels(m).at("locality") == "local" ? 101 : 50);
  }
  const auto& jobs = *families["reshard_coordinator_jobs"];
  ASSERT_EQ(jobs.metric.size(), 1u);
  EXPECT_EQ(Labels(jobs.metric[0]).at("state"), "active");
  EXPECT_EQ(jobs.metric[0].gauge.value, 6);
  EXPECT_EQ(Labels(families["reshard_coordinator_hosts"]->metric.at(0)).at("state"), "lost");
  const auto& rpc = *families["reshard_coordinator_rpc_duration_seconds"];
  ASSERT_EQ(rpc.metric.size(), 2u);
  uint64_t ok_count = 0;
  for (const auto& m : rpc.metric) {
    if (Labels(m).at("code") == "OK") ok_count = m.histogram.sample_count;
    EXPECT_EQ(Labels(m).at("method"), "GetJob");
    EXPECT_GE(m.histogram.bucket.size(), 10u);  // sub-millisecond to seconds
  }
  EXPECT_EQ(ok_count, 2u);
  // Every reason exists from the start; the gauge says the last pass was suspended.
  const auto& suspended = *families["reshard_coordinator_lease_judgement_suspended_total"];
  ASSERT_EQ(suspended.metric.size(), 3u);
  for (const auto& m : suspended.metric) {
    const std::string reason = Labels(m).at("reason");
    EXPECT_EQ(m.counter.value, reason == "late_pass" ? 2 : reason == "mass_expiry" ? 1 : 0)
        << reason;
  }
  EXPECT_EQ(families["reshard_coordinator_lease_judgement_suspended"]->metric.at(0).gauge.value, 1);
  const auto& lag = families["reshard_coordinator_agent_heartbeat_lag_seconds"]->metric.at(0);
  EXPECT_EQ(lag.histogram.sample_count, 2u);
  EXPECT_DOUBLE_EQ(lag.histogram.sample_sum, 1.502);
  EXPECT_EQ(families["reshard_coordinator_leader"]->metric.at(0).gauge.value, 1);
  metrics.SetLeader(false);
  EXPECT_EQ(ByName(registry->Collect())["reshard_coordinator_leader"]->metric.at(0).gauge.value, 0);
}

}  // namespace
}  // namespace reshard::coordinator
