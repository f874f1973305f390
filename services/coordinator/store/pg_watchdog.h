// A client-side deadline for libpq calls. A stopped (SIGSTOP) or frozen
// PostgreSQL server's kernel still ACKs TCP, so neither the server's
// statement_timeout nor TCP keepalives / tcp_user_timeout end a call that
// waits for its answer: libpq would wait forever. The watchdog shuts the
// connection's socket down once its deadline passes, so that libpq returns
// with a broken connection, which the caller discards (Unavailable).
//
// The watchdog watches a dup() of the socket: libpq may close its own
// descriptor when the connection breaks, and a descriptor number reused by
// another socket is never touched.
//
// Internal to the store component. Thread contract: thread-safe; one
// thread of its own, joined by the destructor.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>

namespace reshard::coordinator::pg {

class SocketWatchdog {
 public:
  using Clock = std::chrono::steady_clock;

  SocketWatchdog();
  ~SocketWatchdog();
  SocketWatchdog(const SocketWatchdog&) = delete;
  SocketWatchdog& operator=(const SocketWatchdog&) = delete;

  /// Watches `socket` until Disarm: once `deadline` passes without a later
  /// Extend, the socket is shut down (both directions). Returns the watch's
  /// id; 0 when the socket could not be duplicated (then nothing is watched).
  uint64_t Arm(int socket, Clock::time_point deadline);
  /// Moves the watch's deadline (later only; an earlier one is ignored).
  void Extend(uint64_t id, Clock::time_point deadline);
  /// Stops watching; true when the deadline had fired (the socket is shut
  /// down). A no-op returning false for id 0.
  bool Disarm(uint64_t id);

 private:
  struct Watch {
    int fd;  // our dup
    Clock::time_point deadline;
    bool fired = false;
  };
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Watch> watches_;
  uint64_t next_id_ = 1;
  bool stop_ = false;
  std::thread thread_;
};

/// A watch for the lifetime of a scope: arms on construction, disarms on
/// destruction; fired() says whether the deadline ended the call.
class ScopedWatch {
 public:
  ScopedWatch(SocketWatchdog* watchdog, int socket, std::chrono::milliseconds timeout)
      : watchdog_(watchdog),
        id_(watchdog->Arm(socket, SocketWatchdog::Clock::now() + timeout)) {}
  ~ScopedWatch() { Disarm(); }
  ScopedWatch(const ScopedWatch&) = delete;
  ScopedWatch& operator=(const ScopedWatch&) = delete;
  /// The watch's id for SocketWatchdog::Extend (0: nothing watched).
  uint64_t id() const { return id_; }
  /// Disarms now; true when the deadline had fired. Idempotent.
  bool Disarm() {
    if (id_ != 0) {
      fired_ = watchdog_->Disarm(id_);
      id_ = 0;
    }
    return fired_;
  }

 private:
  SocketWatchdog* watchdog_;
  uint64_t id_;
  bool fired_ = false;
};

}  // namespace reshard::coordinator::pg
