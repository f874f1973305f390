// The real reshard-coordinator binary as a child process of a test: started
// with flags (ports 0), its ports read from its start-up line, stopped with
// SIGTERM or killed with SIGKILL. Its stdout and stderr go to the test's
// stderr, prefixed. Not thread-safe: one owner thread.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/support/process.h"

namespace reshard::coordinator::testing {

/// The binary under test (from CMake: $<TARGET_FILE:reshard-coordinator>).
std::string CoordinatorBinary();

/// What the start-up line says: `reshard-coordinator listening on H:P
/// metrics on H:M replica ID`.
struct StartupLine {
  int port = 0;
  int metrics_port = 0;
  std::string replica_id;
};

/// Parses the start-up line; nullopt for any other line.
std::optional<StartupLine> ParseStartupLine(const std::string& line);

class CoordinatorProcess {
 public:
  /// Starts `reshard-coordinator serve <args>` and waits (up to `timeout`)
  /// for its start-up line. Fails, with the exit status, when the process
  /// exits first.
  static absl::StatusOr<std::unique_ptr<CoordinatorProcess>> Start(
      const std::vector<std::string>& args, absl::Duration timeout = absl::Seconds(30));

  /// Runs `reshard-coordinator <args>` to completion; its exit status
  /// (128 + signal when killed), or an error when it ran past `timeout`.
  static absl::StatusOr<int> Run(const std::vector<std::string>& args,
                                 absl::Duration timeout = absl::Seconds(60));

  ~CoordinatorProcess();  // kills the process if it still runs

  int port() const { return startup_.port; }
  int metrics_port() const { return startup_.metrics_port; }
  const std::string& replica_id() const { return startup_.replica_id; }
  /// 127.0.0.1:port, for clients.
  std::string address() const;
  pid_t pid() const { return pid_; }

  /// SIGKILL, then reaps it.
  void Kill();
  /// SIGTERM and waits up to `timeout`; the exit status (128 + signal when
  /// killed by one), or an error if it did not exit in time (then killed).
  absl::StatusOr<int> Terminate(absl::Duration timeout = absl::Seconds(30));

 private:
  /// Owns `child` and reads its output (stdout and stderr on one pipe).
  explicit CoordinatorProcess(test_support::ChildProcess child);
  /// One line of its output: echoed to stderr; the start-up line parsed.
  void OnLine(const std::string& line);
  /// Waits for the exit (then joins the reader); its exit status, or
  /// nullopt on timeout. Once reaped: the status it exited with.
  std::optional<int> WaitExit(absl::Duration timeout);

  test_support::ChildProcess child_;
  pid_t pid_ = -1;  // kept after the child is reaped
  int exit_status_ = -1;
  StartupLine startup_;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool got_startup_ = false;
  bool output_closed_ = false;
};

}  // namespace reshard::coordinator::testing
