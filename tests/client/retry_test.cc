// Unit tests of the client's retry policy: which codes are retried and the
// backoff's growth, jitter and cap. No network.
#include "client/cpp/retry.h"

#include <random>

#include "client/cpp/coordinator_client.h"
#include "gtest/gtest.h"

namespace reshard::client {
namespace {

TEST(RetryTest, OnlyUnavailableIsRetried) {
  EXPECT_TRUE(IsRetryable(absl::UnavailableError("x")));
  for (const absl::Status& s :
       {absl::NotFoundError("x"), absl::InvalidArgumentError("x"),
        absl::FailedPreconditionError("x"), absl::AbortedError("x"),
        absl::DeadlineExceededError("x"), absl::InternalError("x"), absl::OkStatus()}) {
    EXPECT_FALSE(IsRetryable(s)) << s;
  }
}

TEST(RetryTest, BackoffGrowsWithJitterAndIsCapped) {
  RetryPolicy p;
  p.initial_backoff = absl::Milliseconds(100);
  p.max_backoff = absl::Seconds(1);
  p.multiplier = 2;
  p.jitter = 0.2;
  std::mt19937_64 rng(1);
  for (int i = 0; i < 100; ++i) {
    const absl::Duration first = Backoff(p, 1, rng);
    EXPECT_GE(first, absl::Milliseconds(80));
    EXPECT_LE(first, absl::Milliseconds(120));
    const absl::Duration third = Backoff(p, 3, rng);
    EXPECT_GE(third, absl::Milliseconds(320));
    EXPECT_LE(third, absl::Milliseconds(480));
    EXPECT_LE(Backoff(p, 20, rng), absl::Seconds(1));
  }
  // Jitter spreads the waits.
  absl::Duration lo = absl::InfiniteDuration(), hi = absl::ZeroDuration();
  for (int i = 0; i < 100; ++i) {
    const absl::Duration d = Backoff(p, 2, rng);
    lo = std::min(lo, d);
    hi = std::max(hi, d);
  }
  EXPECT_GT(hi - lo, absl::Milliseconds(20));
}

TEST(IdempotencyKeyTest, FreshEachTime) {
  const std::string a = NewIdempotencyKey(), b = NewIdempotencyKey();
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, b);
  EXPECT_TRUE(IsFinal(v1::OPERATION_STATE_ABORTED));
  EXPECT_FALSE(IsFinal(v1::OPERATION_STATE_TRANSFERRING));
}

}  // namespace
}  // namespace reshard::client
