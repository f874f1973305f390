// A pool of libpqxx connections and the one place where libpqxx errors
// become absl::Status. Internal to the store component: nothing outside
// services/coordinator/store includes this header.
//
// Deadlines (docs/coordinator.md, "When PostgreSQL does not answer"): a call
// waits at most `acquire_timeout` for a connection, a new connection at most
// `connect_timeout_s` (libpq), and each statement (BEGIN and COMMIT
// included) at most `statement_timeout` for the server's answer; then the
// connection's socket is shut down (pg_watchdog.h), the connection dropped
// and the call is Unavailable. The server enforces the same statement_timeout
// and twice it as idle_in_transaction_session_timeout, as a second line.
//
// Call classes (call_class.h): `agent_reserve` connections are kept for
// agent-class calls; client calls share the rest.
//
// Thread contract: PgPool is thread-safe; a PgTx belongs to the thread
// running the transaction body it was passed to.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <pqxx/pqxx>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "services/coordinator/store/call_class.h"
#include "services/coordinator/store/pg_watchdog.h"
#include "services/coordinator/store/store_health.h"

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
/// connection failures, server shutdown and a statement the server
/// cancelled (statement_timeout) -> Unavailable; unique violation ->
/// AlreadyExists; commit outcome unknown -> Unavailable; anything else ->
/// Internal. The message names `statement`.
absl::Status StatusFromCurrentException(absl::string_view statement);

class PgPool;
/// What a call in flight is waiting for (PgPool's health bookkeeping).
struct InFlight {
  std::optional<std::chrono::steady_clock::time_point> waiting_since;
};

/// One transaction on a pooled connection (READ COMMITTED; use row locks).
class PgTx {
 public:
  PgTx(const StatementObserver* observer, PgPool* pool, InFlight* in_flight, uint64_t watch)
      : observer_(observer), pool_(pool), in_flight_(in_flight), watch_(watch) {}
  void set_work(pqxx::work* work) { work_ = work; }
  pqxx::work& work() { return *work_; }

  /// Runs a prepared statement with positional parameters ($1, $2, ...).
  template <typename... Args>
  pqxx::result Exec(const Statement& statement, Args&&... args) {
    current_ = statement.name;
    const auto start = std::chrono::steady_clock::now();
    Sending(start);
    pqxx::result r = work_->exec_prepared(statement.name, std::forward<Args>(args)...);
    Observe(statement.name, start);
    return r;
  }

  /// Runs `sql` unprepared (not observed: no metric label); `name` names it
  /// in errors.
  pqxx::result ExecSql(const char* name, const std::string& sql);

  /// Before a statement is sent: its deadline starts (statement_timeout).
  void Sending(std::chrono::steady_clock::time_point start);

  /// The statement running now or last run; names the statement in errors.
  const char* current_statement() const { return current_; }
  void set_current_statement(const char* name) { current_ = name; }
  /// After the server answered (Observe calls it): records the answer.
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
  PgPool* pool_;
  InFlight* in_flight_;
  uint64_t watch_;  // SocketWatchdog id; 0: no deadline
  const char* current_ = "begin";
};

class PgPool {
 public:
  struct Options {
    std::string dsn;
    int size = 8;
    /// Connections only agent-class calls may take; less than `size`.
    int agent_reserve = 0;
    std::chrono::milliseconds acquire_timeout{5000};
    /// Longest wait for the answer to one statement (and for a new
    /// connection's set-up); also the server's statement_timeout. 0: none.
    std::chrono::milliseconds statement_timeout{5000};
    /// libpq connect_timeout (seconds; libpq treats 1 as 2); 0: libpq's
    /// default (none). A connect_timeout in `dsn` wins.
    int connect_timeout_s = 5;
    /// The server silent this long is an outage (Health()).
    std::chrono::milliseconds outage_after{1000};
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
  /// must only touch state it resets. A transaction the server rolled back
  /// to break a deadlock or a serialization conflict (SQLSTATE 40P01, 40001)
  /// runs again the same way, up to kRollbackRetries times; after that it is
  /// Aborted. Unavailable when no connection can be opened or the commit's
  /// outcome is unknown.
  [[nodiscard]] absl::Status Transact(absl::string_view what, const Body& body);
  static constexpr int kRollbackRetries = 3;

  /// Transactions run again after the server rolled them back (deadlock,
  /// serialization conflict); for tests and logs.
  int64_t rollbacks_retried() const { return rollbacks_retried_.load(); }

  /// Connections open now (idle or leased); for tests.
  int open_connections() const;

  /// How the server has been answering (store_health.h).
  StoreHealth Health() const;
  /// A trivial query through the pool (its deadlines, its health
  /// bookkeeping): OK once the server answers.
  [[nodiscard]] absl::Status Probe();

  // Health bookkeeping, called by PgTx and the pool itself.
  void Waiting(InFlight* in_flight, std::chrono::steady_clock::time_point since);
  void Answered(InFlight* in_flight);
  void GaveUp(InFlight* in_flight);
  void ExtendWatch(uint64_t watch, std::chrono::steady_clock::time_point start);

 private:
  explicit PgPool(Options options);

  // A connection for a call of class `call_class`, waiting at most
  // acquire_timeout. Increments leased_by_clients_ for a client call.
  [[nodiscard]] absl::StatusOr<std::unique_ptr<pqxx::connection>> Acquire(CallClass call_class);
  void Release(std::unique_ptr<pqxx::connection> conn, bool broken, CallClass call_class);
  [[nodiscard]] absl::StatusOr<std::unique_ptr<pqxx::connection>> Connect();
  // One attempt; sets *broken when the connection failed under it (and
  // may be retried: not when its deadline ended it).
  absl::Status RunOnce(absl::string_view what, const Body& body, bool* broken,
                       bool* rolled_back);
  std::atomic<int64_t> rollbacks_retried_{0};
  std::optional<std::chrono::steady_clock::time_point> SilentSinceLocked() const;

  const Options options_;
  std::string dsn_;  // options_.dsn with connect_timeout
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<pqxx::connection>> idle_;
  int open_ = 0;                // idle + leased + being opened
  int leased_by_clients_ = 0;   // at most size - agent_reserve

  // Health (guarded by health_mu_).
  mutable std::mutex health_mu_;
  std::set<InFlight*> in_flight_;
  std::chrono::steady_clock::time_point last_answer_;
  std::optional<std::chrono::steady_clock::time_point> unanswered_since_;
  uint64_t outages_ = 0;
  std::chrono::milliseconds last_outage_{0};

  SocketWatchdog watchdog_;  // last: its thread stops first
};

/// `dsn` with libpq's connect_timeout set to `seconds`, unless it names one
/// already (key=value strings and postgresql:// URIs). `seconds` <= 0: `dsn`.
std::string WithConnectTimeout(const std::string& dsn, int seconds);

}  // namespace reshard::coordinator::pg
