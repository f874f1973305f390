// Shared pieces of the PgStore integration tests: a fixture giving each test
// a fresh, migrated database on the binary's shared PostgreSQL server, and
// small job specs, layouts and operations.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "reshard/v1/agent.pb.h"
#include "reshard/v1/coordinator.pb.h"
#include "reshard/v1/ptc.pb.h"
#include "services/coordinator/store/memory_store.h"
#include "services/coordinator/store/pg_store.h"
#include "tests/coordinator/harness/test_postgres.h"
#include "tests/support/job_builders.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::store_test {

/// A database with every embedded migration applied, on the shared server,
/// created once per test binary; tests copy it (CREATE DATABASE ... TEMPLATE).
const std::string& MigratedTemplate();

/// A fresh migrated database; its dsn.
std::string FreshMigratedDatabase();

/// The dbname of a TestPostgres dsn.
std::string DatabaseOf(const std::string& dsn);

class PgStoreTest : public ::testing::Test {
 protected:
  void SetUp() override;

  /// Connects another PgStore to this test's database.
  std::shared_ptr<PgStore> Connect(int pool_size = 4);
  /// Rows of `table` whose job_id (or, for operation_hosts, operation's
  /// job) is `job_id`; read directly with SQL.
  int64_t CountRows(const std::string& sql_with_job_param, const std::string& job_id);

  /// Statement names the store's observer saw, in order.
  std::vector<std::string> Observed();

  std::string dsn_;
  std::shared_ptr<PgStore> store_;

 private:
  std::mutex observed_mu_;
  std::vector<std::string> observed_;
};

/// A PgStore on `dsn` (crashes the test binary when it cannot connect).
std::shared_ptr<PgStore> ConnectPgStore(const std::string& dsn, int pool_size = 4);

/// `sql_with_job_param` (one parameter, $1 = `job_id`) run on `dsn`; the
/// count it selects.
int64_t CountRowsIn(const std::string& dsn, const std::string& sql_with_job_param,
                    const std::string& job_id);

// ---- The contract suite (docs/coordinator.md, "The in-memory store and the
// contract suite") ---------------------------------------------------------------
// A test of Store SEMANTICS is a TEST_P of a StoreContractTest suite and runs
// against both stores: RESHARD_STORE_CONTRACT(Suite) instantiates it as
// Store/Suite.Test/Postgres and Store/Suite.Test/Memory. What only PostgreSQL
// has (rows read with SQL) is checked under IsPostgres().

inline constexpr char kPostgresStore[] = "Postgres";
inline constexpr char kMemoryStore[] = "Memory";

class StoreContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override;

  bool IsPostgres() const { return GetParam() == kPostgresStore; }
  /// Another client of this test's store (what a second replica sees): a new
  /// PgStore on the test's database, or the same MemoryStore.
  StorePtr Connect(int pool_size = 4);
  /// The in-memory store's clock (the system's plus an offset) moves `ms` on.
  void AdvanceMemoryClock(int64_t ms) { memory_clock_offset_ms_ += ms; }
  /// As PgStoreTest::CountRows; PostgreSQL only.
  int64_t CountRows(const std::string& sql_with_job_param, const std::string& job_id);

  std::string dsn_;  // PostgreSQL only
  StorePtr store_;

 private:
  std::atomic<int64_t> memory_clock_offset_ms_{0};
};

std::string StoreParamName(const ::testing::TestParamInfo<std::string>& info);

#define RESHARD_STORE_CONTRACT(suite)                                                    \
  INSTANTIATE_TEST_SUITE_P(                                                              \
      Store, suite,                                                                      \
      ::testing::Values(std::string(::reshard::coordinator::store_test::kPostgresStore), \
                        std::string(::reshard::coordinator::store_test::kMemoryStore)),  \
      ::reshard::coordinator::store_test::StoreParamName)

// ---- Builders ----------------------------------------------------------------

// The job, layout and host builders are tests/support's (job_builders.h:
// MakeLayout, MakeHost; jobs.h: StoreSmallSpec).

Idempotency Key(const std::string& key, const std::string& method, const std::string& hash);

/// A Resize of `job_id` from generation `expected` to `target`.
NewOperation Resize(const std::string& op_id, const std::string& job_id, int64_t expected,
                    const v1::Layout& target, const Idempotency& idem = {});

/// The planner's plan for `spec` from its layout to `target`.
v1::TransferPlan PlanFor(const v1::JobSpec& spec, const v1::Layout& target);

HostProgress Progress(const std::string& host, v1::HostTaskState state, int64_t done = 0,
                      int64_t total = 0);

}  // namespace reshard::coordinator::store_test
