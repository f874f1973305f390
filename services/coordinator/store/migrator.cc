#include "services/coordinator/store/migrator.h"

#include <memory>
#include <pqxx/pqxx>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "services/coordinator/store/pg_pool.h"

namespace reshard::coordinator {
namespace {

// The migrator's own statements (run on its own connection, not prepared).
constexpr char kSuppressNotices[] = "SET client_min_messages = warning";
constexpr char kTakeMigrationLock[] = "SELECT pg_advisory_xact_lock($1)";
constexpr char kMigrationsTableExists[] = "SELECT to_regclass('schema_migrations') IS NOT NULL";
constexpr char kAppliedVersions[] = "SELECT version FROM schema_migrations ORDER BY version";
constexpr char kRecordMigration[] = "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)";

absl::StatusOr<std::unique_ptr<pqxx::connection>> Open(const std::string& dsn) {
  try {
    auto conn = std::make_unique<pqxx::connection>(dsn);
    pqxx::nontransaction n(*conn);
    n.exec(kSuppressNotices);
    return conn;
  } catch (...) {
    absl::Status s = pg::StatusFromCurrentException("connect");
    return absl::UnavailableError(s.message());
  }
}

// Versions recorded in the database, ascending; empty when it was never
// migrated.
std::vector<int> AppliedVersions(pqxx::transaction_base& tx) {
  std::vector<int> versions;
  if (!tx.exec1(kMigrationsTableExists)[0].as<bool>()) return versions;
  for (const pqxx::row& row : tx.exec(kAppliedVersions)) versions.push_back(row[0].as<int>());
  return versions;
}

absl::Status NewerThanBinary(int database_version, int known) {
  return absl::FailedPreconditionError(absl::StrCat(
      "database schema is at version ", database_version,
      " but this reshard-coordinator knows only up to ", known, "; upgrade the binary"));
}

absl::Status CheckOrder(absl::Span<const Migration> migrations) {
  if (migrations.empty()) return absl::InvalidArgumentError("no migrations to apply");
  int previous = 0;
  for (const Migration& m : migrations) {
    if (m.version <= previous) {
      return absl::InvalidArgumentError(
          absl::StrCat("migration ", m.version, " (", m.name, ") is not after version ", previous));
    }
    previous = m.version;
  }
  return absl::OkStatus();
}

std::string Describe(const Migration& m) {
  return absl::StrCat("migration ", m.version, " (", m.name, ")");
}

}  // namespace

int LatestKnownSchemaVersion() {
  absl::Span<const Migration> all = EmbeddedMigrations();
  return all.empty() ? 0 : all.back().version;
}

absl::Status Migrate(const std::string& dsn) { return MigrateWith(dsn, EmbeddedMigrations()); }

absl::Status MigrateWith(const std::string& dsn, absl::Span<const Migration> migrations) {
  if (absl::Status s = CheckOrder(migrations); !s.ok()) return s;
  const int known = migrations.back().version;
  absl::StatusOr<std::unique_ptr<pqxx::connection>> conn = Open(dsn);
  if (!conn.ok()) return conn.status();

  // One migration per transaction, each under the advisory lock, re-reading
  // what is applied every time: a replica that waited for the lock sees the
  // other's work and skips it.
  for (;;) {
    const Migration* next = nullptr;
    std::string step = "lock";
    try {
      pqxx::work tx(**conn);
      tx.exec_params(kTakeMigrationLock, kMigrationLockKey);
      step = "read versions";
      const std::vector<int> applied = AppliedVersions(tx);
      if (!applied.empty() && applied.back() > known) {
        return NewerThanBinary(applied.back(), known);
      }
      const std::set<int> done(applied.begin(), applied.end());
      for (const Migration& m : migrations) {
        if (done.count(m.version) == 0) {
          next = &m;
          break;
        }
      }
      if (next == nullptr) return absl::OkStatus();
      step = Describe(*next);
      tx.exec(next->sql);
      tx.exec_params(kRecordMigration, next->version, std::string(next->name));
      tx.commit();
    } catch (...) {
      absl::Status s = pg::StatusFromCurrentException(step);
      if (absl::IsUnavailable(s)) return s;
      if (next == nullptr) return absl::InternalError(s.message());
      return absl::InternalError(absl::StrCat(Describe(*next), " failed: ", s.message()));
    }
    RESHARD_LOG(INFO) << "applied schema " << Describe(*next);
  }
}

absl::StatusOr<int> CurrentSchemaVersion(const std::string& dsn) {
  absl::StatusOr<std::unique_ptr<pqxx::connection>> conn = Open(dsn);
  if (!conn.ok()) return conn.status();
  try {
    pqxx::read_transaction tx(**conn);
    const std::vector<int> applied = AppliedVersions(tx);
    return applied.empty() ? 0 : applied.back();
  } catch (...) {
    return pg::StatusFromCurrentException("read schema version");
  }
}

absl::Status CheckSchema(const std::string& dsn) {
  absl::StatusOr<int> version = CurrentSchemaVersion(dsn);
  if (!version.ok()) return version.status();
  const int known = LatestKnownSchemaVersion();
  if (*version > known) return NewerThanBinary(*version, known);
  if (*version < known) {
    return absl::FailedPreconditionError(absl::StrCat(
        "database schema is at version ", *version, " but this reshard-coordinator needs version ",
        known, "; run `reshard-coordinator migrate`"));
  }
  return absl::OkStatus();
}

}  // namespace reshard::coordinator
