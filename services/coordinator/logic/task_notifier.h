// A per-host "tasks changed" signal (docs/coordinator.md, "Agents are told"):
// the store's task-creating transactions (this replica's, directly; another
// replica's, through PostgreSQL LISTEN/NOTIFY) bump a host's version, and a
// WaitForTasks long poll on that host sleeps on it instead of re-reading the
// store. Hosts never leave the map (one small entry per host ever seen).
// A waiter either blocks a thread (WaitChanged) or holds none (Subscribe:
// a callback, for the gRPC callback API's long polls, task_waits.h).
// Thread-safe; Shutdown() is idempotent and wakes every waiter.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace reshard::coordinator {

class TaskNotifier {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  enum class Wake { kChanged, kTimedOut, kShutDown };
  /// A subscriber's wake-up: kChanged or kShutDown (never kTimedOut).
  using Callback = std::function<void(Wake)>;

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
  /// WaitChanged that holds no thread: `callback` runs once, on the thread
  /// of the Notify/NotifyAll/Shutdown that ends the wait, without this
  /// class's lock held (so it may call in again); it must be quick. When the
  /// version already differs from `seen` or after Shutdown it subscribes
  /// nothing and returns that wake at once; otherwise nullopt, and
  /// `*subscription` names the subscription for Unsubscribe.
  std::optional<Wake> Subscribe(const std::string& host_id, uint64_t seen, Callback callback,
                                uint64_t* subscription);
  /// Drops a subscription whose callback has not run (else nothing): after
  /// it returns the callback is not called any more, unless it already runs.
  void Unsubscribe(uint64_t subscription);
  /// Subscriptions waiting now (tests, metrics).
  size_t subscribers();
  /// Wakes every waiter and makes later waits return at once.
  void Shutdown();

 private:
  struct Host {
    uint64_t version = 0;
    std::condition_variable cv;
    std::map<uint64_t, Callback> subscribers;  // by subscription id
  };
  /// Moves the callbacks of `host` (all hosts: null) out of the maps.
  void TakeSubscribersLocked(Host* host, std::vector<Callback>* out);
  Host& HostLocked(const std::string& host_id);

  std::mutex mu_;
  std::map<std::string, std::unique_ptr<Host>> hosts_;
  std::map<uint64_t, Host*> subscribed_;  // subscription id -> its host
  uint64_t next_subscription_ = 1;
  uint64_t all_ = 0;  // NotifyAll's count, part of every host's version
  bool shut_down_ = false;
};

}  // namespace reshard::coordinator
