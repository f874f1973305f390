// Faults caused for real: connections terminated by the server, the server
// killed and restarted; and the leader lock moving when its holder's
// connection dies.
//
// The contract tested (pg_store.h): a call whose pooled connection died
// before it committed reconnects and succeeds; a call made while the server
// is down is Unavailable; once the server is back, calls succeed again.
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "services/coordinator/store/migrator.h"
#include "tests/coordinator/store/store_fixture.h"

namespace reshard::coordinator::store_test {
namespace {

using FaultsTest = PgStoreTest;

TEST_F(FaultsTest, TerminatedConnectionsAreReplacedTransparently) {
  ASSERT_TRUE(store_->CreateJob("job-1", test_support::StoreSmallSpec("llama"), {}).ok());
  // Open all four pooled connections.
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 20; ++k) EXPECT_TRUE(store_->GetJob("job-1", true).ok());
    });
  }
  for (std::thread& t : threads) t.join();

  absl::StatusOr<testing::TestPostgres*> pg = testing::SharedTestPostgres();
  ASSERT_TRUE(pg.ok());
  absl::StatusOr<int> killed = (*pg)->TerminateConnections(DatabaseOf(dsn_));
  ASSERT_TRUE(killed.ok()) << killed.status();
  EXPECT_GE(*killed, 1);

  // Every call after the drop succeeds: reads, writes, and several in a row
  // (each idle connection was dead).
  for (int k = 0; k < 6; ++k) {
    absl::StatusOr<v1::Job> job = store_->GetJob("job-1", false);
    EXPECT_TRUE(job.ok()) << job.status();
  }
  EXPECT_TRUE(store_->SetJobState("job-1", v1::JOB_STATE_DEGRADED).ok());
  EXPECT_EQ(store_->GetJob("job-1", false)->state(), v1::JOB_STATE_DEGRADED);
}

TEST(ServerDownTest, CallsAreUnavailableWhileTheServerIsDownAndRecover) {
  absl::StatusOr<std::unique_ptr<testing::TestPostgres>> pg = testing::TestPostgres::Start();
  ASSERT_TRUE(pg.ok()) << pg.status();
  ASSERT_TRUE(Migrate((*pg)->dsn()).ok());
  PgStoreOptions options;
  options.dsn = (*pg)->dsn();
  options.pool_size = 2;
  absl::StatusOr<std::shared_ptr<PgStore>> store = PgStore::Connect(options);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->CreateJob("job-1", test_support::StoreSmallSpec("llama"), {}).ok());

  ASSERT_TRUE((*pg)->Kill().ok());
  const absl::Status down = (*store)->GetJob("job-1", false).status();
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable) << down;
  EXPECT_EQ((*store)->CreateJob("job-2", test_support::StoreSmallSpec("other"), {}).status().code(),
            absl::StatusCode::kUnavailable);
  PgLeaderLock lock((*pg)->dsn(), 7);
  EXPECT_EQ(lock.TryAcquire().status().code(), absl::StatusCode::kUnavailable);

  ASSERT_TRUE((*pg)->Restart().ok());
  absl::StatusOr<v1::Job> back = (*store)->GetJob("job-1", false);
  EXPECT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE((*store)->CreateJob("job-2", test_support::StoreSmallSpec("other"), {}).ok());
  absl::StatusOr<bool> got = lock.TryAcquire();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got);
}

TEST_F(FaultsTest, ObserverSeesEveryStatementByName) {
  ASSERT_TRUE(store_->CreateJob("job-1", test_support::StoreSmallSpec("llama"), {}).ok());
  ASSERT_TRUE(store_->GetJob("job-1", true).ok());
  const std::vector<std::string> seen = Observed();
  const std::vector<std::string> names = PgStore::StatementNames();
  const std::set<std::string> known(names.begin(), names.end());
  for (const std::string& s : seen) EXPECT_EQ(known.count(s), 1u) << s;
  const std::set<std::string> got(seen.begin(), seen.end());
  for (const char* want : {"insert_job", "insert_ptc_tensors", "insert_generation_ranks",
                           "select_job", "select_ptc_tensors", "commit"}) {
    EXPECT_EQ(got.count(want), 1u) << want;
  }
}

class LeaderLockTest : public PgStoreTest {};

TEST_F(LeaderLockTest, ExactlyOneHolder) {
  PgLeaderLock a(dsn_, 42), b(dsn_, 42), other_key(dsn_, 43);
  ASSERT_TRUE(*a.TryAcquire());
  EXPECT_FALSE(*b.TryAcquire());
  EXPECT_TRUE(*other_key.TryAcquire());
  EXPECT_TRUE(a.StillHeld());
  EXPECT_FALSE(b.StillHeld());
  EXPECT_TRUE(*a.TryAcquire());  // already held: still true

  a.Release();
  a.Release();  // idempotent
  EXPECT_FALSE(a.StillHeld());
  EXPECT_TRUE(*b.TryAcquire());
  EXPECT_FALSE(*a.TryAcquire());
}

TEST_F(LeaderLockTest, TakenOverWhenTheHoldersConnectionDies) {
  std::unique_ptr<LeaderLock> a = MakePgLeaderLock(dsn_, 42);
  std::unique_ptr<LeaderLock> b = MakePgLeaderLock(dsn_, 42);
  ASSERT_TRUE(*a->TryAcquire());
  ASSERT_FALSE(*b->TryAcquire());

  absl::StatusOr<testing::TestPostgres*> pg = testing::SharedTestPostgres();
  ASSERT_TRUE(pg.ok());
  ASSERT_TRUE((*pg)->TerminateConnections(DatabaseOf(dsn_)).ok());

  // The server released the holder's lock with its session; b (whose own
  // connection was terminated too) reconnects and takes it.
  EXPECT_FALSE(a->StillHeld());
  absl::StatusOr<bool> b_got = b->TryAcquire();
  ASSERT_TRUE(b_got.ok()) << b_got.status();
  EXPECT_TRUE(*b_got);
  EXPECT_TRUE(b->StillHeld());
  absl::StatusOr<bool> a_got = a->TryAcquire();
  ASSERT_TRUE(a_got.ok()) << a_got.status();
  EXPECT_FALSE(*a_got);
}

}  // namespace
}  // namespace reshard::coordinator::store_test
