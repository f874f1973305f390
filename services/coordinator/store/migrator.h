// The schema migrator: applies migrations/NNNN_name.sql (embedded into the
// binary at build time) in version order, each in its own transaction, and
// records them in `schema_migrations`. Safe to run from several replicas at
// once: every step holds a transaction-level advisory lock.
//
// A database whose newest recorded migration is newer than this binary knows
// is refused (FailedPrecondition), never touched.
//
// Thread contract: free functions, each opening its own connection;
// thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace reshard::coordinator {

/// One migration file: migrations/0001_init.sql is {1, "init", <contents>}.
struct Migration {
  int version;
  const char* name;
  const char* sql;
};

/// The migrations compiled into this binary, ascending by version.
absl::Span<const Migration> EmbeddedMigrations();

/// The highest version in EmbeddedMigrations().
int LatestKnownSchemaVersion();

/// The advisory lock key the migrator holds while it works.
inline constexpr int64_t kMigrationLockKey = 0x7265736861726401;  // "reshard\x01"

/// Applies every embedded migration the database lacks. OK when there was
/// nothing to do. FailedPrecondition when the database is newer than this
/// binary; Unavailable when it cannot be reached; Internal (naming the
/// migration) when one fails, in which case that migration left nothing
/// behind and the earlier ones stay applied.
[[nodiscard]] absl::Status Migrate(const std::string& dsn);

/// Migrate() with an explicit list (ascending versions); for tests.
[[nodiscard]] absl::Status MigrateWith(const std::string& dsn,
                                       absl::Span<const Migration> migrations);

/// The newest recorded version; 0 for a database never migrated.
/// Unavailable when the database cannot be reached.
[[nodiscard]] absl::StatusOr<int> CurrentSchemaVersion(const std::string& dsn);

/// OK when the database is exactly at LatestKnownSchemaVersion().
/// FailedPrecondition when it is newer ("upgrade the binary") or older
/// ("run `reshard-coordinator migrate`").
[[nodiscard]] absl::Status CheckSchema(const std::string& dsn);

}  // namespace reshard::coordinator
