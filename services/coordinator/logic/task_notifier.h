// A per-host "tasks changed" signal (docs/coordinator.md, "Agents are told"):
// the store's task-creating transactions (this replica's, directly; another
// replica's, through PostgreSQL LISTEN/NOTIFY) bump a host's version, and a
// WaitForTasks long poll on that host sleeps on it instead of re-reading the
// store. Hosts never leave the map (one small entry per host ever seen).
// Thread-safe; Shutdown() is idempotent and wakes every waiter.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace reshard::coordinator {

class TaskNotifier {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  enum class Wake { kChanged, kTimedOut, kShutDown };

  /// `host_id`'s tasks may have changed: bumps its version, wakes its waiters.
  void Notify(const std::string& host_id);
  /// Every host's tasks may have changed (a listener reconnected and may
  /// have missed notifications meanwhile).
  void NotifyAll();
  /// `host_id`'s version now: read it before reading the store, then wait
  /// for a change from it, so a change committed in between is not missed.
  uint64_t Version(const std::string& host_id);
  /// Blocks until `host_id`'s version differs from `seen`, `until` passes,
  /// or Shutdown() (at once after it); says which.
  Wake WaitChanged(const std::string& host_id, uint64_t seen, TimePoint until);
  /// Wakes every waiter and makes later waits return at once.
  void Shutdown();

 private:
  struct Host {
    uint64_t version = 0;
    std::condition_variable cv;
  };
  Host& HostLocked(const std::string& host_id);

  std::mutex mu_;
  std::map<std::string, std::unique_ptr<Host>> hosts_;
  uint64_t all_ = 0;  // NotifyAll's count, part of every host's version
  bool shut_down_ = false;
};

}  // namespace reshard::coordinator
