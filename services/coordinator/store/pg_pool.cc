#include "services/coordinator/store/pg_pool.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log.h"

namespace reshard::coordinator::pg {
namespace {

std::string Trimmed(const char* what) {
  return std::string(absl::StripTrailingAsciiWhitespace(absl::string_view(what)));
}

// SQLSTATEs that mean the session is gone: connection exceptions (class 08),
// admin / crash shutdown, cannot connect now, too many connections.
bool IsConnectionSqlState(const std::string& state) {
  return absl::StartsWith(state, "08") || state == "57P01" || state == "57P02" ||
         state == "57P03" || state == "53300";
}

// Whether the exception being handled means the connection can no longer
// be used.
bool CurrentExceptionBrokeConnection() {
  try {
    throw;
  } catch (const pqxx::broken_connection&) {
    return true;
  } catch (const pqxx::in_doubt_error&) {
    return true;
  } catch (const pqxx::sql_error& e) {
    return IsConnectionSqlState(e.sqlstate());
  } catch (...) {
    return false;
  }
}

bool CurrentExceptionIsInDoubt() {
  try {
    throw;
  } catch (const pqxx::in_doubt_error&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

absl::Status StatusFromCurrentException(absl::string_view statement) {
  const std::string where = absl::StrCat("PostgreSQL statement \"", statement, "\": ");
  try {
    throw;
  } catch (const pqxx::in_doubt_error& e) {
    return absl::UnavailableError(
        absl::StrCat(where, "connection lost during commit, outcome unknown: ", Trimmed(e.what())));
  } catch (const pqxx::broken_connection& e) {
    return absl::UnavailableError(absl::StrCat(where, Trimmed(e.what())));
  } catch (const pqxx::transaction_rollback& e) {
    // serialization_failure, deadlock_detected, statement_completion_unknown.
    return absl::AbortedError(absl::StrCat(where, Trimmed(e.what())));
  } catch (const pqxx::unique_violation& e) {
    return absl::AlreadyExistsError(absl::StrCat(where, Trimmed(e.what())));
  } catch (const pqxx::sql_error& e) {
    const std::string& state = e.sqlstate();
    if (IsConnectionSqlState(state)) {
      return absl::UnavailableError(absl::StrCat(where, Trimmed(e.what())));
    }
    if (absl::StartsWith(state, "40")) {
      return absl::AbortedError(absl::StrCat(where, Trimmed(e.what())));
    }
    if (state == "23505") {
      return absl::AlreadyExistsError(absl::StrCat(where, Trimmed(e.what())));
    }
    return absl::InternalError(absl::StrCat(where, "SQLSTATE ", state, ": ", Trimmed(e.what())));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(where, Trimmed(e.what())));
  } catch (...) {
    return absl::InternalError(absl::StrCat(where, "unknown exception"));
  }
}

void PgTx::Observe(const char* name, std::chrono::steady_clock::time_point start) const {
  if (observer_ == nullptr || !*observer_) return;
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  (*observer_)(name, took.count());
}

absl::StatusOr<std::unique_ptr<PgPool>> PgPool::Create(Options options) {
  if (options.size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PostgreSQL pool size must be at least 1, got ", options.size));
  }
  std::unique_ptr<PgPool> pool(new PgPool(std::move(options)));
  absl::StatusOr<std::unique_ptr<pqxx::connection>> first = pool->Connect();
  if (!first.ok()) return first.status();
  // Prepare every statement now on the first connection, so that one that
  // does not fit the schema fails at start-up rather than on first use.
  for (const Statement& s : pool->options_.statements) {
    try {
      (*first)->prepare_now(s.name);
    } catch (...) {
      return StatusFromCurrentException(s.name);
    }
  }
  pool->open_ = 1;
  pool->idle_.push_back(*std::move(first));
  return pool;
}

PgPool::~PgPool() = default;

int PgPool::open_connections() const {
  std::lock_guard<std::mutex> l(mu_);
  return open_;
}

absl::StatusOr<std::unique_ptr<pqxx::connection>> PgPool::Connect() const {
  try {
    auto conn = std::make_unique<pqxx::connection>(options_.dsn);
    // Registered now, prepared by the server on first use on this connection.
    for (const Statement& s : options_.statements) conn->prepare(s.name, s.sql);
    return conn;
  } catch (...) {
    absl::Status s = StatusFromCurrentException("connect");
    if (absl::IsInternal(s)) return s;
    return absl::UnavailableError(s.message());
  }
}

absl::StatusOr<std::unique_ptr<pqxx::connection>> PgPool::Acquire() {
  std::unique_lock<std::mutex> l(mu_);
  const bool got = cv_.wait_for(l, options_.acquire_timeout,
                                [&] { return !idle_.empty() || open_ < options_.size; });
  if (!got) {
    return absl::UnavailableError(absl::StrCat("all ", options_.size,
                                               " PostgreSQL connections stayed busy for ",
                                               options_.acquire_timeout.count(), " ms"));
  }
  if (!idle_.empty()) {
    std::unique_ptr<pqxx::connection> conn = std::move(idle_.back());
    idle_.pop_back();
    return conn;
  }
  ++open_;
  l.unlock();
  absl::StatusOr<std::unique_ptr<pqxx::connection>> conn = Connect();
  if (!conn.ok()) {
    l.lock();
    --open_;
    l.unlock();
    cv_.notify_one();
  }
  return conn;
}

void PgPool::Release(std::unique_ptr<pqxx::connection> conn, bool broken) {
  std::vector<std::unique_ptr<pqxx::connection>> to_close;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (broken || !conn->is_open()) {
      --open_;
      to_close.push_back(std::move(conn));
      if (broken) {
        // A dropped connection usually means the server restarted or
        // terminated backends: the idle ones are most likely dead as well.
        open_ -= static_cast<int>(idle_.size());
        for (auto& c : idle_) to_close.push_back(std::move(c));
        idle_.clear();
      }
    } else {
      idle_.push_back(std::move(conn));
    }
  }
  cv_.notify_all();
  // Closing happens outside the lock.
}

absl::Status PgPool::RunOnce(absl::string_view what, const Body& body, bool* broken) {
  *broken = false;
  absl::StatusOr<std::unique_ptr<pqxx::connection>> conn = Acquire();
  if (!conn.ok()) return conn.status();
  absl::Status status;
  PgTx tx(&options_.observer);
  try {
    pqxx::work work(**conn);
    tx.set_work(&work);
    status = body(tx);
    if (status.ok()) {
      tx.set_current_statement("commit");
      const auto start = std::chrono::steady_clock::now();
      work.commit();
      tx.Observe("commit", start);
      tx.Committed();
    }
    // Otherwise ~work rolls back.
  } catch (...) {
    *broken = CurrentExceptionBrokeConnection();
    const bool in_doubt = CurrentExceptionIsInDoubt();
    status = StatusFromCurrentException(tx.current_statement());
    if (*broken) {
      RESHARD_LOG(WARNING) << "PostgreSQL connection lost in " << what << ": " << status;
    }
    const bool drop = *broken;
    if (in_doubt) *broken = false;  // never retried: the commit may have happened
    Release(*std::move(conn), drop);
    return status;
  }
  Release(*std::move(conn), /*broken=*/false);
  return status;
}

absl::Status PgPool::Transact(absl::string_view what, const Body& body) {
  bool broken = false;
  absl::Status status = RunOnce(what, body, &broken);
  if (!broken) return status;
  // The connection broke before the commit: nothing happened, so the whole
  // transaction can run again, on a new connection.
  status = RunOnce(what, body, &broken);
  return status;
}

}  // namespace reshard::coordinator::pg
