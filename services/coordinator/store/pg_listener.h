// PgListener: one replica's LISTEN on the store's channels (pg_store.h:
// kTasksChannel, kChangesChannel) over one dedicated PostgreSQL connection,
// so that what any replica commits reaches this one at commit: tasks wake
// WaitForTasks long polls ("Agents are told"), changes reach the change feed
// ("Change feed", docs/coordinator.md). A broken connection is re-opened
// with backoff; every (re)connect reports `on_connected`, since
// notifications sent meanwhile are lost (the caller wakes every waiter and
// re-reads what it watches, which catches up).
// Thread contract: Start() once; Stop() is idempotent and joins the thread;
// the callbacks run on the listener's thread and must be quick.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace reshard::coordinator {

struct PgListenerOptions {
  std::string dsn;
  /// What to LISTEN on (at least one).
  std::vector<std::string> channels;
  int connect_timeout_s = 5;
  /// Backoff between failed connections: doubles from min to max.
  int min_backoff_ms = 100;
  int max_backoff_ms = 5000;
  /// How often the thread looks at Stop() while no notification comes.
  int stop_check_ms = 200;
};

class PgListener {
 public:
  using OnNotification =
      std::function<void(const std::string& channel, const std::string& payload)>;
  /// `on_notification`: one notification. `on_connected`: every LISTEN is
  /// (again) in place. Either may be empty.
  PgListener(PgListenerOptions options, OnNotification on_notification,
             std::function<void()> on_connected);
  ~PgListener();  // Stop()

  void Start();
  void Stop();
  /// Connections made so far (1 once the first LISTEN is in place).
  int connections() const { return connections_.load(); }

 private:
  void Loop();
  /// Sleeps `ms` unless stopped first; false when stopped.
  bool Backoff(int ms);

  const PgListenerOptions options_;
  const OnNotification on_notification_;
  const std::function<void()> on_connected_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
};

}  // namespace reshard::coordinator
