// Starting the PostgreSQL binaries as child processes, optionally as another
// user (root cannot run them). Internal to the test harness: raw pids over
// the shared spawner (tests/support/process.h, test_support::ChildProcess).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace reshard::coordinator::testing {

struct ChildOptions {
  std::vector<std::string> argv;  // argv[0] is the executable's path
  std::string log_path;           // stdout and stderr go here (appended)
  std::string cwd;                // empty: inherit
  bool switch_user = false;       // run as uid / gid
  uid_t uid = 0;
  gid_t gid = 0;
  /// SIGKILL the child when the thread that spawned it exits.
  bool die_with_parent = false;
};

/// Forks and execs; returns the child's pid.
[[nodiscard]] absl::StatusOr<pid_t> SpawnChild(const ChildOptions& options);

/// Waits for the child; its exit status (128 + signal when killed).
int WaitChild(pid_t pid);

/// Runs to completion; FailedPrecondition with the log's tail when it exits
/// non-zero.
[[nodiscard]] absl::Status RunChild(const ChildOptions& options);

/// Whether the child has exited (reaping it); *status gets its exit status.
bool ChildExited(pid_t pid, int* status);

/// The last `max_bytes` of a file, or "" when it cannot be read.
std::string FileTail(const std::string& path, size_t max_bytes = 2000);

}  // namespace reshard::coordinator::testing
