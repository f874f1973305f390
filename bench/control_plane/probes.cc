#include "bench/control_plane/probes.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "pqxx/pqxx"
#include "tests/coordinator/harness/child_process.h"

namespace reshard::bench {
namespace {

constexpr char kStartupLine[] = "reshard-coordinator listening on ";

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorProcess>> CoordinatorProcess::Start(
    const std::string& binary, const std::string& dsn, const std::string& replica_id,
    const std::vector<std::string>& extra_flags, const std::string& log_path) {
  std::unique_ptr<CoordinatorProcess> p(new CoordinatorProcess());
  p->log_path_ = log_path;
  coordinator::testing::ChildOptions child;
  child.argv = {binary,           "serve",         "--dsn",          dsn,
                "--listen",       "127.0.0.1:0",   "--metrics-listen", "127.0.0.1:0",
                "--insecure",     "--replica-id",  replica_id};
  child.argv.insert(child.argv.end(), extra_flags.begin(), extra_flags.end());
  child.log_path = log_path;
  child.die_with_parent = true;
  std::remove(log_path.c_str());
  absl::StatusOr<pid_t> pid = coordinator::testing::SpawnChild(child);
  if (!pid.ok()) return pid.status();
  p->pid_ = *pid;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(log_path);
    for (std::string line; std::getline(in, line);) {
      const size_t at = line.find(kStartupLine);
      if (at == std::string::npos) continue;
      // "reshard-coordinator listening on H:P metrics on H:M replica ID"
      std::vector<std::string> words = absl::StrSplit(line.substr(at), ' ', absl::SkipEmpty());
      if (words.size() >= 4) {
        p->address_ = words[3];
        return p;
      }
    }
    if (absl::Status s = p->CheckRunning(); !s.ok()) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "reshard-coordinator ", replica_id, " printed no start-up line in 60 s: ", p->LogTail()));
}

CoordinatorProcess::~CoordinatorProcess() {
  if (pid_ <= 0) return;
  int status = 0;
  if (coordinator::testing::ChildExited(pid_, &status)) return;
  kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (coordinator::testing::ChildExited(pid_, &status)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid_, SIGKILL);
  coordinator::testing::WaitChild(pid_);
}

absl::Status CoordinatorProcess::CheckRunning() {
  int status = 0;
  if (pid_ > 0 && coordinator::testing::ChildExited(pid_, &status)) {
    pid_ = -1;
    return absl::InternalError(
        absl::StrCat("reshard-coordinator exited with status ", status, ": ", LogTail()));
  }
  return absl::OkStatus();
}

std::string CoordinatorProcess::LogTail() const {
  return coordinator::testing::FileTail(log_path_, 1500);
}

absl::StatusOr<ProcSample> SampleProcess(pid_t pid) {
  ProcSample sample;
  std::ifstream stat_file(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  // Fields after the command (which may hold spaces) start after its ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) {
    return absl::NotFoundError(absl::StrCat("/proc/", pid, "/stat: no such process"));
  }
  std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ');
  // f[0] is field 3 (state); utime and stime are fields 14 and 15.
  int64_t utime = 0, stime = 0;
  if (f.size() < 13 || !absl::SimpleAtoi(f[11], &utime) || !absl::SimpleAtoi(f[12], &stime)) {
    return absl::InternalError(absl::StrCat("/proc/", pid, "/stat: cannot parse \"", stat, "\""));
  }
  sample.cpu_seconds = static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(status, line);) {
    std::vector<std::string> kv = absl::StrSplit(line, absl::ByAnyChar(" \t:"), absl::SkipEmpty());
    if (kv.size() < 2) continue;
    if (kv[0] == "Threads") (void)absl::SimpleAtoi(kv[1], &sample.threads);
    if (kv[0] == "VmRSS") (void)absl::SimpleAtoi(kv[1], &sample.rss_kib);
  }
  return sample;
}

absl::StatusOr<PgSample> SamplePostgres(const std::string& dsn) {
  try {
    pqxx::connection c(dsn);
    pqxx::nontransaction tx(c);
    const pqxx::row r = tx.exec1(
        "SELECT xact_commit + xact_rollback, tup_returned + tup_fetched FROM pg_stat_database "
        "WHERE datname = current_database()");
    PgSample sample;
    sample.transactions = r[0].as<int64_t>();
    sample.rows_read = r[1].as<int64_t>();
    return sample;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("pg_stat_database: ", e.what()));
  }
}

absl::StatusOr<std::vector<std::string>> TopStatements(const std::string& dsn, int top) {
  try {
    pqxx::connection c(dsn);
    pqxx::nontransaction tx(c);
    tx.exec0("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
    std::vector<std::string> out;
    for (const pqxx::row& r : tx.exec_params(
             "SELECT calls, rows, total_exec_time, regexp_replace(query, '\\s+', ' ', 'g') "
             "FROM pg_stat_statements ORDER BY rows DESC LIMIT $1",
             top)) {
      std::string query = r[3].as<std::string>();
      if (query.size() > 160) query = query.substr(0, 157) + "...";
      out.push_back(absl::StrCat(r[0].as<int64_t>(), " calls, ", r[1].as<int64_t>(), " rows, ",
                                 static_cast<int64_t>(r[2].as<double>()), " ms: ", query));
    }
    return out;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("pg_stat_statements: ", e.what()));
  }
}

}  // namespace reshard::bench
