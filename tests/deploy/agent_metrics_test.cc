// AgentMetrics (agent/process/metrics.h): what a scrape of the agent shows
// after tasks, heartbeats and worker RPCs.
#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agent/process/metrics.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace reshard::agent {
namespace {

// One collection: "name{k=v,...}" -> value (counter, gauge or histogram count).
std::map<std::string, double> Scrape(const AgentMetrics& m) {
  std::map<std::string, double> out;
  for (const prometheus::MetricFamily& f : m.collectable()->Collect()) {
    for (const prometheus::ClientMetric& c : f.metric) {
      std::string key = f.name + "{";
      for (size_t i = 0; i < c.label.size(); ++i) {
        key += (i ? "," : "") + c.label[i].name + "=" + c.label[i].value;
      }
      key += "}";
      switch (f.type) {
        case prometheus::MetricType::Counter:
          out[key] = c.counter.value;
          break;
        case prometheus::MetricType::Gauge:
          out[key] = c.gauge.value;
          break;
        case prometheus::MetricType::Histogram:
          out[key] = static_cast<double>(c.histogram.sample_count);
          out[f.name + "_sum" + key.substr(f.name.size())] = c.histogram.sample_sum;
          break;
        default:
          break;
      }
    }
  }
  return out;
}

TEST(AgentMetricsTest, ExportsEveryFamilyBeforeAnythingHappens) {
  AgentMetrics m(std::make_shared<prometheus::Registry>());
  std::map<std::string, double> s = Scrape(m);
  for (const char* key : {"reshard_agent_tasks_started_total{}",
                          "reshard_agent_tasks_finished_total{result=done}",
                          "reshard_agent_tasks_finished_total{result=failed}",
                          "reshard_agent_tasks_finished_total{result=aborted}",
                          "reshard_agent_task_duration_seconds{result=done}",
                          "reshard_agent_task_bytes_written_total{}",
                          "reshard_agent_tasks_running{}",
                          "reshard_agent_task_progress_bytes{}",
                          "reshard_agent_task_total_bytes{}",
                          "reshard_agent_task_oldest_running_seconds{}",
                          "reshard_agent_shard_store_used_bytes{}",
                          "reshard_agent_shard_store_limit_bytes{}",
                          "reshard_agent_generations_held{}",
                          "reshard_agent_rank_buffers_held{}",
                          "reshard_agent_coordinator_reachable{}",
                          "reshard_agent_heartbeat_failures_total{}",
                          "reshard_agent_registrations_total{result=ok}",
                          "reshard_agent_registrations_total{result=error}",
                          "reshard_agent_task_cpu_seconds_total{}",
                          "reshard_agent_task_context_switches_total{kind=voluntary}",
                          "reshard_agent_task_context_switches_total{kind=involuntary}",
                          "reshard_agent_task_cpu_seconds_per_gb{}",
                          "reshard_agent_task_wakeups_per_mb{}"}) {
    ASSERT_EQ(s.count(key), 1u) << key;
    EXPECT_EQ(s[key], 0) << key;
  }
}

TEST(AgentMetricsTest, TasksProgressAndFinish) {
  AgentMetrics m(std::make_shared<prometheus::Registry>());
  const int64_t a = m.TaskStarted();
  const int64_t b = m.TaskStarted();
  m.TaskProgress(100, 1000);  // a
  m.TaskProgress(0, 500);     // b
  m.TaskProgress(400, 0);     // a: 500 of 1000
  std::map<std::string, double> s = Scrape(m);
  EXPECT_EQ(s["reshard_agent_tasks_started_total{}"], 2);
  EXPECT_EQ(s["reshard_agent_tasks_running{}"], 2);
  EXPECT_EQ(s["reshard_agent_task_progress_bytes{}"], 500);
  EXPECT_EQ(s["reshard_agent_task_total_bytes{}"], 1500);
  EXPECT_EQ(s["reshard_agent_task_bytes_written_total{}"], 500);
  EXPECT_EQ(m.bytes_written(), 500);  // what the heartbeat tells
  EXPECT_GE(s["reshard_agent_task_oldest_running_seconds{}"], 0);

  // a finishes: the rest of its bytes land, then it leaves the gauges.
  m.TaskProgress(500, 0);
  m.TaskProgress(-1000, -1000);
  m.TaskFinished(a, TaskResult::kDone, 2.5);
  // b fails having written nothing.
  m.TaskProgress(0, -500);
  m.TaskFinished(b, TaskResult::kFailed, 0.5);

  s = Scrape(m);
  EXPECT_EQ(s["reshard_agent_tasks_running{}"], 0);
  EXPECT_EQ(s["reshard_agent_task_progress_bytes{}"], 0);
  EXPECT_EQ(s["reshard_agent_task_total_bytes{}"], 0);
  EXPECT_EQ(s["reshard_agent_task_bytes_written_total{}"], 1000);  // never decreases
  EXPECT_EQ(m.bytes_written(), 1000);
  EXPECT_EQ(s["reshard_agent_tasks_finished_total{result=done}"], 1);
  EXPECT_EQ(s["reshard_agent_tasks_finished_total{result=failed}"], 1);
  EXPECT_EQ(s["reshard_agent_tasks_finished_total{result=aborted}"], 0);
  EXPECT_EQ(s["reshard_agent_task_duration_seconds{result=done}"], 1);
  EXPECT_DOUBLE_EQ(s["reshard_agent_task_duration_seconds_sum{result=done}"], 2.5);
  EXPECT_EQ(s["reshard_agent_task_oldest_running_seconds{}"], 0);
}

// A process whose usage the test sets.
struct FakeUsage {
  ProcessUsage now;
  std::function<ProcessUsage()> sampler() {
    return [this] { return now; };
  }
};

TEST(AgentMetricsTest, CpuAndWakeupsPerByteOfABusyPeriod) {
  FakeUsage usage;
  usage.now = {10.0, 1000, 50};
  AgentMetrics m(std::make_shared<prometheus::Registry>(), usage.sampler());
  // Two overlapping tasks make one period: 2 GB written, 3 CPU-s, 4000
  // voluntary and 10 involuntary switches.
  const int64_t a = m.TaskStarted();
  usage.now = {11.0, 2000, 55};
  const int64_t b = m.TaskStarted();  // not the first: samples nothing
  m.TaskProgress(1'500'000'000, 0);
  m.TaskFinished(a, TaskResult::kDone, 1);
  std::map<std::string, double> s = Scrape(m);
  EXPECT_EQ(s["reshard_agent_task_cpu_seconds_total{}"], 0);  // b still runs
  m.TaskProgress(500'000'000, 0);
  usage.now = {13.0, 5000, 60};
  m.TaskFinished(b, TaskResult::kDone, 1);
  s = Scrape(m);
  EXPECT_DOUBLE_EQ(s["reshard_agent_task_cpu_seconds_total{}"], 3.0);
  EXPECT_EQ(s["reshard_agent_task_context_switches_total{kind=voluntary}"], 4000);
  EXPECT_EQ(s["reshard_agent_task_context_switches_total{kind=involuntary}"], 10);
  EXPECT_DOUBLE_EQ(s["reshard_agent_task_cpu_seconds_per_gb{}"], 1.5);
  EXPECT_DOUBLE_EQ(s["reshard_agent_task_wakeups_per_mb{}"], 2.0);

  // A period that writes nothing adds its CPU but keeps the last ratios;
  // bytes written between periods count in neither.
  m.TaskProgress(7'000'000'000, 0);
  const int64_t c = m.TaskStarted();
  usage.now = {13.5, 5100, 60};
  m.TaskFinished(c, TaskResult::kFailed, 1);
  s = Scrape(m);
  EXPECT_DOUBLE_EQ(s["reshard_agent_task_cpu_seconds_total{}"], 3.5);
  EXPECT_EQ(s["reshard_agent_task_context_switches_total{kind=voluntary}"], 4100);
  EXPECT_DOUBLE_EQ(s["reshard_agent_task_cpu_seconds_per_gb{}"], 1.5);
  EXPECT_DOUBLE_EQ(s["reshard_agent_task_wakeups_per_mb{}"], 2.0);
}

TEST(BusyMeterTest, RealUsageOfAPeriodThatSpinsAndSleeps) {
  BusyMeter meter;  // getrusage
  meter.TaskStarted();
  // 30 ms of this process's CPU time (not of the clock: on a busy machine
  // the thread is preempted while the clock runs on).
  timespec t0{};
  ASSERT_EQ(::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0), 0);
  auto cpu_since = [&t0] {
    timespec t{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec - t0.tv_sec) +
           static_cast<double>(t.tv_nsec - t0.tv_nsec) * 1e-9;
  };
  volatile uint64_t x = 0;
  while (cpu_since() < 0.03) x = x + 1;
  // The measured thread waits (a sleep is a voluntary context switch, the
  // wake-up the metric counts), not a synchronisation.
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
  meter.Wrote(1'000'000);
  BusyPeriod p;
  ASSERT_TRUE(meter.TaskFinished(&p));
  EXPECT_GE(p.cpu_seconds, 0.029);  // getrusage splits the exact runtime in microseconds
  EXPECT_GT(p.voluntary, 0);
  EXPECT_EQ(p.bytes, 1'000'000);
  EXPECT_DOUBLE_EQ(p.WakeupsPerMb(), static_cast<double>(p.voluntary));
  EXPECT_FALSE(meter.TaskFinished(&p));  // no task runs
}

TEST(AgentMetricsTest, RefreshHookRunsAtEveryCollection) {
  AgentMetrics m(std::make_shared<prometheus::Registry>());
  int64_t used = 10;
  m.SetRefresh([&] { m.SetShardStore(used, 100, 2, 3); });
  std::map<std::string, double> s = Scrape(m);
  EXPECT_EQ(s["reshard_agent_shard_store_used_bytes{}"], 10);
  EXPECT_EQ(s["reshard_agent_shard_store_limit_bytes{}"], 100);
  EXPECT_EQ(s["reshard_agent_generations_held{}"], 2);
  EXPECT_EQ(s["reshard_agent_rank_buffers_held{}"], 3);
  used = 70;
  EXPECT_EQ(Scrape(m)["reshard_agent_shard_store_used_bytes{}"], 70);
}

TEST(AgentMetricsTest, PinnedHostMemoryAndItsRegistrations) {
  AgentMetrics m(std::make_shared<prometheus::Registry>());
  // An agent without a device API exports neither series.
  std::map<std::string, double> s = Scrape(m);
  EXPECT_EQ(s.count("reshard_agent_pinned_host_bytes{}"), 0u);
  EXPECT_EQ(s.count("reshard_agent_pinned_host_registrations_total{}"), 0u);
  // The pool's running total becomes a counter: it advances by what it grew.
  m.SetPinnedHost(2 << 20, 2);
  s = Scrape(m);
  EXPECT_EQ(s["reshard_agent_pinned_host_bytes{}"], 2 << 20);
  EXPECT_EQ(s["reshard_agent_pinned_host_registrations_total{}"], 2);
  m.SetPinnedHost(2 << 20, 2);
  EXPECT_EQ(Scrape(m)["reshard_agent_pinned_host_registrations_total{}"], 2);
  m.SetPinnedHost(1 << 20, 5);  // freed a block past the keep limit, registered three
  s = Scrape(m);
  EXPECT_EQ(s["reshard_agent_pinned_host_bytes{}"], 1 << 20);
  EXPECT_EQ(s["reshard_agent_pinned_host_registrations_total{}"], 5);
}

TEST(AgentMetricsTest, HeartbeatsRegistrationsAndWorkerRpcs) {
  AgentMetrics m(std::make_shared<prometheus::Registry>());
  m.RegisterDone(true);
  m.HeartbeatDone(true);
  EXPECT_EQ(Scrape(m)["reshard_agent_coordinator_reachable{}"], 1);
  m.HeartbeatDone(false);
  m.HeartbeatDone(false);
  m.RegisterDone(false);
  m.WorkerRpcDone("PublishShard", "OK", 0.001);
  m.WorkerRpcDone("PublishShard", "OK", 0.002);
  m.WorkerRpcDone("SealShard", "DATA_LOSS", 0.003);
  std::map<std::string, double> s = Scrape(m);
  EXPECT_EQ(s["reshard_agent_coordinator_reachable{}"], 0);
  EXPECT_EQ(s["reshard_agent_heartbeat_failures_total{}"], 2);
  EXPECT_EQ(s["reshard_agent_registrations_total{result=ok}"], 1);
  EXPECT_EQ(s["reshard_agent_registrations_total{result=error}"], 1);
  EXPECT_EQ(s["reshard_agent_worker_rpc_duration_seconds{code=OK,method=PublishShard}"], 2);
  EXPECT_EQ(s["reshard_agent_worker_rpc_duration_seconds{code=DATA_LOSS,method=SealShard}"], 1);
}

}  // namespace
}  // namespace reshard::agent
