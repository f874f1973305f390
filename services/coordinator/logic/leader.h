// Runs the OperationDriver on exactly one replica: a thread that holds the
// LeaderLock (PostgreSQL advisory lock) and ticks the driver while it holds
// it; other replicas keep trying and take over when the holder dies. The
// leader also prunes finished rows under the retention policy, in bounded
// batches (EnableRetention).
// EnableRetention() before Start(); Start() once; Stop() is idempotent and
// joins the thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "services/coordinator/logic/operation_driver.h"
#include "services/coordinator/metrics/metrics.h"
#include "services/coordinator/store/store.h"
#include "services/coordinator/store/store_health.h"

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

  /// What the leader prunes, and how much per tick.
  struct Retention {
    RetentionPolicy policy;
    /// Least time between two pruning rounds (0: every tick).
    int interval_ms = 60 * 1000;
    /// Most Store::PruneRetention batches per round (each at most
    /// policy.batch_rows rows per table).
    int batches_per_round = 4;
  };
  /// Prunes `store` under `retention` while leader. `store` must outlive
  /// the loop's thread.
  void EnableRetention(StorePtr store, Retention retention);

  /// Reads the store's health before every driver pass (store_health.h);
  /// while the store does not answer, calls `probe` (a trivial store call)
  /// instead of the pass, so that its answer ends the outage even when
  /// nothing else calls the store. Without it, only a lost leader lock (a
  /// restarted PostgreSQL) grants hosts the grace.
  void WatchStoreHealth(StoreHealthFn health, std::function<absl::Status()> probe);

  /// Runs `pass` after each driver tick while leader (the elastic policies:
  /// PolicyEngine::MaybePass, which keeps its own period); its errors are
  /// logged. Call before Start.
  void EnablePolicies(std::function<absl::Status()> pass);

  void Start();
  void Stop();
  bool IsLeader() const { return leader_.load(); }
  /// Runs the driver's next tick now instead of at its period (an agent's
  /// final report arrived). Thread-safe; a no-op unless this replica leads.
  void Kick();

 private:
  void Run();
  // One pruning round, if due; errors are logged (retried next round).
  void MaybePrune();
  // Whether the driver may tick now; clears *resumed after an outage ended
  // (the driver must resume, granting the lease grace).
  bool StoreAnswers(bool* resumed);

  std::unique_ptr<LeaderLock> lock_;
  OperationDriver* driver_;
  CoordinatorMetrics* metrics_;
  Options options_;
  std::atomic<bool> leader_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool kicked_ = false;  // guarded by mu_
  std::function<absl::Status()> policies_;  // set before Start
  std::thread thread_;
  StorePtr retention_store_;  // null: retention off
  Retention retention_;
  std::chrono::steady_clock::time_point last_prune_{};
  StoreHealthFn health_;  // empty: not watched
  std::function<absl::Status()> probe_;
  uint64_t outages_seen_ = 0;
  bool silent_logged_ = false;
};

}  // namespace reshard::coordinator
