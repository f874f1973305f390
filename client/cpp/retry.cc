#include "client/cpp/retry.h"

#include <algorithm>
#include <cmath>

namespace reshard::client {

bool IsRetryable(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable;
}

bool IsWatchRefusal(const absl::Status& status) {
  return status.code() == absl::StatusCode::kResourceExhausted;
}

absl::Duration Backoff(const RetryPolicy& policy, int attempt, std::mt19937_64& rng) {
  const double initial_s = absl::ToDoubleSeconds(policy.initial_backoff);
  const double max_s = absl::ToDoubleSeconds(policy.max_backoff);
  const double base =
      std::min(max_s, initial_s * std::pow(std::max(1.0, policy.multiplier), attempt - 1));
  const double jitter = std::clamp(policy.jitter, 0.0, 1.0);
  std::uniform_real_distribution<double> dist(base * (1 - jitter), base * (1 + jitter));
  const double wait = std::clamp(dist(rng), 0.0, max_s);
  return absl::Seconds(wait);
}

}  // namespace reshard::client
