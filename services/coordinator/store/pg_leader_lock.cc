// PgLeaderLock: a session-level advisory lock on a dedicated connection.
// Every query on it has a client-side deadline (pg_watchdog.h): a server
// that stops answering makes the lock count as lost, as a dropped connection
// does, instead of blocking the leader's thread until it answers again.
#include <chrono>
#include <memory>
#include <pqxx/pqxx>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "services/coordinator/store/pg_pool.h"
#include "services/coordinator/store/pg_store.h"
#include "services/coordinator/store/pg_watchdog.h"

namespace reshard::coordinator {
namespace {

constexpr char kTryLock[] = "SELECT pg_try_advisory_lock($1::bigint)";
constexpr char kUnlock[] = "SELECT pg_advisory_unlock($1::bigint)";
// Whether this session holds the lock. Asking pg_locks, rather than only
// checking that the connection answers, stays right even if libpqxx
// silently reconnected (a new session holds nothing).
constexpr char kHoldsLock[] =
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND "
    "pid = pg_backend_pid() AND granted AND "
    "classid = (($1::bigint >> 32) & 4294967295)::oid AND "
    "objid = ($1::bigint & 4294967295)::oid AND objsubid = 1)";

}  // namespace

struct PgLeaderLock::Impl {
  std::string dsn;
  int64_t key;
  PgLeaderLockOptions options;
  std::unique_ptr<pqxx::connection> conn;
  bool held = false;
  pg::SocketWatchdog watchdog;

  void Drop() {
    conn.reset();
    held = false;
  }

  absl::Status EnsureConnected() {
    if (conn != nullptr && conn->is_open()) return absl::OkStatus();
    conn.reset();
    try {
      conn = std::make_unique<pqxx::connection>(dsn);
      // A broken connection is dropped, never silently reopened (libpqxx 6
      // would): a new session holds no lock, and the watched socket stays
      // the connection's.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
      conn->inhibit_reactivation(true);
#pragma GCC diagnostic pop
      return absl::OkStatus();
    } catch (...) {
      absl::Status s = pg::StatusFromCurrentException("leader_lock_connect");
      return absl::UnavailableError(s.message());
    }
  }

  // Runs a one-value boolean query; Dropped connection on failure.
  absl::StatusOr<bool> QueryBool(const char* name, const char* sql) {
    const std::chrono::milliseconds timeout(options.statement_timeout_ms);
    pg::ScopedWatch watch(&watchdog, timeout.count() > 0 ? conn->sock() : -1, timeout);
    try {
      pqxx::nontransaction n(*conn);
      return n.exec_params1(sql, key)[0].as<bool>();
    } catch (...) {
      absl::Status s = pg::StatusFromCurrentException(name);
      if (watch.Disarm()) {
        s = absl::UnavailableError(absl::StrCat("PostgreSQL statement \"", name,
                                                "\": no answer within ", timeout.count(),
                                                " ms (statement timeout); connection dropped"));
      }
      Drop();
      return s;
    }
  }
};

PgLeaderLock::PgLeaderLock(std::string dsn, int64_t key, PgLeaderLockOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->dsn = pg::WithConnectTimeout(dsn, options.connect_timeout_s);
  impl_->key = key;
  impl_->options = options;
}

PgLeaderLock::~PgLeaderLock() { Release(); }

absl::StatusOr<bool> PgLeaderLock::TryAcquire() {
  if (impl_->held && StillHeld()) return true;
  // Two attempts: the first may find the old connection dead (server
  // restarted, backend terminated); the second runs on a new one.
  absl::Status last;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (absl::Status s = impl_->EnsureConnected(); !s.ok()) return s;
    absl::StatusOr<bool> got = impl_->QueryBool("leader_try_lock", kTryLock);
    if (got.ok()) {
      impl_->held = *got;
      if (*got) RESHARD_LOG(INFO) << "took leader lock " << impl_->key;
      return *got;
    }
    last = got.status();
  }
  return absl::UnavailableError(last.message());
}

bool PgLeaderLock::StillHeld() {
  if (!impl_->held || impl_->conn == nullptr) return false;
  absl::StatusOr<bool> holds = impl_->QueryBool("leader_holds_lock", kHoldsLock);
  if (!holds.ok() || !*holds) {
    RESHARD_LOG(WARNING) << "lost leader lock " << impl_->key << ": "
                         << (holds.ok() ? std::string("not held by this session")
                                        : std::string(holds.status().message()));
    impl_->Drop();
    return false;
  }
  return true;
}

void PgLeaderLock::Release() {
  if (!impl_->held) return;
  if (impl_->conn != nullptr) {
    absl::StatusOr<bool> released = impl_->QueryBool("leader_unlock", kUnlock);
    if (released.ok()) RESHARD_LOG(INFO) << "released leader lock " << impl_->key;
  }
  impl_->held = false;
}

std::unique_ptr<LeaderLock> MakePgLeaderLock(const std::string& dsn, int64_t key,
                                             PgLeaderLockOptions options) {
  return std::make_unique<PgLeaderLock>(dsn, key, options);
}

}  // namespace reshard::coordinator
