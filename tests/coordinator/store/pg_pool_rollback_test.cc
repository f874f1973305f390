// PgPool::Transact runs again a transaction the server rolled back to break
// a deadlock (ClientTest.StopFreeResizePreparesThenCutsOverAtACheckpoint
// failed 1 run in 5 with "PostgreSQL statement lock_stop_free_operation:
// ERROR: deadlock detected": a cut-over locks job then operation, an agent's
// report operation then job through migration 0016's triggers). The
// deadlock is caused for real: two transactions lock two rows in opposite
// orders, each waiting (on a condition) until the other holds its first row.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <pqxx/pqxx>

#include "services/coordinator/store/pg_pool.h"
#include "tests/coordinator/store/store_fixture.h"

namespace reshard::coordinator::store_test {
namespace {

constexpr pg::Statement kLockRow{"test_lock_row",
                                 "UPDATE rollback_test SET v = v + 1 WHERE id = $1"};

class RollbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dsn_ = FreshMigratedDatabase();
    pqxx::connection c(dsn_);
    pqxx::work w(c);
    w.exec("CREATE TABLE rollback_test (id int PRIMARY KEY, v int NOT NULL)");
    w.exec("INSERT INTO rollback_test VALUES (1, 0), (2, 0)");
    w.commit();
    pg::PgPool::Options o;
    o.dsn = dsn_;
    o.size = 4;
    o.statements = {kLockRow};
    auto pool = pg::PgPool::Create(o);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
  }

  int Value(int id) {
    pqxx::connection c(dsn_);
    pqxx::nontransaction n(c);
    return n.exec_params1("SELECT v FROM rollback_test WHERE id = $1", id)[0].as<int>();
  }

  std::string dsn_;
  std::unique_ptr<pg::PgPool> pool_;
};

TEST_F(RollbackTest, ADeadlockVictimRunsAgainAndBothTransactionsCommit) {
  std::mutex mu;
  std::condition_variable cv;
  int holding_first = 0;  // transactions that hold their first row (first attempts only)
  int attempts[2] = {0, 0};
  bool locked_both[2] = {false, false};
  // Transaction k locks row `first`, waits until the other holds its own
  // first row, then locks `second`: one of them is the deadlock's victim.
  // The victim's retry waits until the survivor holds both rows, so that it
  // queues behind the survivor's commit: were it to take `first` back while
  // the survivor still waits for it, they would deadlock again.
  auto run = [&](int k, int first, int second) {
    return pool_->Transact("rollback test", [&, k, first, second](pg::PgTx& tx) {
      bool first_attempt = false;
      {
        std::unique_lock<std::mutex> l(mu);
        first_attempt = attempts[k]++ == 0;
        if (!first_attempt) {
          EXPECT_TRUE(cv.wait_for(l, std::chrono::seconds(30), [&] { return locked_both[1 - k]; }));
        }
      }
      tx.Exec(kLockRow, first);
      if (first_attempt) {
        std::unique_lock<std::mutex> l(mu);
        ++holding_first;
        cv.notify_all();
        EXPECT_TRUE(cv.wait_for(l, std::chrono::seconds(30), [&] { return holding_first == 2; }));
      }
      tx.Exec(kLockRow, second);
      {
        std::lock_guard<std::mutex> l(mu);
        locked_both[k] = true;
      }
      cv.notify_all();
      return absl::OkStatus();
    });
  };
  auto a = std::async(std::launch::async, run, 0, 1, 2);
  auto b = std::async(std::launch::async, run, 1, 2, 1);
  const absl::Status sa = a.get(), sb = b.get();
  EXPECT_TRUE(sa.ok()) << sa;
  EXPECT_TRUE(sb.ok()) << sb;
  // Exactly one was rolled back and ran again; each committed once.
  EXPECT_EQ(pool_->rollbacks_retried(), 1);
  EXPECT_EQ(attempts[0] + attempts[1], 3);
  EXPECT_EQ(Value(1), 2);
  EXPECT_EQ(Value(2), 2);
}

TEST_F(RollbackTest, ABodyThatReturnsAbortedIsNotRunAgain) {
  int attempts = 0;
  const absl::Status s = pool_->Transact("rollback test", [&](pg::PgTx& tx) {
    ++attempts;
    tx.Exec(kLockRow, 1);
    return absl::AbortedError("the caller's own abort");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(attempts, 1);
  EXPECT_EQ(pool_->rollbacks_retried(), 0);
  EXPECT_EQ(Value(1), 0);  // rolled back
}

}  // namespace
}  // namespace reshard::coordinator::store_test
