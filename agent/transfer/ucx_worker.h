// The UCX context and worker of the UCX transport (ucx_transport.h), and what
// every part of it shares: UCX statuses as absl::Status, tag matching, and the
// progress thread's sleep (the worker's event fd in epoll). Internal to the
// transport. Not thread-safe except Signal; the transport's progress thread
// makes every other call (as NIXL's nixlUcxContext / nixlUcxWorker split them).
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "agent/transfer/transport.h"

namespace reshard::agent {

using UcxClock = std::chrono::steady_clock;

/// Matches every bit of a tag.
inline constexpr uint64_t kUcxFullMask = ~uint64_t{0};

/// Whether tags `a` and `b` agree on the bits of `mask`.
inline bool TagsAgree(uint64_t a, uint64_t b, uint64_t mask) { return (a & mask) == (b & mask); }

/// `s` as the absl code a caller acts on (peer trouble: Unavailable; a
/// message of the wrong size: InvalidArgument; ...), the message "what: UCX's
/// text". OK for UCS_OK.
absl::Status FromUcs(ucs_status_t s, const std::string& what);

/// Idle progress calls before the progress thread sleeps, from the value of
/// RESHARD_UCX_IDLE_SPINS (null: unset): 8 unless it is a number >= 0.
int ParseIdleSpins(const char* value);
/// ParseIdleSpins of this process's RESHARD_UCX_IDLE_SPINS, read once.
int IdleSpins();

class UcxWorker {
 public:
  UcxWorker() = default;
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  /// Makes the context (tag + wakeup features, `options`' devices and
  /// transports) and a single-threaded worker.
  [[nodiscard]] absl::Status Init(const UcxOptions& options);
  /// Makes the worker's event fd sleepable on (Sleep).
  [[nodiscard]] absl::Status EnableSleep();

  ucp_worker_h get() const { return worker_; }
  /// One ucp_worker_progress; whether it did anything.
  bool Progress() { return ucp_worker_progress(worker_) != 0; }
  /// Wakes a Sleep (thread-safe while the worker lives).
  void Signal() { ucp_worker_signal(worker_); }
  /// Sleeps until UCX or Signal wakes the worker, at most `timeout_ms`;
  /// false, at once, when UCX has events to progress first.
  bool Sleep(int timeout_ms);

  /// Teardown, in the transport's order: the sleep's fd, the worker, the
  /// context. Each is idempotent.
  void CloseSleep();
  void DestroyWorker();
  void Cleanup();

 private:
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  int epfd_ = -1;
};

}  // namespace reshard::agent
