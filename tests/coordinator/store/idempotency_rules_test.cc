// The rules of a reused idempotency key (store/idempotency.h), alone: a
// replay of the same request, a free key, a key used for another request or
// method, a scope that cannot be stored, and a key a concurrent request took.
// The Stores' persistence of keys runs in the contract suite
// (idempotency_scope_test.cc, delete_job_idempotency_test.cc).
#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "services/coordinator/store/idempotency.h"

namespace reshard::coordinator {
namespace {

Idempotency Key(const std::string& method, const std::string& hash) {
  Idempotency idem;
  idem.tenants = {"t1"};
  idem.key = "k";
  idem.method = method;
  idem.request_hash = hash;
  return idem;
}

TEST(IdempotencyRules, AKeyTheScopeHasNotUsedIsFree) {
  absl::StatusOr<std::optional<std::string>> r = ReplayOf(Key("Resize", "h"), std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, std::nullopt);
}

TEST(IdempotencyRules, TheSameRequestGetsTheFirstCallsResource) {
  absl::StatusOr<std::optional<std::string>> r =
      ReplayOf(Key("Resize", "h"), KeyUse{"Resize", "h", "op-1"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, std::optional<std::string>("op-1"));
}

TEST(IdempotencyRules, AnotherRequestWithTheKeyIsRefusedNamingTheFirstMethod) {
  // Another request of the same method, and the same request of another.
  for (const Idempotency& idem : {Key("Resize", "h2"), Key("Migrate", "h")}) {
    const absl::Status s = ReplayOf(idem, KeyUse{"Resize", "h", "op-1"}).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << idem.method;
    EXPECT_EQ(s.message(),
              "idempotency key \"k\" was already used for a different Resize request; use a "
              "new key");
  }
}

TEST(IdempotencyRules, AScopeWithANulByteInATenantIsRefused) {
  EXPECT_TRUE(CheckKeyScope(Key("Resize", "h")).ok());
  Idempotency idem = Key("Resize", "h");
  idem.tenants.push_back(std::string("t\0z", 3));
  const absl::Status s = CheckKeyScope(idem);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "idempotency key tenant \"t\\x00z\" contains a NUL byte");
}

TEST(IdempotencyRules, AKeyTakenConcurrentlyIsAbortedToRetry) {
  const absl::Status s = KeyTakenConcurrently(Key("CancelOperation", "h"));
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(s.message(), "idempotency key \"k\" was taken by a concurrent request; retry");
}

}  // namespace
}  // namespace reshard::coordinator
