#include "tests/support/process.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/support/wait.h"

extern char** environ;

namespace reshard::test_support {
namespace {

// What the child failed at before exec (reported through the error pipe).
enum Step : int {
  kSetUser = 1,
  kDeathSignal,
  kParentGone,
  kChdir,
  kOpenIn,
  kOpenOut,
  kOpenErr,
  kDup,
  kExec,
};

struct ChildReport {
  int step = 0;
  int error = 0;
};

void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

// One standard stream of the child, as prepared before fork.
struct Plan {
  Stream::Kind kind = Stream::Kind::kInherit;
  const char* path = nullptr;  // kNull, kFile: opened in the child
  int open_flags = 0;
  int child_fd = -1;   // kPipe, kParentFd: made target in the child (CLOEXEC)
  int parent_fd = -1;  // kPipe: the parent's end (CLOEXEC)
};

absl::Status PlanStream(const Stream& s, int target, Plan* plan) {
  plan->kind = s.kind;
  const bool input = target == STDIN_FILENO;
  switch (s.kind) {
    case Stream::Kind::kInherit:
      return absl::OkStatus();
    case Stream::Kind::kNull:
      plan->path = "/dev/null";
      plan->open_flags = input ? O_RDONLY : O_WRONLY;
      return absl::OkStatus();
    case Stream::Kind::kFile:
      if (s.path.empty()) return absl::InvalidArgumentError("Stream::File with an empty path");
      plan->path = s.path.c_str();
      plan->open_flags = input ? O_RDONLY : (O_WRONLY | O_CREAT | (s.append ? O_APPEND : O_TRUNC));
      return absl::OkStatus();
    case Stream::Kind::kPipe: {
      int fds[2];
      if (pipe2(fds, O_CLOEXEC) != 0) {
        return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
      }
      plan->child_fd = input ? fds[0] : fds[1];
      plan->parent_fd = input ? fds[1] : fds[0];
      return absl::OkStatus();
    }
    case Stream::Kind::kParentFd: {
      // A copy above 2: the child's own redirections cannot overwrite it.
      plan->child_fd = fcntl(s.fd, F_DUPFD_CLOEXEC, 3);
      if (plan->child_fd < 0) {
        return absl::InternalError(
            absl::StrCat("duplicating fd ", s.fd, ": ", std::strerror(errno)));
      }
      return absl::OkStatus();
    }
    case Stream::Kind::kSameAsOut:
      if (target != STDERR_FILENO) {
        return absl::InvalidArgumentError("Stream::SameAsOut is for stderr only");
      }
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown Stream kind");
}

// `name` as the child's PATH finds it: an executable regular file.
absl::StatusOr<std::string> ResolveExecutable(const std::string& name, const char* path_var) {
  if (name.find('/') != std::string::npos) return name;
  const std::string path = path_var != nullptr ? path_var : "/usr/local/bin:/usr/bin:/bin";
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    struct stat st{};
    if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return absl::NotFoundError(absl::StrCat("no executable `", name, "` in PATH ", path));
}

// --- In the child, after fork: async-signal-safe calls only. ---

[[noreturn]] void ChildFail(int report_fd, int step) {
  const ChildReport report{step, errno};
  const char* p = reinterpret_cast<const char*>(&report);
  size_t left = sizeof(report);
  while (left > 0) {
    const ssize_t n = write(report_fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    p += n;
    left -= static_cast<size_t>(n);
  }
  _exit(127);
}

// Makes `fd` the child's `target` (without close-on-exec).
bool ChildMoveTo(int fd, int target) {
  if (fd == target) return fcntl(fd, F_SETFD, 0) == 0;
  while (dup2(fd, target) < 0) {
    if (errno != EINTR) return false;
  }
  return true;
}

void ChildApply(const Plan& plan, int target, int open_step, int report_fd) {
  switch (plan.kind) {
    case Stream::Kind::kInherit:
      return;
    case Stream::Kind::kNull:
    case Stream::Kind::kFile: {
      int fd;
      while ((fd = open(plan.path, plan.open_flags, 0644)) < 0 && errno == EINTR) {
      }
      if (fd < 0) ChildFail(report_fd, open_step);
      if (!ChildMoveTo(fd, target)) ChildFail(report_fd, kDup);
      if (fd != target) close(fd);
      return;
    }
    case Stream::Kind::kPipe:
    case Stream::Kind::kParentFd:
      if (!ChildMoveTo(plan.child_fd, target)) ChildFail(report_fd, kDup);
      return;
    case Stream::Kind::kSameAsOut:
      if (!ChildMoveTo(STDOUT_FILENO, STDERR_FILENO)) ChildFail(report_fd, kDup);
      return;
  }
}

std::string StepText(const ChildReport& report, const SpawnOptions& options,
                     const std::string& executable) {
  const auto path_of = [](const Stream& s) {
    return s.kind == Stream::Kind::kFile ? s.path : std::string("/dev/null");
  };
  std::string step;
  switch (report.step) {
    case kSetUser:
      step = absl::StrCat("switching to uid ", options.user->first, " gid ", options.user->second);
      break;
    case kDeathSignal:
      step = "prctl(PR_SET_PDEATHSIG)";
      break;
    case kParentGone:
      return "the spawning process exited before the child set its death signal";
    case kChdir:
      step = absl::StrCat("chdir ", options.cwd);
      break;
    case kOpenIn:
      step = absl::StrCat("opening stdin ", path_of(options.in));
      break;
    case kOpenOut:
      step = absl::StrCat("opening stdout ", path_of(options.out));
      break;
    case kOpenErr:
      step = absl::StrCat("opening stderr ", path_of(options.err));
      break;
    case kDup:
      step = "dup2";
      break;
    case kExec:
      step = absl::StrCat("execve ", executable);
      break;
    default:
      step = absl::StrCat("step ", report.step);
  }
  return absl::StrCat(step, ": ", std::strerror(report.error));
}

}  // namespace

int ExitStatusOf(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

int WaitPid(pid_t pid) {
  int raw = 0;
  while (waitpid(pid, &raw, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return ExitStatusOf(raw);
}

bool PidExited(pid_t pid, int* status) {
  int raw = 0;
  pid_t r;
  while ((r = waitpid(pid, &raw, WNOHANG)) < 0 && errno == EINTR) {
  }
  if (r == pid) {
    *status = ExitStatusOf(raw);
    return true;
  }
  if (r < 0) {  // ECHILD: not (or no longer) our child
    *status = -1;
    return true;
  }
  return false;
}

absl::StatusOr<ChildProcess> ChildProcess::Spawn(const SpawnOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("Spawn: empty argv");

  // The child's environment: ours, with options.env replacing or adding.
  std::vector<std::string> env;
  const char* path_var = std::getenv("PATH");
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    const absl::string_view name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [k, v] : options.env) replaced |= k == name;
    if (!replaced) env.emplace_back(entry);
  }
  for (const auto& [k, v] : options.env) {
    env.push_back(absl::StrCat(k, "=", v));
    if (k == "PATH") path_var = v.c_str();
  }
  absl::StatusOr<std::string> executable = ResolveExecutable(options.argv[0], path_var);
  if (!executable.ok()) return executable.status();

  std::vector<char*> argv;
  for (const std::string& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const char* cwd = options.cwd.empty() ? nullptr : options.cwd.c_str();
  const pid_t parent = getpid();

  Plan plans[3];
  int report_fds[2] = {-1, -1};
  const auto close_all = [&] {
    for (Plan& p : plans) {
      CloseFd(&p.child_fd);
      CloseFd(&p.parent_fd);
    }
    CloseFd(&report_fds[0]);
    CloseFd(&report_fds[1]);
  };
  const Stream* streams[3] = {&options.in, &options.out, &options.err};
  for (int target = 0; target < 3; ++target) {
    if (absl::Status s = PlanStream(*streams[target], target, &plans[target]); !s.ok()) {
      close_all();
      return s;
    }
  }
  if (pipe2(report_fds, O_CLOEXEC) != 0) {
    const int error = errno;
    close_all();
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(error)));
  }

  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    close_all();
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(error)));
  }
  if (pid == 0) {
    const int report = report_fds[1];
    if (options.user.has_value()) {
      if (setgroups(0, nullptr) != 0 || setgid(options.user->second) != 0 ||
          setuid(options.user->first) != 0) {
        ChildFail(report, kSetUser);
      }
    }
    // After the credential change, which clears the parent-death signal.
    if (options.die_with_parent) {
      if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) ChildFail(report, kDeathSignal);
      if (getppid() != parent) {
        errno = 0;
        ChildFail(report, kParentGone);
      }
    }
    if (cwd != nullptr && chdir(cwd) != 0) ChildFail(report, kChdir);
    ChildApply(plans[0], STDIN_FILENO, kOpenIn, report);
    ChildApply(plans[1], STDOUT_FILENO, kOpenOut, report);
    ChildApply(plans[2], STDERR_FILENO, kOpenErr, report);
    execve(executable->c_str(), argv.data(), envp.data());
    ChildFail(report, kExec);
  }

  // The child's ends are its own now; the report pipe reads EOF at exec.
  for (Plan& p : plans) CloseFd(&p.child_fd);
  CloseFd(&report_fds[1]);
  ChildReport report;
  size_t got = 0;
  while (got < sizeof(report)) {
    const ssize_t n =
        read(report_fds[0], reinterpret_cast<char*>(&report) + got, sizeof(report) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  CloseFd(&report_fds[0]);
  if (got > 0) {
    WaitPid(pid);
    close_all();
    const std::string text = absl::StrCat("spawning `", absl::StrJoin(options.argv, " "),
                                          "`: ", StepText(report, options, *executable));
    if (report.step == kExec && report.error == ENOENT) return absl::NotFoundError(text);
    return absl::InternalError(text);
  }

  ChildProcess child;
  child.pid_ = pid;
  child.in_fd_ = plans[0].parent_fd;
  child.out_fd_ = plans[1].parent_fd;
  child.err_fd_ = plans[2].parent_fd;
  return child;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      in_fd_(std::exchange(other.in_fd_, -1)),
      out_fd_(std::exchange(other.out_fd_, -1)),
      err_fd_(std::exchange(other.err_fd_, -1)) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    if (running()) (void)Kill();
    CloseFds();
    pid_ = std::exchange(other.pid_, -1);
    in_fd_ = std::exchange(other.in_fd_, -1);
    out_fd_ = std::exchange(other.out_fd_, -1);
    err_fd_ = std::exchange(other.err_fd_, -1);
  }
  return *this;
}

ChildProcess::~ChildProcess() {
  if (running()) (void)Kill();
  CloseFds();
}

void ChildProcess::CloseFds() {
  CloseFd(&in_fd_);
  CloseFd(&out_fd_);
  CloseFd(&err_fd_);
}

void ChildProcess::CloseIn() { CloseFd(&in_fd_); }

bool ChildProcess::Exited(int* status) {
  if (!running()) {
    *status = -1;
    return true;
  }
  if (!PidExited(pid_, status)) return false;
  pid_ = -1;
  return true;
}

std::optional<int> ChildProcess::WaitExit(absl::Duration timeout) {
  int status = -1;
  // Polls waitpid (there is no waiting for a child with a deadline).
  if (!Eventually([&] { return Exited(&status); }, timeout, absl::Milliseconds(5))) {
    return std::nullopt;
  }
  return status;
}

absl::StatusOr<int> ChildProcess::Terminate(absl::Duration timeout) {
  if (!running()) return absl::FailedPreconditionError("Terminate: the child is not running");
  const pid_t pid = pid_;
  kill(pid_, SIGTERM);
  if (std::optional<int> status = WaitExit(timeout); status.has_value()) return *status;
  (void)Kill();
  return absl::DeadlineExceededError(absl::StrCat(
      "pid ", pid, " did not exit within ", absl::FormatDuration(timeout), " of SIGTERM (killed)"));
}

absl::StatusOr<int> ChildProcess::Kill(absl::Duration timeout) {
  if (!running()) return -1;
  kill(pid_, SIGKILL);
  if (std::optional<int> status = WaitExit(timeout); status.has_value()) return *status;
  return absl::DeadlineExceededError(
      absl::StrCat("pid ", pid_, " still runs ", absl::FormatDuration(timeout), " after SIGKILL"));
}

pid_t ChildProcess::Release() { return std::exchange(pid_, -1); }

std::thread StartLineReader(int fd, std::function<void(const std::string& line)> on_line,
                            std::function<void()> on_end) {
  return std::thread([fd, on_line = std::move(on_line), on_end = std::move(on_end)] {
    std::string pending;
    char buf[4096];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      pending.append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = pending.find('\n')) != std::string::npos) {
        const std::string line = pending.substr(0, nl);
        pending.erase(0, nl + 1);
        on_line(line);
      }
    }
    if (!pending.empty()) on_line(pending);
    close(fd);
    if (on_end) on_end();
  });
}

}  // namespace reshard::test_support
