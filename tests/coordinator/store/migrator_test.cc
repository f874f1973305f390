// The schema migrator against a real PostgreSQL.
#include "services/coordinator/store/migrator.h"

#include <gtest/gtest.h>

#include <pqxx/pqxx>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/coordinator/store/pg_store.h"
#include "tests/coordinator/harness/test_postgres.h"

namespace reshard::coordinator {
namespace {

std::string FreshDatabase() {
  absl::StatusOr<std::string> dsn =
      testing::CreateFreshDatabase(::testing::UnitTest::GetInstance()->current_test_info()->name());
  EXPECT_TRUE(dsn.ok()) << dsn.status();
  return dsn.ok() ? *dsn : "";
}

int64_t QueryInt(const std::string& dsn, const std::string& sql) {
  pqxx::connection conn(dsn);
  pqxx::nontransaction n(conn);
  return n.exec1(sql)[0].as<int64_t>();
}

TEST(MigratorTest, EmbeddedMigrationsAreAscendingAndStartWithInit) {
  absl::Span<const Migration> all = EmbeddedMigrations();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all[0].version, 1);
  EXPECT_STREQ(all[0].name, "init");
  EXPECT_NE(std::string(all[0].sql).find("CREATE TABLE jobs"), std::string::npos);
  for (size_t i = 1; i < all.size(); ++i) EXPECT_LT(all[i - 1].version, all[i].version);
  EXPECT_EQ(LatestKnownSchemaVersion(), all.back().version);
}

TEST(MigratorTest, FreshDatabaseIsMigratedAndRecorded) {
  const std::string dsn = FreshDatabase();
  absl::StatusOr<int> before = CurrentSchemaVersion(dsn);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(*before, 0);

  ASSERT_TRUE(Migrate(dsn).ok());

  absl::StatusOr<int> after = CurrentSchemaVersion(dsn);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, LatestKnownSchemaVersion());
  EXPECT_EQ(QueryInt(dsn, "SELECT count(*) FROM schema_migrations"),
            static_cast<int64_t>(EmbeddedMigrations().size()));
  pqxx::connection conn(dsn);
  pqxx::nontransaction n(conn);
  const pqxx::row first = n.exec1(
      "SELECT name, applied_at IS NOT NULL FROM schema_migrations "
      "WHERE version = 1");
  EXPECT_EQ(first[0].as<std::string>(), "init");
  EXPECT_TRUE(first[1].as<bool>());
  EXPECT_TRUE(CheckSchema(dsn).ok());
}

TEST(MigratorTest, SecondRunIsANoOp) {
  const std::string dsn = FreshDatabase();
  ASSERT_TRUE(Migrate(dsn).ok());
  const int64_t applied_at =
      QueryInt(dsn, "SELECT reshard_unix_ms(max(applied_at)) FROM schema_migrations");
  ASSERT_TRUE(Migrate(dsn).ok());
  EXPECT_EQ(QueryInt(dsn, "SELECT count(*) FROM schema_migrations"),
            static_cast<int64_t>(EmbeddedMigrations().size()));
  EXPECT_EQ(QueryInt(dsn, "SELECT reshard_unix_ms(max(applied_at)) FROM schema_migrations"),
            applied_at);
}

TEST(MigratorTest, NewerDatabaseIsRefusedUntouched) {
  const std::string dsn = FreshDatabase();
  ASSERT_TRUE(Migrate(dsn).ok());
  const int newer = LatestKnownSchemaVersion() + 2;
  {
    pqxx::connection conn(dsn);
    pqxx::work w(conn);
    w.exec_params("INSERT INTO schema_migrations (version, name) VALUES ($1, 'from_the_future')",
                  newer);
    w.commit();
  }
  const std::string expected = absl::StrCat("database schema is at version ", newer,
                                            " but this reshard-coordinator knows only up to ",
                                            LatestKnownSchemaVersion(), "; upgrade the binary");

  const absl::Status migrate = Migrate(dsn);
  EXPECT_EQ(migrate.code(), absl::StatusCode::kFailedPrecondition) << migrate;
  EXPECT_EQ(migrate.message(), expected);
  const absl::Status check = CheckSchema(dsn);
  EXPECT_EQ(check.code(), absl::StatusCode::kFailedPrecondition) << check;
  EXPECT_EQ(check.message(), expected);
  PgStoreOptions options;
  options.dsn = dsn;
  EXPECT_EQ(PgStore::Connect(options).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(QueryInt(dsn, "SELECT count(*) FROM schema_migrations"),
            static_cast<int64_t>(EmbeddedMigrations().size()) + 1);
}

TEST(MigratorTest, OlderDatabaseFailsTheSchemaCheck) {
  const std::string dsn = FreshDatabase();
  const absl::Status check = CheckSchema(dsn);
  EXPECT_EQ(check.code(), absl::StatusCode::kFailedPrecondition) << check;
  EXPECT_NE(check.message().find("run `reshard-coordinator migrate`"), absl::string_view::npos)
      << check;
  PgStoreOptions options;
  options.dsn = dsn;
  EXPECT_EQ(PgStore::Connect(options).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(MigratorTest, FailedMigrationLeavesNothingBehind) {
  const std::string dsn = FreshDatabase();
  std::vector<Migration> migrations(EmbeddedMigrations().begin(), EmbeddedMigrations().end());
  const int broken_version = migrations.back().version + 1;
  migrations.push_back(
      {broken_version, "broken", "CREATE TABLE half_done (a INTEGER); SELECT no_such_function();"});

  const absl::Status s = MigrateWith(dsn, migrations);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find(absl::StrCat("migration ", broken_version, " (broken)")),
            absl::string_view::npos)
      << s;
  absl::StatusOr<int> version = CurrentSchemaVersion(dsn);
  ASSERT_TRUE(version.ok());
  EXPECT_EQ(*version, LatestKnownSchemaVersion());
  EXPECT_EQ(QueryInt(dsn, "SELECT count(*) FROM pg_tables WHERE tablename = 'half_done'"), 0);
}

TEST(MigratorTest, ConcurrentMigratorsApplyEachMigrationOnce) {
  const std::string dsn = FreshDatabase();
  std::vector<absl::Status> results(4);
  std::vector<std::thread> threads;
  for (absl::Status& result : results) {
    threads.emplace_back([&dsn, &result] { result = Migrate(dsn); });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(QueryInt(dsn, "SELECT count(*) FROM schema_migrations"),
            static_cast<int64_t>(EmbeddedMigrations().size()));
}

TEST(MigratorTest, UnreachableDatabaseIsUnavailable) {
  // Port 1 on loopback: nothing listens there.
  const std::string dsn = "host=127.0.0.1 port=1 dbname=x user=x connect_timeout=2";
  EXPECT_EQ(Migrate(dsn).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CheckSchema(dsn).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace reshard::coordinator
