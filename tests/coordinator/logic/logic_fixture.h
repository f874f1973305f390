// The fixture of the logic integration tests: a fresh, migrated database on
// the throwaway PostgreSQL server (one server per test process), a PgStore
// on it, the logic objects wired to a fake clock, and helpers that play the
// agents' side through AgentApi.
//
// A suite whose tests are TEST_P and instantiated with
// RESHARD_LOGIC_ON_BOTH_STORES runs each test twice: on PostgreSQL
// (Stores/Suite.Test/Postgres) and on the in-memory store
// (Stores/Suite.Test/Memory, no database at all: store/memory_store.h). A
// TEST_F runs on PostgreSQL only.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "reshard/v1/agent.pb.h"
#include "reshard/v1/coordinator.pb.h"
#include "services/coordinator/clock.h"
#include "services/coordinator/logic/agent_api.h"
#include "services/coordinator/logic/operation_driver.h"
#include "services/coordinator/logic/scheduler_api.h"
#include "services/coordinator/metrics/metrics.h"
#include "services/coordinator/store/memory_store.h"
#include "services/coordinator/store/pg_store.h"

namespace reshard::coordinator::testing {

/// The status has `code` and its message contains `substring`.
MATCHER_P2(StatusIs, code, substring, "") {
  if (arg.code() == code && absl::StrContains(arg.message(), substring)) return true;
  *result_listener << "status is " << arg;
  return false;
}

/// The checksum CompleteTask reports for shard (item, rank).
inline uint64_t ShardChecksumOf(int item, int rank) {
  return 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(item + 1) + static_cast<uint64_t>(rank);
}

/// A clock the test sets. Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(int64_t now_unix_ms) : now_(now_unix_ms) {}
  int64_t NowUnixMs() const override { return now_.load(); }
  void Advance(int64_t ms) { now_ += ms; }
  void Set(int64_t now_unix_ms) { now_ = now_unix_ms; }

 private:
  std::atomic<int64_t> now_;
};

/// Everything a test can compare to show that a failed call changed nothing.
struct DatabaseSnapshot {
  std::vector<std::string> jobs;        // every job, serialized
  std::vector<std::string> operations;  // every job's operations, serialized
  std::vector<std::string> hosts;
  bool operator==(const DatabaseSnapshot& o) const {
    return jobs == o.jobs && operations == o.operations && hosts == o.hosts;
  }
};

class LogicTest : public ::testing::TestWithParam<std::string> {
 protected:
  static constexpr int64_t kLeaseMs = 10000;

  void SetUp() override;
  void TearDown() override;

  /// A new store on this test's database (what a restarted replica gets);
  /// on the in-memory store, that same store.
  StorePtr ConnectStore();
  /// The test runs on the in-memory store (its parameter is "Memory").
  bool OnMemoryStore() const { return memory_store_; }
  /// A driver on `store` with this fixture's clock and metrics.
  std::unique_ptr<OperationDriver> MakeDriver(StorePtr store,
                                              OperationDriver::Options options = {});

  /// RegisterJob, expected to succeed.
  v1::Job Register(const v1::JobSpec& spec, const std::string& key = "");
  /// RegisterAgent for each host; remembers the epochs.
  void RegisterAgents(const std::vector<std::string>& hosts);
  /// Heartbeat with the remembered epoch.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const std::string& host);
  /// Resize to `target` at the job's current generation.
  absl::StatusOr<v1::Operation> ResizeTo(const v1::Job& job, const v1::Layout& target,
                                         const std::string& key = "");
  void Tick();  // driver_->Tick(), expected OK
  v1::Operation Op(const std::string& operation_id);
  v1::Job Job(const std::string& job_id);
  /// What a well-behaved agent on `host` does: GetTask, then ReportProgress
  /// DONE with a checksum for every shard its slice writes (the whole
  /// plan's for a prepared stop-free task). The checksum of (item, rank) is
  /// ShardChecksumOf(item, rank).
  void CompleteTask(const std::string& host, const std::string& operation_id);
  /// The hosts holding a progress row of the operation.
  std::vector<std::string> Participants(const std::string& operation_id);
  /// RegisterAgents + Resize + Tick: an operation in TRANSFERRING.
  v1::Operation StartTransfer(const v1::Job& job, const v1::Layout& target);

  DatabaseSnapshot Snapshot();
  /// Value of a metric series (0 when absent).
  double MetricValue(const std::string& name, const std::map<std::string, std::string>& labels);

  std::string dsn_;
  FakeClock clock_{0};
  StorePtr store_;
  bool memory_store_ = false;
  /// On the in-memory store: the "database" (outlives store_ being reset).
  std::shared_ptr<MemoryStore> memory_database_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<SchedulerApi> api_;
  std::unique_ptr<AgentApi> agents_;
  std::unique_ptr<OperationDriver> driver_;
  std::map<std::string, int64_t> epochs_;
};

}  // namespace reshard::coordinator::testing

/// Instantiates the TEST_P tests of `suite` (a LogicTest) on both stores.
#define RESHARD_LOGIC_ON_BOTH_STORES(suite)                                     \
  INSTANTIATE_TEST_SUITE_P(                                                     \
      Stores, suite, ::testing::Values(std::string("Postgres"), std::string("Memory")), \
      [](const ::testing::TestParamInfo<std::string>& info) { return info.param; })
