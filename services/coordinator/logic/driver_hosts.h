// The hosts' states the leader's operation driver works from.
//
// Reading every host's state on every pass costs a query of every host per
// tick and per kick (10,000 rows at 10,000 hosts, five times a second and on
// every report). The driver keeps a copy instead:
//  - read whole when it starts leading, when leases expired (the mass-expiry
//    rule counts the ALIVE hosts: lease_judge.h) and otherwise at most once
//    per refresh period (the gauges);
//  - only the leader marks a host LOST (Store::ExpireLeases) and it marks its
//    copy in the same step, so a host the copy shows ALIVE is ALIVE;
//  - a host the copy does not show ALIVE (not yet seen, or LOST) may have
//    registered since: StateOf reads it again before a step acts on it.
// Not thread-safe (the driver's one thread).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/coordinator/store/store.h"

namespace reshard::coordinator {

class DriverHosts {
 public:
  DriverHosts(Store* store, int64_t refresh_ms) : store_(store), refresh_ms_(refresh_ms) {}

  /// Reads every host's state when `force`, or when the copy is refresh_ms
  /// old (or was never read).
  [[nodiscard]] absl::Status Refresh(int64_t now_ms, bool force);
  /// A host's state for a step: ALIVE from the copy; otherwise read again
  /// (and the copy updated). nullopt: the host never registered.
  [[nodiscard]] absl::StatusOr<std::optional<v1::HostState>> StateOf(const std::string& host_id);
  /// The driver marked `host_id` LOST in the store.
  void MarkLost(const std::string& host_id) { states_[host_id] = v1::HOST_STATE_LOST; }

  /// Every host of the copy, by id.
  const std::map<std::string, v1::HostState>& all() const { return states_; }
  int64_t alive() const;
  /// Reads of every host so far, and of one host (for tests).
  int64_t full_reads() const { return full_reads_; }
  int64_t host_reads() const { return host_reads_; }

 private:
  Store* const store_;
  const int64_t refresh_ms_;
  std::map<std::string, v1::HostState> states_;
  int64_t read_at_ms_ = 0;
  bool read_ = false;
  int64_t full_reads_ = 0;
  int64_t host_reads_ = 0;
};

}  // namespace reshard::coordinator
