// Unit tests of the C++ client's pure pieces: idempotency keys and final
// states. No network. (Its retry policy is common/rpc's, tested in
// tests/common/retry_test.cc.)
#include "client/cpp/coordinator_client.h"
#include "gtest/gtest.h"

namespace reshard::client {
namespace {

TEST(ClientOptionsTest, RetryIsTheClientCallRowOfTheTable) {
  const CoordinatorClient::Options o;
  const rpc::RetryPolicy& row = rpc::DefaultPolicy(rpc::CallKind::kClientCall);
  EXPECT_EQ(o.retry.max_attempts, 5);
  EXPECT_EQ(o.retry.max_attempts, row.max_attempts);
  EXPECT_EQ(o.retry.initial_backoff, row.initial_backoff);
  EXPECT_EQ(o.retry.max_backoff, row.max_backoff);
  EXPECT_EQ(o.retry.multiplier, row.multiplier);
  EXPECT_EQ(o.retry.jitter, row.jitter);
  EXPECT_EQ(o.call_timeout, absl::Seconds(30));
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
