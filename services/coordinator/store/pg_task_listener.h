// PgTaskListener: one replica's LISTEN on kTasksChannel (pg_store.h) over a
// dedicated PostgreSQL connection, so that tasks another replica creates
// wake this replica's WaitForTasks long polls (docs/coordinator.md, "Agents
// are told"). A broken connection is re-opened with backoff; every
// (re)connect reports `on_connected`, since notifications sent meanwhile
// are lost (the caller wakes every waiter, whose re-read catches up).
// Thread contract: Start() once; Stop() is idempotent and joins the thread;
// the callbacks run on the listener's thread and must be quick.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace reshard::coordinator {

struct PgTaskListenerOptions {
  std::string dsn;
  int connect_timeout_s = 5;
  /// Backoff between failed connections: doubles from min to max.
  int min_backoff_ms = 100;
  int max_backoff_ms = 5000;
  /// How often the thread looks at Stop() while no notification comes.
  int stop_check_ms = 200;
};

class PgTaskListener {
 public:
  /// `on_host`: a notification's payload (a host id). `on_connected`: the
  /// LISTEN is (again) in place. Either may be empty.
  PgTaskListener(PgTaskListenerOptions options, std::function<void(const std::string&)> on_host,
                 std::function<void()> on_connected);
  ~PgTaskListener();  // Stop()

  void Start();
  void Stop();
  /// Connections made so far (1 once the first LISTEN is in place).
  int connections() const { return connections_.load(); }

 private:
  void Loop();
  /// Sleeps `ms` unless stopped first; false when stopped.
  bool Backoff(int ms);

  const PgTaskListenerOptions options_;
  const std::function<void(const std::string&)> on_host_;
  const std::function<void()> on_connected_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
};

}  // namespace reshard::coordinator
