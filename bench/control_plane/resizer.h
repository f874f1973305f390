// The jobs of control_plane_bench and the operations on them: J small jobs
// (one replicated tensor, dp 2 on two hosts with one device each), each
// resized back and forth between two host pairs, a few operations in flight
// at a time; and what their operations tell: task pickup latency (Resize's
// answer -> a target host's first sight of the operation) and cross-replica
// delivery (Resize's answer on one replica -> a watcher of the other replica
// seeing the job name the operation). Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "reshard/v1/coordinator.grpc.pb.h"

namespace reshard::bench {

using Clock = std::chrono::steady_clock;

class Resizer {
 public:
  /// Jobs use hosts h(4j) .. h(4j+3) modulo `hosts`.
  Resizer(v1::CoordinatorService::Stub* stub, int jobs, int hosts, int in_flight);
  ~Resizer();  // Stop()

  /// RegisterJob for every job (sequentially).
  [[nodiscard]] absl::Status RegisterJobs();
  const std::vector<std::string>& job_ids() const { return job_ids_; }

  /// Starts resizing from a thread; operations created while `row` >= 0
  /// count towards that row's figures.
  void Start();
  void SetRow(int row) { row_.store(row); }
  /// Stops creating operations and waits (`drain`) for those in flight to
  /// commit. Idempotent.
  void Stop(std::chrono::milliseconds drain);

  /// From SimHosts: a host learned of an operation.
  void Picked(const std::string& operation_id, const std::string& host_id, Clock::time_point when,
              bool by_poll);
  /// From a watcher of the other replica.
  void CrossSeen(const v1::Job& job, Clock::time_point when);

  struct RowFigures {
    int created = 0;
    int committed = 0;
    std::vector<double> pickup_ms;  // one per target host of each operation
    int picked_by_heartbeat = 0;    // of those, learned from a heartbeat first
    std::vector<double> cross_ms;   // one per operation seen on the other replica
  };
  /// The figures of operations created in `row` (complete once they committed).
  RowFigures Figures(int row) const;
  int64_t committed() const { return committed_.load(); }
  /// Operations that ended other than COMMITTED, failed calls, operations
  /// not committed by Stop's drain, target hosts that never picked one up.
  int64_t errors() const { return errors_.load(); }
  std::string first_error() const;

 private:
  struct Job {
    std::string id;
    int64_t generation = 0;
    std::string pair[2][2];  // host ids of pair 0 and pair 1
    int on = 0;              // the pair the current generation is on
  };
  struct Op {
    int job = 0;
    int row = -1;
    Clock::time_point created;
    std::set<std::string> targets;
    bool committed = false;
  };
  void Run();
  void Failed(const std::string& what);
  [[nodiscard]] bool StartResize(int job);
  void PollInFlight();

  v1::CoordinatorService::Stub* const stub_;
  const int hosts_;
  const int in_flight_;
  std::vector<Job> jobs_;
  std::vector<std::string> job_ids_;
  std::atomic<int> row_{-1};
  std::atomic<bool> stop_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> committed_{0}, errors_{0};
  std::thread thread_;

  mutable std::mutex mu_;
  std::map<std::string, Op> ops_;           // by operation id
  std::map<std::string, int> running_;      // operation id -> job, in flight
  std::map<std::string, std::map<std::string, std::pair<Clock::time_point, bool>>> picked_;
  std::map<std::string, Clock::time_point> cross_seen_;  // first sight per operation
  std::string first_error_;
  int next_job_ = 0;
};

}  // namespace reshard::bench
