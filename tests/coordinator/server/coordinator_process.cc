#include "tests/coordinator/server/coordinator_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace reshard::coordinator::testing {
namespace {

int ExitStatus(int wstatus) {
  if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
  return -1;
}

// Forks and execs the binary with stdout+stderr on a pipe; returns the pid
// and the pipe's read end.
absl::StatusOr<std::pair<pid_t, int>> Spawn(const std::vector<std::string>& args) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", errno));
  std::vector<std::string> argv_s = {CoordinatorBinary()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    // A test that dies must not leave coordinators behind.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  return std::make_pair(pid, fds[0]);
}

}  // namespace

std::string CoordinatorBinary() { return RESHARD_COORDINATOR_BIN; }

std::optional<StartupLine> ParseStartupLine(const std::string& line) {
  // reshard-coordinator listening on HOST:PORT metrics on HOST:PORT replica ID
  const std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (words.size() != 9 || words[0] != "reshard-coordinator" || words[1] != "listening" ||
      words[2] != "on" || words[4] != "metrics" || words[5] != "on" || words[7] != "replica") {
    return std::nullopt;
  }
  auto port_of = [](const std::string& address, int* port) {
    const size_t colon = address.rfind(':');
    return colon != std::string::npos && absl::SimpleAtoi(address.substr(colon + 1), port) &&
           *port > 0;
  };
  StartupLine out;
  if (!port_of(words[3], &out.port) || !port_of(words[6], &out.metrics_port)) {
    return std::nullopt;
  }
  out.replica_id = words[8];
  return out;
}

absl::StatusOr<std::unique_ptr<CoordinatorProcess>> CoordinatorProcess::Start(
    const std::vector<std::string>& args, absl::Duration timeout) {
  std::vector<std::string> full = {"serve"};
  full.insert(full.end(), args.begin(), args.end());
  absl::StatusOr<std::pair<pid_t, int>> spawned = Spawn(full);
  if (!spawned.ok()) return spawned.status();
  std::unique_ptr<CoordinatorProcess> p(new CoordinatorProcess());
  p->pid_ = spawned->first;
  const int fd = spawned->second;
  p->reader_ = std::thread([raw = p.get(), fd] { raw->ReadOutput(fd); });

  std::unique_lock<std::mutex> lock(p->mu_);
  const bool ready = p->cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                                     [&] { return p->got_startup_ || p->output_closed_; });
  if (p->got_startup_) return p;
  lock.unlock();
  if (!ready) {
    p->Kill();
    return absl::DeadlineExceededError(absl::StrCat(
        "reshard-coordinator printed no start-up line within ", absl::FormatDuration(timeout)));
  }
  const std::optional<int> status = p->WaitExit(absl::Seconds(10));
  if (!status.has_value()) p->Kill();
  return absl::FailedPreconditionError(
      absl::StrCat("reshard-coordinator ", absl::StrJoin(args, " "), " exited with status ",
                   status.value_or(-1), " before its start-up line"));
}

absl::StatusOr<int> CoordinatorProcess::Run(const std::vector<std::string>& args,
                                            absl::Duration timeout) {
  absl::StatusOr<std::pair<pid_t, int>> spawned = Spawn(args);
  if (!spawned.ok()) return spawned.status();
  std::unique_ptr<CoordinatorProcess> p(new CoordinatorProcess());
  p->pid_ = spawned->first;
  const int fd = spawned->second;
  p->reader_ = std::thread([raw = p.get(), fd] { raw->ReadOutput(fd); });
  const std::optional<int> status = p->WaitExit(timeout);
  if (!status.has_value()) {
    p->Kill();
    return absl::DeadlineExceededError(absl::StrCat("reshard-coordinator ",
                                                    absl::StrJoin(args, " "), " ran past ",
                                                    absl::FormatDuration(timeout)));
  }
  return *status;
}

void CoordinatorProcess::ReadOutput(int fd) {
  std::string pending;
  char buf[4096];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      const std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      std::fprintf(stderr, "[coordinator %d] %s\n", static_cast<int>(pid_), line.c_str());
      if (std::optional<StartupLine> s = ParseStartupLine(line); s.has_value()) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!got_startup_) {
          startup_ = *s;
          got_startup_ = true;
          cv_.notify_all();
        }
      }
    }
  }
  if (!pending.empty()) {
    std::fprintf(stderr, "[coordinator %d] %s\n", static_cast<int>(pid_), pending.c_str());
  }
  close(fd);
  std::lock_guard<std::mutex> lock(mu_);
  output_closed_ = true;
  cv_.notify_all();
}

std::optional<int> CoordinatorProcess::WaitExit(absl::Duration timeout) {
  if (reaped_) return 0;
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int wstatus = 0;
    const pid_t r = waitpid(pid_, &wstatus, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      if (reader_.joinable()) reader_.join();
      return ExitStatus(wstatus);
    }
    if (r < 0 && errno != EINTR) {
      reaped_ = true;
      return -1;
    }
    if (absl::Now() >= deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(10));  // polling the child's exit
  }
}

void CoordinatorProcess::Kill() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    int wstatus = 0;
    while (waitpid(pid_, &wstatus, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
  }
  if (reader_.joinable()) reader_.join();
}

absl::StatusOr<int> CoordinatorProcess::Terminate(absl::Duration timeout) {
  if (reaped_) return absl::FailedPreconditionError("already exited");
  kill(pid_, SIGTERM);
  const std::optional<int> status = WaitExit(timeout);
  if (status.has_value()) return *status;
  Kill();
  return absl::DeadlineExceededError(
      absl::StrCat("no exit within ", absl::FormatDuration(timeout), " of SIGTERM"));
}

std::string CoordinatorProcess::address() const { return absl::StrCat("127.0.0.1:", port()); }

CoordinatorProcess::~CoordinatorProcess() { Kill(); }

}  // namespace reshard::coordinator::testing
