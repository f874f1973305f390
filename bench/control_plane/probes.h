// What control_plane_bench measures outside its own calls: a
// reshard-coordinator started as a child process (the deployable binary,
// default settings plus the flags the run must pass), its CPU time, threads
// and resident memory from /proc, and PostgreSQL's own counters of the
// coordinator's database (pg_stat_database). Not thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace reshard::bench {

/// One reshard-coordinator replica, `serve`d as a child of this process
/// (SIGKILLed if this process dies), its output in `log_path`.
class CoordinatorProcess {
 public:
  /// Starts `binary serve --dsn DSN --listen 127.0.0.1:0 --metrics-listen
  /// 127.0.0.1:0 --insecure --replica-id ID` plus `extra_flags`, and waits
  /// for its start-up line (60 s). Call from the main thread.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CoordinatorProcess>> Start(
      const std::string& binary, const std::string& dsn, const std::string& replica_id,
      const std::vector<std::string>& extra_flags, const std::string& log_path);
  ~CoordinatorProcess();  // SIGTERM, then SIGKILL after 10 s

  const std::string& address() const { return address_; }  // "127.0.0.1:PORT"
  pid_t pid() const { return pid_; }
  /// OK while it runs; otherwise its exit status and the log's tail.
  [[nodiscard]] absl::Status CheckRunning();
  std::string LogTail() const;

 private:
  CoordinatorProcess() = default;
  pid_t pid_ = -1;
  std::string address_;
  std::string log_path_;
};

/// A process's counters now (/proc/PID/stat and /proc/PID/status).
struct ProcSample {
  double cpu_seconds = 0;  // utime + stime
  int threads = 0;
  int64_t rss_kib = 0;
};
[[nodiscard]] absl::StatusOr<ProcSample> SampleProcess(pid_t pid);

/// pg_stat_database of the dsn's database: transactions (xact_commit +
/// xact_rollback) and rows read (tup_returned + tup_fetched). PostgreSQL
/// flushes a backend's counters at most once a second, so a delta over a
/// window of T seconds is good to about 1/T.
struct PgSample {
  int64_t transactions = 0;
  int64_t rows_read = 0;
};
[[nodiscard]] absl::StatusOr<PgSample> SamplePostgres(const std::string& dsn);

/// The `top` statements that read the most rows since the server started,
/// from pg_stat_statements (the server must preload it): one line each with
/// calls, rows and total time. Creates the extension in the dsn's database.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> TopStatements(const std::string& dsn,
                                                                     int top);

}  // namespace reshard::bench
