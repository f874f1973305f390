// A throwaway PostgreSQL server for integration tests: its own data
// directory in a fresh temporary directory, a free loopback port, fsync off
// (commits survive a killed server, not a crashed machine),
// trust authentication. Start() returns when it accepts connections; the
// destructor stops it (immediate shutdown) and removes the directory.
//
// The directory goes under $RESHARD_TEST_PG_DIR, else /dev/shm when it has
// 1 GiB free, else $TMPDIR or /tmp.
//
// Tests create one database each (CreateDatabase: a few milliseconds) on a
// server shared per test binary (SharedTestPostgres), rather than one server
// per test.
//
// Run as root, initdb and postgres (which refuse root) run as the `postgres`
// system user; otherwise as the current user. The server gets SIGKILL when
// the thread that started it exits, so a crashed test leaves no server
// behind: start it from the main thread.
//
// Thread contract: thread-compatible; SharedTestPostgres() is thread-safe.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace reshard::coordinator::testing {

class TestPostgres {
 public:
  struct Options {
    /// Directory of initdb / postgres; empty: $RESHARD_PG_BINDIR, then
    /// `pg_config --bindir`, then /usr/lib/postgresql/*/bin.
    std::string bin_dir;
    /// The database dsn() names, created at start.
    std::string database = "reshard_test";
    /// Copy a data directory initialised once per machine
    /// instead of running initdb each time (~1 s saved per server).
    bool reuse_initdb = true;
    /// Extra `-c name=value` server settings.
    std::vector<std::string> settings;
  };

  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TestPostgres>> Start(Options options);
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TestPostgres>> Start() {
    return Start(Options());
  }
  ~TestPostgres();

  TestPostgres(const TestPostgres&) = delete;
  TestPostgres& operator=(const TestPostgres&) = delete;

  /// Connection string of Options::database.
  const std::string& dsn() const { return dsn_; }
  /// Connection string of another database on this server.
  std::string DsnFor(absl::string_view database) const;
  int port() const { return port_; }
  const std::string& dir() const { return dir_; }

  /// Creates database `name` (optionally as a copy of `template_database`,
  /// which must have no open connections) and returns its dsn.
  [[nodiscard]] absl::StatusOr<std::string> CreateDatabase(
      absl::string_view name, absl::string_view template_database = "");

  /// Terminates every other client connection (of `database` only, when
  /// given) with pg_terminate_backend, waiting until they are gone. Returns
  /// how many were terminated.
  [[nodiscard]] absl::StatusOr<int> TerminateConnections(absl::string_view database = "");

  /// Stops the server the way a crash would (immediate shutdown), keeping
  /// its data. Idempotent.
  [[nodiscard]] absl::Status Kill();
  /// Starts it again after Kill(), on the same port and data.
  [[nodiscard]] absl::Status Restart();
  bool running() const { return pid_ > 0; }

 private:
  explicit TestPostgres(Options options) : options_(std::move(options)) {}

  [[nodiscard]] absl::Status Init();
  // Starts postgres on port_ and waits until it accepts connections.
  [[nodiscard]] absl::Status StartServer();
  [[nodiscard]] absl::Status WaitReady();
  std::string ServerLogTail() const;

  Options options_;
  std::string bin_dir_;
  std::string dir_;       // temporary directory, removed by the destructor
  std::string data_dir_;  // dir_/data
  std::string dsn_;
  int port_ = 0;
  pid_t pid_ = -1;  // postmaster
  bool as_postgres_user_ = false;
  uid_t uid_ = 0;
  gid_t gid_ = 0;
};

/// The server shared by every test of this binary: started on first call,
/// stopped when the process exits. Thread-safe.
[[nodiscard]] absl::StatusOr<TestPostgres*> SharedTestPostgres();

/// A new, empty database on the shared server (unique name starting with
/// `prefix`); returns its dsn.
[[nodiscard]] absl::StatusOr<std::string> CreateFreshDatabase(
    absl::string_view prefix = "t", absl::string_view template_database = "");

}  // namespace reshard::coordinator::testing
