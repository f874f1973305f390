// Transfer benchmarks:
//  (a) agent-to-agent throughput through the whole stack (two shard stores,
//      two UCX transports and two executors over loopback TCP) against
//      ucx_perftest tag_bw on the same transport;
//  (b) LocalCopier against memcpy with the same number of threads.
// Usage: transfer_bench [--quick] [--size-mib N]
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "agent/executor/executor.h"
#include "agent/transfer/local_copy.h"
#include "agent/transfer/ucx_transport.h"
#include "planner/layout.h"
#include "planner/planner.h"

namespace reshard::agent {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One tensor of `bytes` split over `ranks` tp ranks, all on h0 before and all
// on h1 after: every byte crosses once, in `ranks` steps.
struct Migration {
  v1::Ptc ptc;
  v1::Layout from, to;
};

Migration MakeMigration(int64_t bytes, int ranks) {
  Migration m;
  m.ptc.set_num_layers(1);
  v1::TensorSpec* t = m.ptc.add_tensors();
  t->set_name("w");
  t->set_dtype(v1::DTYPE_FLOAT32);
  t->add_shape(bytes / 4 / 1024);
  t->add_shape(1024);
  t->mutable_partition()->mutable_tp()->set_mode(v1::TP_SPLIT);
  t->mutable_partition()->mutable_pipeline()->set_mode(v1::PIPELINE_EVERY_STAGE);
  for (auto [layout, host] : {std::pair{&m.from, "h0"}, std::pair{&m.to, "h1"}}) {
    layout->mutable_config()->set_tp(ranks);
    layout->mutable_config()->set_pp(1);
    layout->mutable_config()->set_dp(1);
    layout->mutable_placement()->add_hosts(host);
    layout->mutable_placement()->set_devices_per_host(ranks);
  }
  return m;
}

struct Agent {
  std::string id;
  fs::path dir;
  std::unique_ptr<ShardStore> store;
  std::unique_ptr<UcxTransport> transport;
  std::unique_ptr<TaskExecutor> executor;
};

// Seconds for both executors to finish the migration; negative on failure.
double RunStack(int64_t bytes) {
  const int kRanks = 8;
  Migration m = MakeMigration(bytes, kRanks);
  std::vector<Agent> agents(2);
  for (int i = 0; i < 2; ++i) {
    Agent& a = agents[i];
    a.id = "h" + std::to_string(i);
    a.dir = fs::path("/dev/shm") / ("reshard-bench-" + std::to_string(getpid()) + "-" + a.id);
    fs::create_directories(a.dir);
    ShardStore::Options so;
    so.shm_dir = a.dir.string();
    so.host_id = a.id;
    so.memory_limit_bytes = bytes * 2;
    auto store = ShardStore::Open(so);
    if (!store.ok()) return -1;
    a.store = std::move(*store);
    auto t = MakeUcxTransportImpl(UcxOptions{"lo", "tcp"});
    if (!t.ok()) {
      std::fprintf(stderr, "ucx: %s\n", t.status().ToString().c_str());
      return -1;
    }
    a.transport = std::move(*t);
    a.executor =
        std::make_unique<TaskExecutor>(a.store.get(), a.transport.get(), TaskExecutor::Options{});
  }
  for (int r = 0; r < kRanks; ++r) {
    auto b = agents[0].store->CreateAll({{"bench", 1, r}}, {RankItemBytes(m.ptc, m.from, r)});
    if (!b.ok()) return -1;
    std::memset((*b)[0]->data(), r + 1, (*b)[0]->size());  // touch every page
  }
  auto plan = planner::PlanTransfer(m.ptc, m.from, m.to, {});
  if (!plan.ok()) return -1;
  v1::HostTask task;
  task.set_operation_id("bench-op");
  task.set_job_id("bench");
  task.set_from_generation(1);
  task.set_to_generation(2);
  *task.mutable_ptc() = m.ptc;
  *task.mutable_plan() = *plan;
  for (auto& a : agents) {
    auto* p = task.add_peers();
    p->set_host_id(a.id);
    p->set_ucx_address(a.transport->LocalAddress());
  }
  const auto start = Clock::now();
  std::vector<std::future<absl::Status>> runs;
  for (auto& a : agents) {
    runs.push_back(std::async(std::launch::async, [&a, &task] {
      return a.executor->Execute(a.id, task, nullptr, nullptr).status();
    }));
  }
  bool ok = true;
  for (auto& r : runs) {
    absl::Status s = r.get();
    if (!s.ok()) {
      std::fprintf(stderr, "execute: %s\n", s.ToString().c_str());
      ok = false;
    }
  }
  const double secs = Seconds(start, Clock::now());
  for (auto& a : agents) {
    a.transport->Shutdown();
    a.executor.reset();
    a.store.reset();
    std::error_code ec;
    fs::remove_all(a.dir, ec);
  }
  return ok ? secs : -1;
}

int FreePort() {
  // A port from the ephemeral range the kernel has not handed out recently.
  return 20000 + static_cast<int>(getpid() % 20000);
}

pid_t Spawn(const std::vector<std::string>& args, const std::string& out) {
  std::fflush(stdout);  // or the child repeats our buffered output
  pid_t pid = fork();
  if (pid == 0) {
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TLS", "tcp", 1);
    FILE* f = std::freopen(out.c_str(), "w", stdout);
    (void)f;
    dup2(STDOUT_FILENO, STDERR_FILENO);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// ucx_perftest tag_bw bandwidth in MiB/s (its "MB/s"), or negative.
double RunPerftest(int64_t message, int64_t iters, std::string* why) {
  const std::string port = std::to_string(FreePort());
  const std::string srv_log = "/tmp/transfer_bench_srv_" + std::to_string(getpid()) + ".log";
  const std::string cli_log = "/tmp/transfer_bench_cli_" + std::to_string(getpid()) + ".log";
  pid_t server = Spawn({"ucx_perftest", "-p", port}, srv_log);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  pid_t client = Spawn({"ucx_perftest", "127.0.0.1", "-p", port, "-t", "tag_bw", "-s",
                        std::to_string(message), "-n", std::to_string(iters)},
                       cli_log);
  int status = 0;
  waitpid(client, &status, 0);
  kill(server, SIGTERM);
  waitpid(server, nullptr, 0);
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
    *why = "ucx_perftest exit status " + std::to_string(WEXITSTATUS(status)) + ", see " + cli_log;
  std::remove(srv_log.c_str());
  if (bw >= 0) std::remove(cli_log.c_str());
  return bw;
}

void BenchStack(bool quick, int64_t only_size) {
  std::printf(
      "(a) agent to agent over UCX tcp/lo (8 steps per size, whole Execute incl. "
      "buffer creation and checksums)\n");
  std::printf("%10s %14s %18s %8s\n", "size", "stack MiB/s", "ucx_perftest MiB/s", "ratio");
  std::vector<int64_t> sizes;
  if (only_size > 0) {
    sizes = {only_size};
  } else if (quick) {
    sizes = {int64_t{64} << 20};
  } else {
    sizes = {int64_t{1} << 30, int64_t{2} << 30, int64_t{4} << 30};
  }
  for (int64_t size : sizes) {
    RunStack(int64_t{16} << 20);  // warm-up
    const double secs = RunStack(size);
    const double ours = secs > 0 ? size / kMiB / secs : -1;
    std::string why;
    const int64_t message = size / 8;
    const double theirs = RunPerftest(message, std::max<int64_t>(8, size / message), &why);
    char label[32];
    std::snprintf(label, sizeof label, "%lld MiB", static_cast<long long>(size >> 20));
    if (theirs > 0) {
      std::printf("%10s %14.0f %18.0f %7.2fx\n", label, ours, theirs, ours / theirs);
    } else {
      std::printf("%10s %14.0f %18s %8s   (%s)\n", label, ours, "failed", "-", why.c_str());
    }
    std::fflush(stdout);
  }
}

double Best(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto a = Clock::now();
    fn();
    best = std::min(best, Seconds(a, Clock::now()));
  }
  return best;
}

void BenchLocal(bool quick) {
  const int64_t bytes = quick ? int64_t{64} << 20 : int64_t{512} << 20;
  const int reps = quick ? 3 : 5;
  std::vector<uint8_t> src(bytes * 2, 1), dst(bytes * 2, 0);
  const int64_t cols = 4096;  // 16 KiB rows of float32
  const int64_t rows = bytes / 4 / cols;
  std::printf("\n(b) local copies, %lld MiB per copy (GiB/s; ratio vs memcpy on as many threads)\n",
              static_cast<long long>(bytes >> 20));
  std::printf("%8s %10s %12s %7s %14s %7s %12s\n", "threads", "memcpy", "contiguous", "ratio",
              "strided(8KiB)", "ratio", "fan-out x2");
  for (int threads : {1, 2, 4}) {
    const double mc = Best(reps, [&] {
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
          const int64_t a = bytes * t / threads, b = bytes * (t + 1) / threads;
          std::memcpy(dst.data() + a, src.data() + a, b - a);
        });
      }
      for (auto& t : ts) t.join();
    });
    LocalCopier copier(threads);
    const std::vector<int64_t> shape = {rows, cols};
    const double contiguous = Best(reps, [&] {
      copier.Copy(StridedView{src.data(), 0, {cols, 1}}, {{dst.data(), 0, {cols, 1}}}, shape, 4);
    });
    // Half of each 2x-wide row: 8 KiB runs.
    const std::vector<int64_t> half = {rows, cols / 2};
    const double strided = Best(reps, [&] {
      copier.Pack(StridedView{src.data(), 0, {cols, 1}}, half, 4, dst.data());
    });
    const double fan = Best(reps, [&] {
      copier.Unpack(src.data(), {{dst.data(), 0, {cols, 1}}, {dst.data() + bytes, 0, {cols, 1}}},
                    half, 4);
    });
    const double gib = bytes / (1024.0 * kMiB);
    std::printf("%8d %10.2f %12.2f %6.2fx %14.2f %6.2fx %12.2f\n", threads, gib / mc,
                gib / contiguous, mc / contiguous, gib / 2 / strided, (mc / 2) / strided,
                gib / fan);
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace reshard::agent

int main(int argc, char** argv) {
  bool quick = false;
  int64_t only_size = 0;  // --size-mib N: part (a) at one size only
  for (int i = 1; i < argc; ++i) {
    quick |= std::strcmp(argv[i], "--quick") == 0;
    if (std::strcmp(argv[i], "--size-mib") == 0 && i + 1 < argc) {
      only_size = std::atoll(argv[++i]) << 20;
    }
  }
  setenv("UCX_NET_DEVICES", "lo", 1);
  setenv("UCX_TLS", "tcp", 1);
  reshard::agent::BenchStack(quick, only_size);
  if (only_size == 0) reshard::agent::BenchLocal(quick);
  return 0;
}
