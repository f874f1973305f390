// How the database has been answering the store's calls. The leader's lease
// sweep reads it (LeaderLoop::WatchStoreHealth): a host whose heartbeats
// could not be recorded because the database did not answer must not be
// judged over that time (docs/coordinator.md, "When PostgreSQL does not
// answer").
#pragma once

#include <cstdint>
#include <functional>

namespace reshard::coordinator {

struct StoreHealth {
  /// False while the database has left a call without an answer (waiting,
  /// timed out, or failing to connect) for longer than the store's outage
  /// threshold, and has answered nothing since.
  bool answering = true;
  /// Outages that ended: each a silence longer than the threshold, ended by
  /// the database answering again. Only ever grows.
  uint64_t outages = 0;
  /// How long the database has been silent now (0 when nothing waits).
  int64_t silent_ms = 0;
  /// How long the last ended outage lasted.
  int64_t last_outage_ms = 0;
};

/// Reads a store's health now; thread-safe.
using StoreHealthFn = std::function<StoreHealth()>;

}  // namespace reshard::coordinator
