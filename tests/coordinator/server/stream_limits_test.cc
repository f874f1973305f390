// WatchStreamLimits (server/stream_limits.h) by itself: the per-identity,
// per-tenant and total bounds, their RESOURCE_EXHAUSTED messages, slots given back by
// their destructor, moves; and the flags that configure them.
#include "services/coordinator/server/stream_limits.h"

#include <optional>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/server/config.h"

namespace reshard::coordinator {
namespace {

using ::testing::HasSubstr;

WatchStreamLimits::Options Limits(int64_t total, int64_t per_identity) {
  WatchStreamLimits::Options o;
  o.max_total = total;
  o.max_per_identity = per_identity;
  return o;
}

TEST(WatchStreamLimitsTest, PerIdentityLimitNamesTheIdentityAndTheFlag) {
  WatchStreamLimits limits(Limits(10, 2), nullptr);
  std::vector<WatchSlot> held;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<WatchSlot> slot = limits.Acquire("viewer:dash@t", "WatchJob");
    ASSERT_TRUE(slot.ok()) << slot.status();
    held.push_back(*std::move(slot));
  }
  absl::StatusOr<WatchSlot> third = limits.Acquire("viewer:dash@t", "WatchOperation");
  ASSERT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(),
              HasSubstr("too many watch streams for \"viewer:dash@t\": 2 open, limit "
                        "--max-watch-streams-per-identity 2"));
  // Another identity is not affected.
  EXPECT_TRUE(limits.Acquire("viewer:other@t", "WatchJob").ok());
  EXPECT_EQ(limits.open("viewer:dash@t"), 2);
}

TEST(WatchStreamLimitsTest, TotalLimitAcrossIdentities) {
  WatchStreamLimits limits(Limits(3, 2), nullptr);
  std::vector<WatchSlot> held;
  for (const char* who : {"a", "a", "b"}) {
    absl::StatusOr<WatchSlot> slot = limits.Acquire(who, "WatchJob");
    ASSERT_TRUE(slot.ok()) << slot.status();
    held.push_back(*std::move(slot));
  }
  absl::StatusOr<WatchSlot> refused = limits.Acquire("c", "WatchJob");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("too many watch streams on this coordinator: 3 open, limit "
                        "--max-watch-streams 3"));
  EXPECT_EQ(limits.open(), 3);
}

// A tenant's identities share its budget; another tenant's and an admin's
// (no tenant) streams are not counted in it; its slots come back.
TEST(WatchStreamLimitsTest, ATenantsIdentitiesShareItsBudget) {
  WatchStreamLimits::Options o = Limits(100, 4);
  o.max_per_tenant = 3;
  WatchStreamLimits limits(o, nullptr);
  std::vector<WatchSlot> held;
  for (const char* who : {"worker:j1", "worker:j2", "scheduler:s@a"}) {
    absl::StatusOr<WatchSlot> slot = limits.Acquire(who, "a", "WatchJob");
    ASSERT_TRUE(slot.ok()) << slot.status();
    held.push_back(*std::move(slot));
  }
  absl::StatusOr<WatchSlot> refused = limits.Acquire("worker:j3", "a", "WatchJob");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("too many watch streams for tenant \"a\": 3 open, limit "
                        "--max-watch-streams-per-tenant 3 (\"worker:j3\" holds 0)"));
  EXPECT_TRUE(limits.Acquire("worker:k1", "b", "WatchJob").ok());
  EXPECT_TRUE(limits.Acquire("admin", "", "WatchJob").ok());
  EXPECT_EQ(limits.open_in_tenant("a"), 3);
  held.pop_back();
  EXPECT_EQ(limits.open_in_tenant("a"), 2);
  EXPECT_TRUE(limits.Acquire("worker:j3", "a", "WatchJob").ok());
}

// A caller of no tenant (an admin) counts against a tenant budget of its
// own: past it, refused naming itself, while another such caller and a
// tenant are untouched. And the order: a tenant at its budget hears about
// its tenant even when the replica is full too.
TEST(WatchStreamLimitsTest, ACallerOfNoTenantHasABudgetOfItsOwnAndTheTenantComesBeforeTheTotal) {
  WatchStreamLimits::Options o = Limits(5, 4);
  o.max_per_tenant = 2;
  WatchStreamLimits limits(o, nullptr);
  std::vector<WatchSlot> held;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<WatchSlot> slot = limits.Acquire("admin", "", "WatchJob");
    ASSERT_TRUE(slot.ok()) << slot.status();
    held.push_back(*std::move(slot));
  }
  absl::StatusOr<WatchSlot> third = limits.Acquire("admin", "", "WatchJob");
  ASSERT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(third.status().message(),
            "too many watch streams for \"admin\" (no tenant: its own budget): 2 open, limit "
            "--max-watch-streams-per-tenant 2 (\"admin\" holds 2); close one (or wait for it to "
            "end) and retry");
  for (const auto& [who, tenant] : {std::pair<const char*, const char*>{"admin2", ""},
                                    {"worker:j1", "a"},
                                    {"worker:j2", "a"}}) {
    absl::StatusOr<WatchSlot> slot = limits.Acquire(who, tenant, "WatchJob");
    ASSERT_TRUE(slot.ok()) << who << ": " << slot.status();
    held.push_back(*std::move(slot));
  }
  EXPECT_EQ(limits.open(), 5);
  absl::StatusOr<WatchSlot> tenant_full = limits.Acquire("worker:j3", "a", "WatchJob");
  ASSERT_EQ(tenant_full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(tenant_full.status().message(),
              HasSubstr("too many watch streams for tenant \"a\": 2 open, limit "
                        "--max-watch-streams-per-tenant 2"));
  absl::StatusOr<WatchSlot> total_full = limits.Acquire("worker:k1", "b", "WatchJob");
  ASSERT_EQ(total_full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(total_full.status().message(),
              HasSubstr("too many watch streams on this coordinator: 5 open, limit "
                        "--max-watch-streams 5"));
}

// The tenant budget's default: a quarter of the total, at least the
// per-identity limit.
TEST(WatchStreamLimitsTest, TheTenantBudgetDefaultsToAQuarterOfTheTotal) {
  CoordinatorConfig c;
  EXPECT_EQ(WatchTenantBudget(c), 8192);
  c.max_watch_streams = 8;
  c.max_watch_streams_per_identity = 4;
  EXPECT_EQ(WatchTenantBudget(c), 4);
  c.max_watch_streams_per_tenant = 6;
  EXPECT_EQ(WatchTenantBudget(c), 6);
}

TEST(WatchStreamLimitsTest, SlotsComeBackWhenDestroyedMovedOrReleased) {
  WatchStreamLimits limits(Limits(2, 2), nullptr);
  {
    absl::StatusOr<WatchSlot> a = limits.Acquire("x", "WatchJob");
    ASSERT_TRUE(a.ok());
    WatchSlot moved = *std::move(a);
    WatchSlot again = std::move(moved);  // one slot, counted once
    EXPECT_EQ(limits.open(), 1);
    absl::StatusOr<WatchSlot> b = limits.Acquire("x", "WatchJob");
    ASSERT_TRUE(b.ok());
    EXPECT_FALSE(limits.Acquire("x", "WatchJob").ok());
    b->Release();
    b->Release();  // idempotent
    EXPECT_EQ(limits.open("x"), 1);
    again = WatchSlot();  // assigning over a held slot gives it back
    EXPECT_EQ(limits.open(), 0);
    absl::StatusOr<WatchSlot> c = limits.Acquire("x", "WatchOperation");
    ASSERT_TRUE(c.ok());
  }
  EXPECT_EQ(limits.open(), 0);
  EXPECT_EQ(limits.open("x"), 0);
}

std::optional<std::string> NoEnv(const std::string&) { return std::nullopt; }

TEST(WatchStreamLimitsTest, FlagsDefaultsAndValidation) {
  absl::StatusOr<CommandLine> cl =
      ParseCommandLine({"migrate", "--dsn", "dbname=x", "--max-watch-streams", "40",
                        "--max-watch-streams-per-identity", "8", "--watch-resync-ms", "250"},
                       NoEnv);
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ(cl->config.max_watch_streams, 40);
  EXPECT_EQ(cl->config.max_watch_streams_per_identity, 8);
  EXPECT_EQ(cl->config.watch_resync_ms, 250);
  EXPECT_EQ(cl->config.max_rpc_threads, 0);

  const CoordinatorConfig defaults;
  EXPECT_LE(defaults.max_watch_streams_per_identity, defaults.max_watch_streams);

  // Per identity above the total, no streams, a zero safety-poll period:
  // each refused naming its flag.
  for (const auto& [args, flag] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--max-watch-streams", "10", "--max-watch-streams-per-identity", "11"},
            "--max-watch-streams-per-identity"},
           {{"--max-watch-streams", "0"}, "--max-watch-streams"},
           {{"--watch-resync-ms", "0"}, "--watch-resync-ms"}}) {
    std::vector<std::string> all = {"migrate", "--dsn", "dbname=x"};
    all.insert(all.end(), args.begin(), args.end());
    absl::StatusOr<CommandLine> bad = ParseCommandLine(all, NoEnv);
    ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << flag;
    EXPECT_THAT(bad.status().message(), HasSubstr(flag));
  }
  EXPECT_TRUE(ParseCommandLine({"migrate", "--dsn", "dbname=x", "--max-watch-streams", "100",
                                "--max-watch-streams-per-identity", "10", "--max-rpc-threads", "20"},
                               NoEnv)
                  .ok());
  EXPECT_THAT(Usage(), HasSubstr("--max-watch-streams-per-identity"));
}

}  // namespace
}  // namespace reshard::coordinator
