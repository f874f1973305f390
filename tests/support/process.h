// Child processes in tests: one fork/exec spawner that every suite uses
// (tests/support, reshard_test_support). Everything the child needs (argv,
// environment, the executable's path looked up in PATH, pipes) is made
// before fork; after it the child makes only async-signal-safe calls
// (set*id, prctl, getppid, chdir, open, dup2, fcntl, write, execve, _exit),
// so that spawning from a process that runs other threads (gRPC) is safe.
// A failure between fork and exec comes back from Spawn as an error naming
// the step, not as an exit status.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace reshard::test_support {

/// Where one of the child's standard streams goes.
struct Stream {
  enum class Kind {
    kNull,       // /dev/null
    kInherit,    // the parent's own (same fd number)
    kFile,       // `path`, created if missing, appended to or truncated
    kPipe,       // a pipe whose other end the parent gets (ChildProcess)
    kParentFd,   // the parent's `fd`, as it is when Spawn is called
    kSameAsOut,  // stderr only: wherever the child's stdout goes
  };
  Kind kind = Kind::kInherit;
  std::string path;    // kFile
  bool append = true;  // kFile
  int fd = -1;         // kParentFd

  static Stream Null() { return Of(Kind::kNull); }
  static Stream Inherit() { return Of(Kind::kInherit); }
  static Stream File(std::string path, bool append = true) {
    Stream s = Of(Kind::kFile);
    s.path = std::move(path);
    s.append = append;
    return s;
  }
  static Stream Pipe() { return Of(Kind::kPipe); }
  static Stream ParentFd(int fd) {
    Stream s = Of(Kind::kParentFd);
    s.fd = fd;
    return s;
  }
  static Stream SameAsOut() { return Of(Kind::kSameAsOut); }

 private:
  static Stream Of(Kind kind) {
    Stream s;
    s.kind = kind;
    return s;
  }
};

struct SpawnOptions {
  /// argv[0]: a path (with a '/'), or a name looked up in the child's PATH
  /// before fork (NotFound when no executable has that name).
  std::vector<std::string> argv;
  /// Set in the child's environment (replacing a variable of that name);
  /// the rest of this process's environment is kept.
  std::vector<std::pair<std::string, std::string>> env;
  std::string cwd;  // empty: this process's
  Stream in = Stream::Inherit();
  Stream out = Stream::Inherit();
  Stream err = Stream::Inherit();
  /// Run as `uid`/`gid` (setgroups(0), setgid, setuid) when set.
  std::optional<std::pair<uid_t, gid_t>> user;
  /// SIGKILL the child when the thread that spawned it exits (Linux
  /// PR_SET_PDEATHSIG; set after the user switch, which clears it). A test
  /// that dies then leaves no child behind; spawn from a thread that lives
  /// as long as the child should.
  bool die_with_parent = false;
};

/// A raw wait status as one number: the exit code, 128 + the signal when a
/// signal ended it, -1 otherwise.
int ExitStatusOf(int wait_status);

/// Waits for `pid` (EINTR retried); its exit status (ExitStatusOf), or -1
/// when it is not this process's child (ECHILD: reaped elsewhere).
int WaitPid(pid_t pid);

/// Whether `pid` has exited, reaping it: then *status gets its exit status
/// (-1 when it is not this process's child any more). Does not block.
bool PidExited(pid_t pid, int* status);

/// A spawned child: killed (SIGKILL) and reaped when destroyed unless it was
/// reaped or released before. Movable; one owner thread.
class ChildProcess {
 public:
  /// Forks and execs `options.argv`. Errors: InvalidArgument (empty argv),
  /// NotFound (no such executable), Internal (a system call failed in this
  /// process, or in the child before exec: the step and errno named).
  static absl::StatusOr<ChildProcess> Spawn(const SpawnOptions& options);

  ChildProcess() = default;
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  /// -1 once reaped or released.
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

  /// The parent's ends of the kPipe streams (-1 for the others). Take*Fd
  /// hands the fd over (the caller closes it); the others are closed with
  /// this object.
  int in_fd() const { return in_fd_; }
  int out_fd() const { return out_fd_; }
  int err_fd() const { return err_fd_; }
  int TakeInFd() { return std::exchange(in_fd_, -1); }
  int TakeOutFd() { return std::exchange(out_fd_, -1); }
  int TakeErrFd() { return std::exchange(err_fd_, -1); }
  /// Closes the pipe to the child's stdin (it reads EOF).
  void CloseIn();

  /// Whether it has exited (reaping it; *status gets the exit status).
  bool Exited(int* status);
  /// Waits up to `timeout` for it to exit; its exit status, or nullopt if
  /// it still runs.
  std::optional<int> WaitExit(absl::Duration timeout);
  /// SIGTERM, then WaitExit(timeout); the exit status, or DeadlineExceeded
  /// (then SIGKILLed and reaped). FailedPrecondition when not running.
  absl::StatusOr<int> Terminate(absl::Duration timeout = absl::Seconds(30));
  /// SIGKILL, then waits up to `timeout`; the exit status, or
  /// DeadlineExceeded when it did not die (it stays owned). OK with -1 when
  /// not running.
  absl::StatusOr<int> Kill(absl::Duration timeout = absl::Seconds(30));
  /// Hands the pid over: nothing kills or reaps it any more through this
  /// object (the caller waits for it, e.g. WaitPid).
  pid_t Release();

 private:
  void CloseFds();

  pid_t pid_ = -1;
  int in_fd_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
};

/// Reads `fd` line by line on a new thread until EOF, calling `on_line` with
/// each line (without its '\n'; a last line without one too), then
/// `on_end` (when set); closes `fd`. Join the thread (it ends once every
/// writer of the pipe has closed it: the child exited).
std::thread StartLineReader(int fd, std::function<void(const std::string& line)> on_line,
                            std::function<void()> on_end = {});

}  // namespace reshard::test_support
