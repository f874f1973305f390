#include "common/rpc/retry.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/random/distributions.h"

namespace reshard::rpc {

namespace {

constexpr RetryPolicy kClientCall{5, absl::Milliseconds(100), absl::Seconds(5), 2.0, 0.5};
constexpr RetryPolicy kUnkeyedMutation{1, absl::Milliseconds(100), absl::Seconds(5), 2.0, 0.5};
constexpr RetryPolicy kAgentCall{0, absl::Milliseconds(100), absl::Seconds(2), 2.0, 0.5};
constexpr RetryPolicy kStreamReconnect{5, absl::Milliseconds(100), absl::Seconds(5), 2.0, 0.5};
constexpr RetryPolicy kWorkerPublish{0, absl::Milliseconds(20), absl::Milliseconds(500), 2.0, 0.5};

}  // namespace

const RetryPolicy& DefaultPolicy(CallKind kind) {
  switch (kind) {
    case CallKind::kClientCall:
      return kClientCall;
    case CallKind::kUnkeyedMutation:
      return kUnkeyedMutation;
    case CallKind::kAgentCall:
      return kAgentCall;
    case CallKind::kStreamReconnect:
      return kStreamReconnect;
    case CallKind::kWorkerPublish:
      return kWorkerPublish;
  }
  return kUnkeyedMutation;
}

bool IsRetryable(CallKind kind, absl::StatusCode code) {
  using C = absl::StatusCode;
  switch (kind) {
    case CallKind::kClientCall:
    case CallKind::kWorkerPublish:
      return code == C::kUnavailable;
    case CallKind::kUnkeyedMutation:
      return false;
    case CallKind::kAgentCall:
    case CallKind::kStreamReconnect:
      return code == C::kUnavailable || code == C::kDeadlineExceeded ||
             code == C::kResourceExhausted;
  }
  return false;
}

bool IsWatchRefusal(absl::StatusCode code) { return code == absl::StatusCode::kResourceExhausted; }

bool IsSilence(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded;
}

absl::Duration BaseBackoff(const RetryPolicy& policy, int attempt) {
  const double initial_us = static_cast<double>(absl::ToInt64Microseconds(policy.initial_backoff));
  const double max_us = static_cast<double>(absl::ToInt64Microseconds(policy.max_backoff));
  const double grown =
      initial_us * std::pow(std::max(1.0, policy.multiplier), std::max(0, attempt - 1));
  return absl::Microseconds(static_cast<int64_t>(std::floor(std::min(max_us, grown))));
}

absl::Duration BackoffAt(const RetryPolicy& policy, int attempt, double u) {
  const double base_us =
      static_cast<double>(absl::ToInt64Microseconds(BaseBackoff(policy, attempt)));
  const double jitter = std::clamp(policy.jitter, 0.0, 1.0);
  const double share = 1.0 - jitter * std::clamp(u, 0.0, 1.0);
  return absl::Microseconds(static_cast<int64_t>(std::floor(base_us * share)));
}

absl::Duration Backoff(const RetryPolicy& policy, int attempt, absl::BitGenRef rng) {
  return BackoffAt(policy, attempt, absl::Uniform(rng, 0.0, 1.0));
}

absl::Time AttemptDeadline(absl::Time overall, absl::Time now, absl::Duration per_attempt) {
  return std::min(overall, now + per_attempt);
}

}  // namespace reshard::rpc
