// A pool of libpqxx connections and the one place where libpqxx errors
// become absl::Status. Internal to the store component: nothing outside
// services/coordinator/store includes this header.
//
// Thread contract: PgPool is thread-safe; a PgTx belongs to the thread
// running the transaction body it was passed to.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <pqxx/pqxx>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace reshard::coordinator::pg {

/// A named SQL statement. The name is the prepared statement's name on every
/// connection and the metric label.
struct Statement {
  const char* name;
  const char* sql;
};

/// Called after every statement (and every commit, as "commit") with its
/// wall time.
using StatementObserver = std::function<void(const std::string& statement, double seconds)>;

/// Turns the exception being handled into a status; call only inside a catch
/// block. serialization failure / deadlock -> Aborted; broken connection,
/// connection failures and server shutdown -> Unavailable; unique violation
/// -> AlreadyExists; commit outcome unknown -> Unavailable; anything else ->
/// Internal. The message names `statement`.
absl::Status StatusFromCurrentException(absl::string_view statement);

/// One transaction on a pooled connection (READ COMMITTED; use row locks).
class PgTx {
 public:
  explicit PgTx(const StatementObserver* observer) : observer_(observer) {}
  void set_work(pqxx::work* work) { work_ = work; }
  pqxx::work& work() { return *work_; }

  /// Runs a prepared statement with positional parameters ($1, $2, ...).
  template <typename... Args>
  pqxx::result Exec(const Statement& statement, Args&&... args) {
    current_ = statement.name;
    const auto start = std::chrono::steady_clock::now();
    pqxx::result r = work_->exec_prepared(statement.name, std::forward<Args>(args)...);
    Observe(statement.name, start);
    return r;
  }

  /// The statement running now or last run; names the statement in errors.
  const char* current_statement() const { return current_; }
  void set_current_statement(const char* name) { current_ = name; }
  void Observe(const char* name, std::chrono::steady_clock::time_point start) const;

  /// Runs `done` after this transaction commits (never when it rolls back).
  void OnCommit(std::function<void()> done) { on_commit_.push_back(std::move(done)); }
  /// Called by PgPool after the commit.
  void Committed() {
    for (const auto& done : on_commit_) done();
  }

 private:
  std::vector<std::function<void()>> on_commit_;
  pqxx::work* work_ = nullptr;
  const StatementObserver* observer_;
  const char* current_ = "begin";
};

class PgPool {
 public:
  struct Options {
    std::string dsn;
    int size = 8;
    std::chrono::milliseconds acquire_timeout{10000};
    StatementObserver observer;         // may be empty
    std::vector<Statement> statements;  // prepared on every connection
  };

  /// Opens one connection to check the DSN (Unavailable when it fails) and
  /// prepares every statement on it (Internal, naming the statement, when
  /// one does not fit the schema); the others open on demand and prepare
  /// each statement on first use.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PgPool>> Create(Options options);
  ~PgPool();

  using Body = std::function<absl::Status(PgTx&)>;

  /// Runs `body` in a transaction, committing when it returns OK and rolling
  /// back otherwise. When the connection turns out to be broken before the
  /// commit (the server restarted, the backend was terminated), the
  /// connection is replaced and `body` runs once more on a fresh one, so it
  /// must only touch state it resets. Unavailable when no connection can be
  /// opened or the commit's outcome is unknown.
  [[nodiscard]] absl::Status Transact(absl::string_view what, const Body& body);

  /// Connections open now (idle or leased); for tests.
  int open_connections() const;

 private:
  explicit PgPool(Options options) : options_(std::move(options)) {}

  [[nodiscard]] absl::StatusOr<std::unique_ptr<pqxx::connection>> Acquire();
  void Release(std::unique_ptr<pqxx::connection> conn, bool broken);
  [[nodiscard]] absl::StatusOr<std::unique_ptr<pqxx::connection>> Connect() const;
  // One attempt; sets *broken when the connection failed under it.
  absl::Status RunOnce(absl::string_view what, const Body& body, bool* broken);

  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<pqxx::connection>> idle_;
  int open_ = 0;  // idle + leased + being opened
};

}  // namespace reshard::coordinator::pg
