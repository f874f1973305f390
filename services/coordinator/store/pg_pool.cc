#include "services/coordinator/store/pg_pool.h"

#include <algorithm>
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

// The server rolled the transaction back to break a deadlock
// (deadlock_detected) or a serialization conflict (serialization_failure):
// nothing of it happened, and running it again can succeed.
bool CurrentExceptionIsRetryableRollback() {
  try {
    throw;
  } catch (const pqxx::deadlock_detected&) {
    return true;  // libpqxx 6 leaves sqlstate() empty on these two
  } catch (const pqxx::serialization_failure&) {
    return true;
  } catch (const pqxx::sql_error& e) {
    return e.sqlstate() == "40P01" || e.sqlstate() == "40001";
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
    if (state == "57014") {
      // query_canceled: the server's statement_timeout (the second line
      // behind the pool's own deadline); the call may be retried.
      return absl::UnavailableError(absl::StrCat(where, Trimmed(e.what())));
    }
    return absl::InternalError(absl::StrCat(where, "SQLSTATE ", state, ": ", Trimmed(e.what())));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(where, Trimmed(e.what())));
  } catch (...) {
    return absl::InternalError(absl::StrCat(where, "unknown exception"));
  }
}

using SteadyClock = std::chrono::steady_clock;

std::string WithConnectTimeout(const std::string& dsn, int seconds) {
  if (seconds <= 0 || absl::StrContains(dsn, "connect_timeout")) return dsn;
  if (absl::StartsWith(dsn, "postgresql://") || absl::StartsWith(dsn, "postgres://")) {
    return absl::StrCat(dsn, absl::StrContains(dsn, "?") ? "&" : "?", "connect_timeout=", seconds);
  }
  return absl::StrCat(dsn, dsn.empty() ? "" : " ", "connect_timeout=", seconds);
}

void PgTx::Sending(SteadyClock::time_point start) {
  pool_->Waiting(in_flight_, start);
  pool_->ExtendWatch(watch_, start);
}

void PgTx::Observe(const char* name, SteadyClock::time_point start) const {
  pool_->Answered(in_flight_);
  if (observer_ == nullptr || !*observer_) return;
  const std::chrono::duration<double> took = SteadyClock::now() - start;
  (*observer_)(name, took.count());
}

pqxx::result PgTx::ExecSql(const char* name, const std::string& sql) {
  current_ = name;
  Sending(SteadyClock::now());
  pqxx::result r = work_->exec(sql);
  pool_->Answered(in_flight_);
  return r;
}

PgPool::PgPool(Options options)
    : options_(std::move(options)),
      dsn_(WithConnectTimeout(options_.dsn, options_.connect_timeout_s)),
      last_answer_(SteadyClock::now()) {}

absl::StatusOr<std::unique_ptr<PgPool>> PgPool::Create(Options options) {
  if (options.size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PostgreSQL pool size must be at least 1, got ", options.size));
  }
  if (options.agent_reserve < 0 || options.agent_reserve >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("PostgreSQL connections reserved for agents: ", options.agent_reserve,
                     " must be at least 0 and less than the pool size ", options.size));
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

// ---- Health --------------------------------------------------------------

std::optional<SteadyClock::time_point> PgPool::SilentSinceLocked() const {
  std::optional<SteadyClock::time_point> earliest = unanswered_since_;
  for (const InFlight* f : in_flight_) {
    if (f->waiting_since.has_value() && (!earliest || *f->waiting_since < *earliest)) {
      earliest = f->waiting_since;
    }
  }
  if (!earliest) return std::nullopt;
  // The server answered someone after this call began waiting: it is slow
  // for this call, not silent.
  return std::max(*earliest, last_answer_);
}

void PgPool::Waiting(InFlight* in_flight, SteadyClock::time_point since) {
  std::lock_guard<std::mutex> l(health_mu_);
  in_flight->waiting_since = since;
}

void PgPool::Answered(InFlight* in_flight) {
  const SteadyClock::time_point now = SteadyClock::now();
  std::chrono::milliseconds outage{0};
  {
    std::lock_guard<std::mutex> l(health_mu_);
    in_flight->waiting_since.reset();
    if (std::optional<SteadyClock::time_point> since = SilentSinceLocked(); since) {
      const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - *since);
      if (silent >= options_.outage_after) {
        ++outages_;
        last_outage_ = silent;
        outage = silent;
      }
    }
    last_answer_ = std::max(last_answer_, now);
    unanswered_since_.reset();
  }
  if (outage.count() > 0) {
    RESHARD_LOG(WARNING) << "PostgreSQL answers again after " << outage.count()
                         << " ms without an answer";
  }
}

void PgPool::GaveUp(InFlight* in_flight) {
  std::lock_guard<std::mutex> l(health_mu_);
  if (in_flight->waiting_since.has_value()) {
    const SteadyClock::time_point since = std::max(*in_flight->waiting_since, last_answer_);
    if (!unanswered_since_ || since < *unanswered_since_) unanswered_since_ = since;
  }
  in_flight->waiting_since.reset();
}

void PgPool::ExtendWatch(uint64_t watch, SteadyClock::time_point start) {
  if (watch == 0) return;
  watchdog_.Extend(watch, start + options_.statement_timeout);
}

StoreHealth PgPool::Health() const {
  const SteadyClock::time_point now = SteadyClock::now();
  std::lock_guard<std::mutex> l(health_mu_);
  StoreHealth health;
  if (std::optional<SteadyClock::time_point> since = SilentSinceLocked(); since && *since < now) {
    health.silent_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - *since).count();
  }
  health.answering = health.silent_ms < options_.outage_after.count();
  health.outages = outages_;
  health.last_outage_ms = last_outage_.count();
  return health;
}

absl::Status PgPool::Probe() {
  return Transact("Probe", [](PgTx& tx) {
    tx.ExecSql("probe", "SELECT 1");
    return absl::OkStatus();
  });
}

// ---- Connections ---------------------------------------------------------

namespace {

// Registers a call in flight for its lifetime.
class InFlightScope {
 public:
  InFlightScope(std::mutex* mu, std::set<InFlight*>* set) : mu_(mu), set_(set) {
    std::lock_guard<std::mutex> l(*mu_);
    set_->insert(&in_flight_);
  }
  ~InFlightScope() {
    std::lock_guard<std::mutex> l(*mu_);
    set_->erase(&in_flight_);
  }
  InFlight* get() { return &in_flight_; }

 private:
  std::mutex* mu_;
  std::set<InFlight*>* set_;
  InFlight in_flight_;
};

// libpqxx 6 silently reconnects a broken connection on its next use; the
// pool instead drops it, so that the socket a watch holds stays the
// connection's socket.
void InhibitReactivation(pqxx::connection& conn) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  conn.inhibit_reactivation(true);
#pragma GCC diagnostic pop
}

std::string TimeoutMs(std::chrono::milliseconds ms) { return absl::StrCat(ms.count()); }

}  // namespace

absl::StatusOr<std::unique_ptr<pqxx::connection>> PgPool::Connect() {
  InFlightScope in_flight(&health_mu_, &in_flight_);
  const SteadyClock::time_point start = SteadyClock::now();
  Waiting(in_flight.get(), start);
  std::unique_ptr<pqxx::connection> conn;
  try {
    // Bounded by libpq's connect_timeout (dsn_).
    conn = std::make_unique<pqxx::connection>(dsn_);
  } catch (...) {
    GaveUp(in_flight.get());
    absl::Status s = StatusFromCurrentException("connect");
    if (absl::IsInternal(s)) return s;
    return absl::UnavailableError(s.message());
  }
  InhibitReactivation(*conn);
  if (options_.statement_timeout.count() > 0) {
    // The server's own limits, behind the pool's deadline: a statement
    // running longer is cancelled, and a transaction left idle (its client
    // stopped) ends, freeing its locks.
    ScopedWatch watch(&watchdog_, conn->sock(), options_.statement_timeout);
    try {
      pqxx::nontransaction n(*conn);
      n.exec(absl::StrCat("SET statement_timeout = ", TimeoutMs(options_.statement_timeout),
                          "; SET idle_in_transaction_session_timeout = ",
                          TimeoutMs(2 * options_.statement_timeout)));
    } catch (...) {
      const bool fired = watch.Disarm();
      GaveUp(in_flight.get());
      absl::Status s = StatusFromCurrentException("connect");
      if (fired) {
        return absl::UnavailableError(
            absl::StrCat("PostgreSQL did not answer a new connection's set-up within ",
                         options_.statement_timeout.count(), " ms"));
      }
      if (absl::IsInternal(s)) return s;
      return absl::UnavailableError(s.message());
    }
  }
  Answered(in_flight.get());
  // Registered now, prepared by the server on first use on this connection.
  for (const Statement& s : options_.statements) conn->prepare(s.name, s.sql);
  return conn;
}

absl::StatusOr<std::unique_ptr<pqxx::connection>> PgPool::Acquire(CallClass call_class) {
  const bool client = call_class == CallClass::kClient;
  const int client_share = options_.size - options_.agent_reserve;
  std::unique_lock<std::mutex> l(mu_);
  const bool got = cv_.wait_for(l, options_.acquire_timeout, [&] {
    if (client && leased_by_clients_ >= client_share) return false;
    return !idle_.empty() || open_ < options_.size;
  });
  if (!got) {
    if (client && options_.agent_reserve > 0) {
      return absl::UnavailableError(absl::StrCat(
          "the ", client_share, " PostgreSQL connections open to client calls (", options_.size,
          " less ", options_.agent_reserve, " kept for agents) stayed busy for ",
          options_.acquire_timeout.count(), " ms"));
    }
    return absl::UnavailableError(absl::StrCat("all ", options_.size,
                                               " PostgreSQL connections stayed busy for ",
                                               options_.acquire_timeout.count(), " ms"));
  }
  if (client) ++leased_by_clients_;
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
    if (client) --leased_by_clients_;
    l.unlock();
    cv_.notify_all();
  }
  return conn;
}

void PgPool::Release(std::unique_ptr<pqxx::connection> conn, bool broken, CallClass call_class) {
  std::vector<std::unique_ptr<pqxx::connection>> to_close;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (call_class == CallClass::kClient) --leased_by_clients_;
    if (broken || !conn->is_open()) {
      --open_;
      to_close.push_back(std::move(conn));
      if (broken) {
        // A dropped connection usually means the server restarted or
        // terminated backends, or stopped answering: the idle ones are most
        // likely dead as well.
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

absl::Status PgPool::RunOnce(absl::string_view what, const Body& body, bool* broken,
                             bool* rolled_back) {
  *broken = false;
  *rolled_back = false;
  const CallClass call_class = CurrentCallClass();
  absl::StatusOr<std::unique_ptr<pqxx::connection>> conn = Acquire(call_class);
  if (!conn.ok()) return conn.status();
  InFlightScope in_flight(&health_mu_, &in_flight_);
  const bool deadline = options_.statement_timeout.count() > 0;
  ScopedWatch watch(&watchdog_, deadline ? (*conn)->sock() : -1, options_.statement_timeout);
  absl::Status status;
  PgTx tx(&options_.observer, this, in_flight.get(), watch.id());
  try {
    tx.Sending(SteadyClock::now());  // BEGIN
    pqxx::work work(**conn);
    Answered(in_flight.get());
    tx.set_work(&work);
    status = body(tx);
    if (status.ok()) {
      tx.set_current_statement("commit");
      const auto start = SteadyClock::now();
      tx.Sending(start);
      work.commit();
      tx.Observe("commit", start);
      tx.Committed();
    }
    // Otherwise ~work rolls back.
  } catch (...) {
    *broken = CurrentExceptionBrokeConnection();
    *rolled_back = CurrentExceptionIsRetryableRollback();
    const bool in_doubt = CurrentExceptionIsInDoubt();
    status = StatusFromCurrentException(tx.current_statement());
    const bool fired = watch.Disarm();
    if (*broken || fired) {
      GaveUp(in_flight.get());
    } else {
      Answered(in_flight.get());  // an SQL error is an answer
    }
    if (fired) {
      status = absl::UnavailableError(absl::StrCat(
          "PostgreSQL statement \"", tx.current_statement(), "\" in ", what,
          ": no answer within ", options_.statement_timeout.count(),
          " ms (statement timeout); connection dropped",
          in_doubt ? ", outcome of the commit unknown" : ""));
    }
    if (*broken || fired) {
      RESHARD_LOG(WARNING) << "PostgreSQL connection lost in " << what << ": " << status;
    }
    const bool drop = *broken || fired;
    // Never retried: the commit may have happened, or the server does not
    // answer (a second try would only double the wait).
    if (in_doubt || fired) *broken = false;
    Release(*std::move(conn), drop, call_class);
    return status;
  }
  // A deadline that passed just as the answer came leaves the socket shut
  // down: the connection is dropped rather than pooled.
  Release(*std::move(conn), /*broken=*/watch.Disarm(), call_class);
  return status;
}

absl::Status PgPool::Transact(absl::string_view what, const Body& body) {
  int broken_retries = 1;
  int rollback_retries = kRollbackRetries;
  for (;;) {
    bool broken = false, rolled_back = false;
    absl::Status status = RunOnce(what, body, &broken, &rolled_back);
    // The connection broke before the commit: nothing happened, so the whole
    // transaction can run again, on a new connection.
    if (broken && broken_retries-- > 0) continue;
    // Rolled back by the server to break a deadlock or a serialization
    // conflict: nothing happened, and the transaction it lost to has its
    // locks now, so running it again goes through.
    if (rolled_back && rollback_retries-- > 0) {
      RESHARD_LOG(INFO) << "PostgreSQL rolled back " << what << " (" << status.message()
                        << "); running it again";
      rollbacks_retried_.fetch_add(1);
      continue;
    }
    return status;
  }
}

}  // namespace reshard::coordinator::pg
