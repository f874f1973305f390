// Timers that wait on peers of an operation (their transfer proofs, their
// step seals) and the coordinator's reach that they must allow for. A peer
// starts its task only once the coordinator has handed it out, and the
// coordinator hands out nothing while its store (PostgreSQL) does not answer;
// the coordinator's own lease rule stops counting for such a silence
// (docs/coordinator.md, "When PostgreSQL does not answer"). So a wait on
// peers counts only the time this agent's coordinator calls were answered:
// while they are not (UNAVAILABLE, no answer) the wait never expires, and
// afterwards its deadline is later by the time they were not.
// CoordinatorReach: thread-safe. PeerWait: one thread.
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

namespace reshard::agent {

/// What this agent saw of its coordinator's answers (the session reports its
/// heartbeats). Thread-safe.
class CoordinatorReach {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Clock = std::function<TimePoint()>;
  /// `now` defaults to steady_clock (tests pass a fake clock).
  explicit CoordinatorReach(Clock now = nullptr);

  /// A call was answered now: a silence, if any, ends; returns how long it
  /// lasted (0 when there was none).
  std::chrono::milliseconds Answered();
  /// A call sent at `sent_at` got no answer (UNAVAILABLE, a deadline): unless
  /// it already was, the coordinator is silent since its last answer (as the
  /// coordinator counts its store's silence: nothing answered since; also for
  /// a call sent before that answer), or since `sent_at` when it never
  /// answered. Returns whether a silence began.
  bool Unanswered(TimePoint sent_at);

  /// Whether the coordinator is silent now.
  bool Silent() const;
  /// The total time the coordinator was silent, an ongoing silence included.
  std::chrono::milliseconds SilentSoFar() const;
  TimePoint Now() const;

 private:
  Clock now_;
  mutable std::mutex mu_;
  std::optional<TimePoint> last_answer_;
  std::optional<TimePoint> silent_since_;
  std::chrono::steady_clock::duration silent_total_{0};
};

/// The budget of one wait on peers: `timeout` of time during which the
/// coordinator answered (all time without a `reach`). Implicitly made from a
/// timeout alone.
struct PeerWaitBudget {
  PeerWaitBudget(std::chrono::milliseconds t) : timeout(t) {}  // NOLINT: implicit by design
  PeerWaitBudget(std::chrono::milliseconds t, const CoordinatorReach* r) : timeout(t), reach(r) {}
  std::chrono::milliseconds timeout;
  const CoordinatorReach* reach = nullptr;
};

/// One wait, started at construction.
class PeerWait {
 public:
  explicit PeerWait(PeerWaitBudget budget);
  /// Whether `timeout` of answered time has passed (never while silent).
  bool Expired() const;
  /// For a message: "60 s" or "3 s (not counting 9.1 s while the coordinator
  /// did not answer)".
  std::string Waited() const;

 private:
  std::chrono::steady_clock::time_point Now() const;
  std::chrono::milliseconds SilentSinceStart() const;
  PeerWaitBudget budget_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::milliseconds silent_at_start_{0};
};

}  // namespace reshard::agent
