// Runs the OperationDriver on exactly one replica: a thread that holds the
// LeaderLock (PostgreSQL advisory lock) and ticks the driver while it holds
// it; other replicas keep trying and take over when the holder dies.
// Start() once; Stop() is idempotent and joins the thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "services/coordinator/logic/operation_driver.h"
#include "services/coordinator/metrics/metrics.h"
#include "services/coordinator/store/store.h"

namespace reshard::coordinator {

class LeaderLoop {
 public:
  struct Options {
    int tick_ms = 200;
    int retry_ms = 500;  // between attempts to take the lock
  };

  /// `metrics` may be null.
  LeaderLoop(std::unique_ptr<LeaderLock> lock, OperationDriver* driver, CoordinatorMetrics* metrics,
             Options options);
  ~LeaderLoop();

  void Start();
  void Stop();
  bool IsLeader() const { return leader_.load(); }

 private:
  void Run();

  std::unique_ptr<LeaderLock> lock_;
  OperationDriver* driver_;
  CoordinatorMetrics* metrics_;
  Options options_;
  std::atomic<bool> leader_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace reshard::coordinator
