// Issue 19, defects 5 and 6 on the store's side, caused for real:
//  * PostgreSQL backends frozen with SIGSTOP (their kernel still ACKs TCP, so
//    only a client-side deadline ends a call): a call is Unavailable within
//    the statement timeout, the leader lock counts as lost, Health() reports
//    the silence and, once the server answers again, one outage; the store
//    works again.
//  * Client calls that hold every connection of their share (blocked on a
//    row lock) cannot make an agent-class call wait: the pool keeps
//    PgStoreOptions::agent_reserve connections for agents.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <future>
#include <pqxx/pqxx>
#include <thread>
#include <vector>

#include "services/coordinator/store/call_class.h"
#include "tests/coordinator/store/store_fixture.h"
#include "tests/support/wait.h"

namespace reshard::coordinator::store_test {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

int64_t MsSince(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
}

// Freezes the backends serving `database` (all but the admin's own) with
// SIGSTOP, as a stopped or frozen server would; SIGCONT when destroyed.
class FrozenBackends {
 public:
  FrozenBackends(pqxx::connection& admin, const std::string& database) {
    pqxx::nontransaction n(admin);
    for (const pqxx::row& row :
         n.exec_params("SELECT pid FROM pg_stat_activity WHERE datname = $1 AND "
                       "pid <> pg_backend_pid() AND backend_type = 'client backend'",
                       database)) {
      const pid_t pid = row[0].as<int>();
      if (kill(pid, SIGSTOP) == 0) pids_.push_back(pid);
    }
  }
  ~FrozenBackends() { Thaw(); }
  void Thaw() {
    for (pid_t pid : pids_) kill(pid, SIGCONT);
    pids_.clear();
  }
  size_t size() const { return pids_.size(); }

 private:
  std::vector<pid_t> pids_;
};

class DeadlinesTest : public PgStoreTest {
 protected:
  std::shared_ptr<PgStore> ConnectWith(const PgStoreOptions& base) {
    PgStoreOptions options = base;
    options.dsn = dsn_;
    absl::StatusOr<std::shared_ptr<PgStore>> store = PgStore::Connect(options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *store : nullptr;
  }
};

TEST_F(DeadlinesTest, FrozenServerMakesCallsUnavailableWithinTheStatementTimeout) {
  constexpr int kStatementTimeoutMs = 1000;
  PgStoreOptions options;
  options.pool_size = 2;
  options.statement_timeout_ms = kStatementTimeoutMs;
  options.outage_after_ms = 300;
  std::shared_ptr<PgStore> store = ConnectWith(options);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateJob("job-1", test_support::StoreSmallSpec("llama"), {}).ok());
  PgLeaderLock lock(
      dsn_, 11,
      PgLeaderLockOptions{.statement_timeout_ms = kStatementTimeoutMs, .connect_timeout_s = 2});
  absl::StatusOr<bool> took = lock.TryAcquire();
  ASSERT_TRUE(took.ok()) << took.status();
  ASSERT_TRUE(*took);
  EXPECT_TRUE(store->Health().answering);
  const uint64_t outages_before = store->Health().outages;

  pqxx::connection admin(dsn_);
  FrozenBackends frozen(admin, DatabaseOf(dsn_));
  // The store's pooled connection and the lock's.
  ASSERT_GE(frozen.size(), 2u);

  // Run in threads: before the deadlines existed these blocked until SIGCONT.
  const Clock::time_point start = Clock::now();
  std::future<absl::Status> get =
      std::async(std::launch::async, [&] { return store->GetJob("job-1", false).status(); });
  std::future<bool> held = std::async(std::launch::async, [&] { return lock.StillHeld(); });
  const bool get_returned =
      get.wait_for(milliseconds(kStatementTimeoutMs + 4000)) == std::future_status::ready;
  const int64_t get_ms = MsSince(start);
  const bool held_returned =
      held.wait_for(milliseconds(kStatementTimeoutMs + 4000)) == std::future_status::ready;
  const StoreHealth during = store->Health();
  if (!get_returned || !held_returned) frozen.Thaw();  // let the blocked calls end
  ASSERT_TRUE(get_returned) << "GetJob still waiting " << get_ms << " ms into the freeze";
  ASSERT_TRUE(held_returned) << "StillHeld still waiting into the freeze";
  const absl::Status status = get.get();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_LT(get_ms, kStatementTimeoutMs + 2000);
  EXPECT_FALSE(held.get()) << "a lock whose connection does not answer must count as lost";
  EXPECT_FALSE(during.answering);
  EXPECT_GE(during.silent_ms, kStatementTimeoutMs);

  frozen.Thaw();
  absl::StatusOr<v1::Job> back = store->GetJob("job-1", false);
  EXPECT_TRUE(back.ok()) << back.status();
  const StoreHealth after = store->Health();
  EXPECT_TRUE(after.answering);
  EXPECT_EQ(after.outages, outages_before + 1);
  EXPECT_GE(after.last_outage_ms, kStatementTimeoutMs);
  // The lock is taken again once the old session has gone.
  EXPECT_TRUE(test_support::Eventually(
      [&] {
        absl::StatusOr<bool> again = lock.TryAcquire();
        return again.ok() && *again;
      },
      absl::Seconds(10), absl::Milliseconds(10)));
}

TEST_F(DeadlinesTest, ClientCallsCannotTakeTheConnectionsKeptForAgents) {
  PgStoreOptions options;
  options.pool_size = 4;
  options.agent_reserve = 1;
  options.acquire_timeout_ms = 5000;
  options.statement_timeout_ms = 30000;  // the blocked clients wait on a lock, not a silence
  std::shared_ptr<PgStore> store = ConnectWith(options);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->CreateJob("job-1", test_support::StoreSmallSpec("llama"), {}).ok());

  // Another session holds the job's row lock: every client SetJobState waits
  // for it holding its connection.
  pqxx::connection holder(dsn_);
  auto lock_tx = std::make_unique<pqxx::work>(holder);
  lock_tx->exec_params("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", "job-1");

  constexpr int kClients = 5;  // more than the pool's 4 connections
  std::vector<std::future<absl::Status>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::async(
        std::launch::async, [&] { return store->SetJobState("job-1", v1::JOB_STATE_DEGRADED); }));
  }
  pqxx::connection admin(dsn_);
  auto waiting_on_lock = [&] {
    pqxx::nontransaction n(admin);
    return n
        .exec_params1(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = "
            "'Lock'",
            DatabaseOf(dsn_))[0]
        .as<int>();
  };
  // Clients fill their share (pool 4 less 1 kept for agents); the others
  // wait for a connection. Without the reserve all 4 would be blocked.
  ASSERT_TRUE(test_support::Eventually([&] { return waiting_on_lock() >= 3; }, absl::Seconds(10),
                                       absl::Milliseconds(10)));

  const Clock::time_point start = Clock::now();
  absl::Status agent_call;
  {
    CallClassScope agent(CallClass::kAgent);
    agent_call = store->RegisterHost(test_support::MakeHost("h0"), 1000, 5000).status();
  }
  const int64_t agent_ms = MsSince(start);
  EXPECT_TRUE(agent_call.ok()) << agent_call << " after " << agent_ms << " ms";
  EXPECT_LT(agent_ms, 2000) << "the agent-class call waited behind client calls";
  EXPECT_EQ(waiting_on_lock(), 3) << "client calls took more than their share of connections";

  lock_tx->commit();
  lock_tx.reset();
  for (auto& c : clients) {
    const absl::Status s = c.get();
    EXPECT_TRUE(s.ok()) << s;
  }
}

}  // namespace
}  // namespace reshard::coordinator::store_test
