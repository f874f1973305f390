// Retry policy of the coordinator client: which codes are retried and how
// long to wait between attempts. Pure apart from the random source passed in;
// thread-compatible.
#pragma once

#include <cstdint>
#include <random>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace reshard::client {

/// Retries with exponential backoff and jitter. Only UNAVAILABLE is retried:
/// every other code is the server's answer (docs/client.md, "C++ client", Retries).
struct RetryPolicy {
  /// Attempts per logical call, the first included; 1 disables retries.
  int max_attempts = 5;
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  double multiplier = 2.0;
  /// Each wait is drawn uniformly from [b * (1 - jitter), b * (1 + jitter)]
  /// where b is the exponential backoff, then capped at max_backoff.
  double jitter = 0.2;
};

/// Whether a call that ended with `status` may be sent again.
bool IsRetryable(const absl::Status& status);

/// Whether a watch stream that ended with `status` was refused for the
/// coordinator's watch limits (RESOURCE_EXHAUSTED: the caller's, its
/// tenant's or the replica's streams are all open). Such a watch waits for a
/// slot, with backoff, for as long as its deadline allows; the refusals do
/// not count against max_attempts (a busy coordinator is not a failure).
bool IsWatchRefusal(const absl::Status& status);

/// The wait before attempt `attempt + 1` after attempt `attempt` (1-based)
/// failed: initial * multiplier^(attempt-1), jittered, at most max_backoff.
absl::Duration Backoff(const RetryPolicy& policy, int attempt, std::mt19937_64& rng);

}  // namespace reshard::client
