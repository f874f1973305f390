#include "tests/coordinator/harness/child_process.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace reshard::coordinator::testing {
namespace {

int ExitStatus(int raw) {
  if (WIFEXITED(raw)) return WEXITSTATUS(raw);
  if (WIFSIGNALED(raw)) return 128 + WTERMSIG(raw);
  return -1;
}

}  // namespace

absl::StatusOr<pid_t> SpawnChild(const ChildOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("SpawnChild: empty argv");
  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls.
  std::vector<char*> argv;
  for (const std::string& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const char* log_path = options.log_path.empty() ? "/dev/null" : options.log_path.c_str();
  const char* cwd = options.cwd.empty() ? nullptr : options.cwd.c_str();
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    if (options.switch_user) {
      if (setgroups(0, nullptr) != 0 || setgid(options.gid) != 0 || setuid(options.uid) != 0) {
        _exit(126);
      }
    }
    // After the credential change, which clears the parent-death signal.
    if (options.die_with_parent) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(125);
    }
    if (cwd != nullptr && chdir(cwd) != 0) _exit(124);
    const int null_fd = open("/dev/null", O_RDONLY);
    const int log_fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (null_fd < 0 || log_fd < 0) _exit(123);
    dup2(null_fd, 0);
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

int WaitChild(pid_t pid) {
  int raw = 0;
  while (waitpid(pid, &raw, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return ExitStatus(raw);
}

bool ChildExited(pid_t pid, int* status) {
  int raw = 0;
  const pid_t r = waitpid(pid, &raw, WNOHANG);
  if (r == pid) {
    *status = ExitStatus(raw);
    return true;
  }
  if (r < 0 && errno == ECHILD) {
    *status = -1;
    return true;
  }
  return false;
}

absl::Status RunChild(const ChildOptions& options) {
  absl::StatusOr<pid_t> pid = SpawnChild(options);
  if (!pid.ok()) return pid.status();
  const int status = WaitChild(*pid);
  if (status == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("`", absl::StrJoin(options.argv, " "),
                                                    "` exited with status ", status, ":\n",
                                                    FileTail(options.log_path)));
}

std::string FileTail(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  return all.size() <= max_bytes ? all : all.substr(all.size() - max_bytes);
}

}  // namespace reshard::coordinator::testing
