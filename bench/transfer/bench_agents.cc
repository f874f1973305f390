#include "bench/transfer/bench_agents.h"

#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include "planner/layout.h"
#include "tests/support/process.h"
#include "tests/support/wait.h"

namespace reshard::agent::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int NextPort() {
  // A different port per run: a server of the previous run may linger.
  static int calls = 0;
  return 20000 + static_cast<int>((getpid() * 13 + 101 * calls++) % 20000);
}

std::string& ShmRoot() {
  static std::string dir = "/dev/shm";
  return dir;
}

std::string& Transports() {
  static std::string tls = "tcp";
  return tls;
}

bool& Listen() {
  static bool listen = true;
  return listen;
}

UcxOptions BenchUcxOptions() {
  UcxOptions o{"lo", Transports()};
  o.listen = Listen();
  return o;
}

// ucx_perftest with the bench's UCX settings, its stdout and stderr to `out`.
absl::StatusOr<test_support::ChildProcess> SpawnPerftest(const std::vector<std::string>& args,
                                                         const std::string& out) {
  std::fflush(stdout);
  test_support::SpawnOptions o;
  o.argv = args;
  o.env = {{"UCX_NET_DEVICES", "lo"}, {"UCX_TLS", Transports()}};
  o.out = test_support::Stream::File(out, /*append=*/false);
  o.err = test_support::Stream::SameAsOut();
  return test_support::ChildProcess::Spawn(o);
}

// Whether a TCP socket listens on `port` (/proc/net/tcp and tcp6), read
// without connecting: ucx_perftest's server takes one connection only.
bool PortListening(int port) {
  char want[8];
  std::snprintf(want, sizeof want, ":%04X", port);
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    FILE* f = std::fopen(table, "r");
    if (f == nullptr) continue;
    char line[512];
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f)) {
      char local[128], remote[128], state[8];
      if (std::sscanf(line, "%*d: %127s %127s %7s", local, remote, state) != 3) continue;
      const char* colon = std::strrchr(local, ':');
      found = colon != nullptr && std::strcmp(colon, want) == 0 && std::strcmp(state, "0A") == 0;
    }
    std::fclose(f);
    if (found) return true;
  }
  return false;
}

}  // namespace

void SetUcxTransports(const std::string& tls) { Transports() = tls; }
void SetUcxListen(bool listen) { Listen() = listen; }
void SetShmRoot(const std::string& dir) { ShmRoot() = dir; }

std::vector<Agent> MakeAgents(int n, int64_t memory_limit_bytes, int64_t spare_bytes) {
  std::vector<Agent> agents(n);
  for (int i = 0; i < n; ++i) {
    Agent& a = agents[i];
    a.id = "h" + std::to_string(i);
    a.dir = fs::path(ShmRoot()) / ("reshard-bench-" + std::to_string(getpid()) + "-" + a.id);
    fs::create_directories(a.dir);
    ShardStore::Options so;
    so.shm_dir = a.dir.string();
    so.host_id = a.id;
    so.memory_limit_bytes = memory_limit_bytes;
    so.spare_bytes = spare_bytes;
    auto store = ShardStore::Open(so);
    if (!store.ok()) {
      std::fprintf(stderr, "store: %s\n", store.status().ToString().c_str());
      std::exit(1);
    }
    a.store = std::move(*store);
    auto t = MakeUcxTransportImpl(BenchUcxOptions());
    if (!t.ok()) {
      std::fprintf(stderr, "ucx: %s\n", t.status().ToString().c_str());
      std::exit(1);
    }
    a.transport = std::move(*t);
    a.executor =
        std::make_unique<TaskExecutor>(a.store.get(), a.transport.get(), TaskExecutor::Options{});
  }
  return agents;
}

bool WaitForSpares(std::vector<Agent>* agents) {
  bool ok = true;
  for (Agent& a : *agents) ok &= a.store->WaitForSpares(60);
  std::this_thread::sleep_for(std::chrono::duration<double>(kSettleSeconds));
  return ok;
}

void DropAgents(std::vector<Agent>* agents) {
  for (Agent& a : *agents) {
    a.transport->Shutdown();
    a.executor.reset();
    a.store.reset();
    std::error_code ec;
    fs::remove_all(a.dir, ec);
  }
  agents->clear();
}

bool FillRanks(std::vector<Agent>* agents, const std::string& job, const v1::Ptc& ptc,
               const v1::Layout& layout, int64_t generation) {
  const std::vector<v1::DeviceSlot> slots = planner::ExpandPlacement(layout.placement());
  const std::vector<std::vector<int64_t>> item_bytes = AllRankItemBytes(ptc, layout);
  for (int r = 0; r < static_cast<int>(slots.size()); ++r) {
    Agent* owner = nullptr;
    for (Agent& a : *agents) {
      if (a.id == slots[r].host()) owner = &a;
    }
    if (owner == nullptr) return false;
    auto b = owner->store->CreateAll({{job, generation, r}}, {item_bytes[r]});
    if (!b.ok()) {
      std::fprintf(stderr, "fill: %s\n", b.status().ToString().c_str());
      return false;
    }
    std::memset((*b)[0]->data(), r + 1, (*b)[0]->size());
    // Tasks read sealed sources only.
    if (auto sealed = owner->store->Seal({job, generation, r}, {}); !sealed.ok()) {
      std::fprintf(stderr, "seal: %s\n", sealed.status().ToString().c_str());
      return false;
    }
  }
  return true;
}

v1::HostTask MakeTask(const std::vector<Agent>& agents, const std::string& job, const v1::Ptc& ptc,
                      const v1::TransferPlan& plan, const std::string& transfer_secret) {
  v1::HostTask task;
  task.set_transfer_secret(transfer_secret);
  task.set_operation_id(job + "-op");
  task.set_job_id(job);
  task.set_from_generation(1);
  task.set_to_generation(2);
  *task.mutable_ptc() = ptc;
  *task.mutable_plan() = plan;
  for (const Agent& a : agents) {
    auto* p = task.add_peers();
    p->set_host_id(a.id);
    p->set_ucx_address(a.transport->LocalAddress());
  }
  return task;
}

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto secs = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return secs(u.ru_utime) + secs(u.ru_stime);
}

// perf's control FIFOs (`perf record --delay=-1 --control fifo:CTL,ACK`) named
// by $RESHARD_PERF_CONTROL="CTL,ACK": the timed Executes are profiled and
// nothing else (setup, fills, spare pools); usage in transfer_bench.cc.
void PerfControl(const char* command) {
  const char* env = std::getenv("RESHARD_PERF_CONTROL");
  if (env == nullptr || *env == '\0') return;
  const std::string both = env;
  const size_t comma = both.find(',');
  const std::string ctl = both.substr(0, comma);
  if (FILE* f = std::fopen(ctl.c_str(), "w")) {
    std::fprintf(f, "%s\n", command);
    std::fclose(f);
  }
  if (comma == std::string::npos) return;
  if (FILE* f = std::fopen(both.substr(comma + 1).c_str(), "r")) {
    char ack[16];
    (void)std::fgets(ack, sizeof ack, f);  // perf answers "ack" once it is done
    std::fclose(f);
  }
}

double RunTask(std::vector<Agent>* agents, const v1::HostTask& task, std::vector<AgentTimes>* times,
               bool cancel, double* cpu_seconds) {
  times->assign(agents->size(), AgentTimes{});
  PerfControl("enable");
  const double cpu_start = ProcessCpuSeconds();
  const auto start = Clock::now();
  std::vector<std::future<absl::Status>> runs;
  for (size_t i = 0; i < agents->size(); ++i) {
    Agent& a = (*agents)[i];
    AgentTimes* t = &(*times)[i];
    runs.push_back(std::async(std::launch::async, [&a, &task, t, start, cancel] {
      bool first = true;
      auto progress = [&](int64_t done, int64_t total) {
        const double now = Seconds(start, Clock::now());
        if (first) t->created = now;
        first = false;
        t->written = total;
        if (done == total && t->moved == 0) t->moved = now;
      };
      absl::Status s =
          a.executor->Execute(a.id, task, progress, [cancel] { return cancel; }).status();
      t->sealed = Seconds(start, Clock::now());
      return s;
    }));
  }
  bool ok = true;
  for (auto& r : runs) {
    absl::Status s = r.get();
    if (!s.ok()) {
      std::fprintf(stderr, "execute on %s: %s\n", (*agents)[&r - runs.data()].id.c_str(),
                   s.ToString().c_str());
      ok = false;
    }
  }
  const double secs = Seconds(start, Clock::now());
  if (cpu_seconds != nullptr) *cpu_seconds = ProcessCpuSeconds() - cpu_start;
  PerfControl("disable");
  return ok ? secs : -1;
}

double PerftestMiBps(int64_t message, int64_t iters, std::string* why) {
  const int port_number = NextPort();
  const std::string port = std::to_string(port_number);
  const std::string srv_log = "/tmp/transfer_bench_srv_" + std::to_string(getpid()) + ".log";
  const std::string cli_log = "/tmp/transfer_bench_cli_" + std::to_string(getpid()) + ".log";
  absl::StatusOr<test_support::ChildProcess> server =
      SpawnPerftest({"ucx_perftest", "-p", port}, srv_log);
  if (!server.ok()) {
    *why = server.status().ToString();
    return -1;
  }
  // The client connects once: start it when the server listens.
  int server_status = 0;
  const bool listening = test_support::Eventually(
      [&] { return PortListening(port_number) || server->Exited(&server_status); },
      absl::Seconds(30), absl::Milliseconds(5));
  if (!listening || !server->running()) {
    *why = "ucx_perftest server did not listen on port " + port + ", see " + srv_log;
    return -1;
  }
  absl::StatusOr<test_support::ChildProcess> client =
      SpawnPerftest({"ucx_perftest", "127.0.0.1", "-p", port, "-t", "tag_bw", "-s",
                     std::to_string(message), "-n", std::to_string(iters)},
                    cli_log);
  if (!client.ok()) {
    *why = client.status().ToString();
    return -1;
  }
  const int status = test_support::WaitPid(client->Release());
  (void)server->Terminate(absl::Seconds(10));
  double bw = -1;
  if (FILE* f = std::fopen(cli_log.c_str(), "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
      if (std::strncmp(line, "Final:", 6) != 0) continue;
      double v[8];
      if (std::sscanf(line + 6, "%lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4],
                      &v[5]) == 6) {
        bw = v[5];  // overall bandwidth
      }
    }
    std::fclose(f);
  }
  if (bw < 0)
    *why = "ucx_perftest exit status " + std::to_string(status) + ", see " + cli_log;
  std::remove(srv_log.c_str());
  if (bw >= 0) std::remove(cli_log.c_str());
  return bw;
}

double BareTransportMiBps(int64_t total, int64_t message) {
  auto a = MakeUcxTransportImpl(BenchUcxOptions());
  auto b = MakeUcxTransportImpl(BenchUcxOptions());
  if (!a.ok() || !b.ok()) return -1;
  if (!(*a)->Connect("b", (*b)->LocalAddress()).ok()) return -1;
  std::vector<uint8_t> src(total, 7), dst(total, 0);  // warm: every page touched
  const int64_t n = total / message;
  double best = -1;
  for (int rep = 0; rep < 2; ++rep) {
    std::mutex mu;
    std::condition_variable cv;
    int64_t left = n;
    bool failed = false;
    auto done = [&](absl::Status s) {
      std::lock_guard<std::mutex> l(mu);
      failed |= !s.ok();
      if (--left == 0) cv.notify_all();
    };
    const auto start = Clock::now();
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t tag = uint64_t{1} << 40 | static_cast<uint64_t>(rep) << 32 | i;
      (*b)->Receive(tag, dst.data() + i * message, message, done);
      (*a)->Send("b", tag, src.data() + i * message, message, [](absl::Status) {});
    }
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return left == 0; });
    if (failed) return -1;
    best = std::max(best, n * message / kMiB / Seconds(start, Clock::now()));
  }
  (*a)->Shutdown();
  (*b)->Shutdown();
  return best;
}

}  // namespace reshard::agent::bench
