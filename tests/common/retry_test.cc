// Unit tests of common/rpc/retry.h: the table's rows, the codes retried per
// kind, and the backoff's growth, jitter and cap. No network.
#include "common/rpc/retry.h"

#include <random>

#include "gtest/gtest.h"

namespace reshard::rpc {
namespace {

using absl::Microseconds;
using absl::Milliseconds;
using absl::Seconds;
using C = absl::StatusCode;

constexpr CallKind kKinds[] = {CallKind::kClientCall, CallKind::kUnkeyedMutation,
                               CallKind::kAgentCall, CallKind::kStreamReconnect,
                               CallKind::kWorkerPublish};

void ExpectPolicy(CallKind kind, int max_attempts, absl::Duration initial, absl::Duration cap) {
  const RetryPolicy& p = DefaultPolicy(kind);
  EXPECT_EQ(p.max_attempts, max_attempts);
  EXPECT_EQ(p.initial_backoff, initial);
  EXPECT_EQ(p.max_backoff, cap);
  EXPECT_EQ(p.multiplier, 2.0);
  EXPECT_EQ(p.jitter, 0.5);
}

TEST(RetryTest, TheTable) {
  ExpectPolicy(CallKind::kClientCall, 5, Milliseconds(100), Seconds(5));
  ExpectPolicy(CallKind::kUnkeyedMutation, 1, Milliseconds(100), Seconds(5));
  ExpectPolicy(CallKind::kAgentCall, 0, Milliseconds(100), Seconds(2));
  ExpectPolicy(CallKind::kStreamReconnect, 5, Milliseconds(100), Seconds(5));
  ExpectPolicy(CallKind::kWorkerPublish, 0, Milliseconds(20), Milliseconds(500));
}

TEST(RetryTest, RetriedCodesPerKind) {
  for (int n = 0; n <= 16; ++n) {
    const auto code = static_cast<C>(n);
    const bool unavailable = code == C::kUnavailable;
    const bool agent = unavailable || code == C::kDeadlineExceeded || code == C::kResourceExhausted;
    EXPECT_EQ(IsRetryable(CallKind::kClientCall, code), unavailable) << n;
    EXPECT_EQ(IsRetryable(CallKind::kWorkerPublish, code), unavailable) << n;
    EXPECT_FALSE(IsRetryable(CallKind::kUnkeyedMutation, code)) << n;
    EXPECT_EQ(IsRetryable(CallKind::kAgentCall, code), agent) << n;
    EXPECT_EQ(IsRetryable(CallKind::kStreamReconnect, code), agent) << n;
    EXPECT_EQ(IsWatchRefusal(code), code == C::kResourceExhausted) << n;
    EXPECT_EQ(IsSilence(code), unavailable || code == C::kDeadlineExceeded) << n;
  }
  for (CallKind kind : kKinds) {
    for (C answer : {C::kOk, C::kNotFound, C::kInvalidArgument, C::kFailedPrecondition, C::kAborted,
                     C::kInternal, C::kUnimplemented, C::kPermissionDenied}) {
      EXPECT_FALSE(IsRetryable(kind, answer));
    }
  }
}

TEST(RetryTest, BaseBackoffDoublesToTheCap) {
  const RetryPolicy& p = DefaultPolicy(CallKind::kClientCall);
  EXPECT_EQ(BaseBackoff(p, 1), Milliseconds(100));
  EXPECT_EQ(BaseBackoff(p, 2), Milliseconds(200));
  EXPECT_EQ(BaseBackoff(p, 3), Milliseconds(400));
  EXPECT_EQ(BaseBackoff(p, 6), Milliseconds(3200));
  EXPECT_EQ(BaseBackoff(p, 7), Seconds(5));
  EXPECT_EQ(BaseBackoff(p, 1000), Seconds(5));
  const RetryPolicy& agent = DefaultPolicy(CallKind::kAgentCall);
  EXPECT_EQ(BaseBackoff(agent, 5), Milliseconds(1600));
  EXPECT_EQ(BaseBackoff(agent, 6), Seconds(2));
  const RetryPolicy& publish = DefaultPolicy(CallKind::kWorkerPublish);
  EXPECT_EQ(BaseBackoff(publish, 1), Milliseconds(20));
  EXPECT_EQ(BaseBackoff(publish, 5), Milliseconds(320));
  EXPECT_EQ(BaseBackoff(publish, 6), Milliseconds(500));
}

TEST(RetryTest, BackoffAtExactValues) {
  const RetryPolicy& p = DefaultPolicy(CallKind::kClientCall);
  EXPECT_EQ(BackoffAt(p, 1, 0.0), Milliseconds(100));
  EXPECT_EQ(BackoffAt(p, 1, 0.25), Microseconds(87500));
  EXPECT_EQ(BackoffAt(p, 1, 0.5), Milliseconds(75));
  // floor(100000 * (1 - 0.5 * 0.999)) in doubles: 50049.99999999999.
  EXPECT_EQ(BackoffAt(p, 1, 0.999), Microseconds(50049));
  EXPECT_EQ(BackoffAt(p, 3, 0.5), Milliseconds(300));
  EXPECT_EQ(BackoffAt(p, 12, 0.0), Seconds(5));
  EXPECT_EQ(BackoffAt(p, 12, 0.25), Microseconds(4375000));
  EXPECT_EQ(BackoffAt(p, 12, 0.999), Microseconds(2502499));
  const RetryPolicy& publish = DefaultPolicy(CallKind::kWorkerPublish);
  EXPECT_EQ(BackoffAt(publish, 2, 0.999), Microseconds(20019));
  EXPECT_EQ(BackoffAt(publish, 9, 0.5), Milliseconds(375));
  // Rounded down to whole microseconds.
  const RetryPolicy odd{0, absl::Microseconds(3), absl::Seconds(1), 2.0, 0.5};
  EXPECT_EQ(BackoffAt(odd, 1, 0.5), Microseconds(2));  // 2.25 us
}

TEST(RetryTest, BackoffIsJitteredDownwardsAndNeverAboveTheCap) {
  RetryPolicy p = DefaultPolicy(CallKind::kClientCall);
  p.max_backoff = Seconds(1);
  std::mt19937_64 rng(1);
  int on_cap = 0;
  for (int i = 0; i < 200; ++i) {
    const absl::Duration first = Backoff(p, 1, rng);
    EXPECT_GT(first, Milliseconds(50));
    EXPECT_LE(first, Milliseconds(100));
    const absl::Duration third = Backoff(p, 3, rng);
    EXPECT_GT(third, Milliseconds(200));
    EXPECT_LE(third, Milliseconds(400));
    const absl::Duration capped = Backoff(p, 20, rng);
    EXPECT_GT(capped, Milliseconds(500));
    EXPECT_LE(capped, Seconds(1));
    if (capped == Seconds(1)) ++on_cap;
  }
  EXPECT_LE(on_cap, 2);  // no pile-up on the cap
  // Jitter spreads the waits.
  absl::Duration lo = absl::InfiniteDuration(), hi = absl::ZeroDuration();
  for (int i = 0; i < 100; ++i) {
    const absl::Duration d = Backoff(p, 2, rng);
    lo = std::min(lo, d);
    hi = std::max(hi, d);
  }
  EXPECT_GT(hi - lo, Milliseconds(50));
}

TEST(RetryTest, AttemptDeadlineIsTheEarlier) {
  const absl::Time now = absl::FromUnixSeconds(1000);
  EXPECT_EQ(AttemptDeadline(now + Seconds(30), now, Seconds(5)), now + Seconds(5));
  EXPECT_EQ(AttemptDeadline(now + Seconds(3), now, Seconds(5)), now + Seconds(3));
  EXPECT_EQ(AttemptDeadline(now + Seconds(3), now, absl::InfiniteDuration()), now + Seconds(3));
}

}  // namespace
}  // namespace reshard::rpc
