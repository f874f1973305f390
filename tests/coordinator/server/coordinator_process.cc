#include "tests/coordinator/server/coordinator_process.h"

#include <signal.h>

#include <cstdio>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace reshard::coordinator::testing {
namespace {

// Forks and execs the binary with stdout+stderr on one pipe.
absl::StatusOr<test_support::ChildProcess> Spawn(const std::vector<std::string>& args) {
  test_support::SpawnOptions options;
  options.argv = {CoordinatorBinary()};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.out = test_support::Stream::Pipe();
  options.err = test_support::Stream::SameAsOut();
  // A test that dies must not leave coordinators behind.
  options.die_with_parent = true;
  return test_support::ChildProcess::Spawn(options);
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
  absl::StatusOr<test_support::ChildProcess> spawned = Spawn(full);
  if (!spawned.ok()) return spawned.status();
  std::unique_ptr<CoordinatorProcess> p(new CoordinatorProcess(*std::move(spawned)));

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
  absl::StatusOr<test_support::ChildProcess> spawned = Spawn(args);
  if (!spawned.ok()) return spawned.status();
  std::unique_ptr<CoordinatorProcess> p(new CoordinatorProcess(*std::move(spawned)));
  const std::optional<int> status = p->WaitExit(timeout);
  if (!status.has_value()) {
    p->Kill();
    return absl::DeadlineExceededError(absl::StrCat("reshard-coordinator ",
                                                    absl::StrJoin(args, " "), " ran past ",
                                                    absl::FormatDuration(timeout)));
  }
  return *status;
}

CoordinatorProcess::CoordinatorProcess(test_support::ChildProcess child)
    : child_(std::move(child)), pid_(child_.pid()) {
  reader_ = test_support::StartLineReader(
      child_.TakeOutFd(), [this](const std::string& line) { OnLine(line); },
      [this] {
        std::lock_guard<std::mutex> lock(mu_);
        output_closed_ = true;
        cv_.notify_all();
      });
}

void CoordinatorProcess::OnLine(const std::string& line) {
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

std::optional<int> CoordinatorProcess::WaitExit(absl::Duration timeout) {
  if (!child_.running()) return exit_status_;
  const std::optional<int> status = child_.WaitExit(timeout);
  if (!status.has_value()) return std::nullopt;
  exit_status_ = *status;
  if (reader_.joinable()) reader_.join();
  return status;
}

void CoordinatorProcess::Kill() {
  if (child_.running()) {
    absl::StatusOr<int> status = child_.Kill();
    if (status.ok()) exit_status_ = *status;
  }
  if (reader_.joinable()) reader_.join();
}

absl::StatusOr<int> CoordinatorProcess::Terminate(absl::Duration timeout) {
  if (!child_.running()) return absl::FailedPreconditionError("already exited");
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
