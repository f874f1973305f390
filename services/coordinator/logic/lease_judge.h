// When the leader may judge leases and stalls: only while it is itself
// healthy (docs/coordinator.md, "Busy is not dead"). A busy host and a dead
// one look alike to a clock; a coordinator that is itself late, whose
// heartbeats wait to be recorded, or that sees most hosts expire at once
// suspects itself (or the network) before it blames the hosts. Pure: the
// caller gives the times and counts; no store, no clock of its own.
#pragma once

#include <cstdint>
#include <string>

namespace reshard::coordinator {

class LeaseJudge {
 public:
  /// Fewer hosts than this expiring together are never a mass expiry: in a
  /// small cluster one or two hosts dying is the common case.
  static constexpr int64_t kMassExpiryMinHosts = 3;

  struct Options {
    int64_t lease_ms = 10000;
    /// The leader's period between passes (LeaderLoop's tick_ms); 0: no pass
    /// is late (the caller steps a fake clock by whole seconds).
    int64_t tick_ms = 200;
  };

  enum class Reason { kNone, kLatePass, kHeartbeatBacklog, kMassExpiry };
  /// The metric label of a reason ("late_pass", "heartbeat_backlog",
  /// "mass_expiry"; "" for kNone).
  static const char* Label(Reason reason);

  struct Verdict {
    bool judge = true;
    Reason reason = Reason::kNone;
    std::string why;  // for the log line, when !judge or a deferral ended
  };

  explicit LeaseJudge(Options options) : options_(options) {}

  /// A new leadership or the end of a store outage: judgement starts over.
  void Reset(int64_t now_ms);

  /// At the start of each pass: whether leases and stalls may be judged now.
  /// `heartbeat_lag_ms` is how long the oldest heartbeat not yet recorded has
  /// waited (0: none waits). The pass is late when it began more than
  /// tick_ms + lease/4 after the previous one (this process did not run, or a
  /// pass took that long): judgement waits one heartbeat period (lease/3)
  /// from then, so that the beats that queued meanwhile are recorded first.
  /// Heartbeats waiting longer than lease/4 to be recorded: no judgement
  /// while they wait.
  Verdict BeginPass(int64_t now_ms, int64_t heartbeat_lag_ms);

  /// Whether `expired` hosts whose lease ended, of `alive` hosts counted
  /// ALIVE (the expired ones included), are marked LOST now. More than half
  /// of them, and at least kMassExpiryMinHosts, at once: deferred, for at
  /// most one lease from the first such pass; still silent after it, they
  /// are judged.
  Verdict Expiries(int64_t now_ms, int64_t expired, int64_t alive);

  /// True when the last BeginPass found the pass late: stall clocks restart.
  bool last_pass_was_late() const { return last_pass_late_; }

 private:
  Options options_;
  int64_t last_pass_ms_ = 0;
  int64_t suspended_until_ms_ = 0;
  int64_t mass_since_ms_ = 0;  // 0: no mass expiry being deferred
  bool last_pass_late_ = false;
};

}  // namespace reshard::coordinator
