// control_plane_bench: what one reshard-coordinator costs and how fast it
// answers with many hosts and many watchers, no data plane. In one process:
// H simulated host agents (sim_hosts.h: RegisterAgent, Heartbeat every
// lease/3, a WaitForTasks long poll each; an operation is picked up and
// reported DONE without moving a byte), J small jobs resized back and forth
// between two host pairs a few at a time (resizer.h), and W WatchJob
// streams spread over the jobs (watchers.h), all over gRPC's callback API
// on a few channels, against the real `reshard-coordinator` binary (two
// replicas, child processes) and a real PostgreSQL. One table row per
// number of streams; see README.md for the columns and the targets.
//
// Exit status: 0 when every call, stream and operation went right (targets
// missed are printed, never enforced), 1 otherwise, 77 when PostgreSQL's
// binaries are missing.
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/control_plane/probes.h"
#include "bench/control_plane/resizer.h"
#include "bench/control_plane/sim_hosts.h"
#include "bench/control_plane/watchers.h"
#include "common/log.h"
#include "grpcpp/grpcpp.h"
#include "reshard/v1/coordinator.grpc.pb.h"
#include "tests/coordinator/harness/test_postgres.h"

#ifndef RESHARD_COORDINATOR_BIN
#define RESHARD_COORDINATOR_BIN "reshard-coordinator"
#endif

namespace reshard::bench {
namespace {

// The targets of issue 21.
constexpr double kPickupP99TargetMs = 50;
constexpr double kGetJobP99TargetMs = 20;
constexpr int kThreadsTarget = 100;
constexpr double kKibPerStreamTarget = 20;
constexpr double kCrossP99TargetMs = 100;
// "Flat": at most this much above the row with the fewest streams.
constexpr double kFlatRatio = 1.25;

struct Options {
  bool quick = false;
  int hosts = 10000;
  std::vector<int> streams = {0, 1000, 5000, 20000};
  int jobs = 1000;
  int in_flight = 4;
  double window_s = 10;
  double settle_s = 3;
  int channels = 64;
  int cross_watchers = 20;
  int pg_profile = 0;  // >0: print this many statements from pg_stat_statements
  std::string coordinator = RESHARD_COORDINATOR_BIN;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

std::string Ms(double v) { return v < 0 ? "-" : absl::StrFormat("%.1f", v); }

std::vector<std::shared_ptr<grpc::Channel>> Channels(const std::string& address, int n,
                                                      int first_id) {
  std::vector<std::shared_ptr<grpc::Channel>> out;
  for (int i = 0; i < n; ++i) {
    grpc::ChannelArguments args;
    // A distinct argument gives each channel its own connection.
    args.SetInt("reshard.bench.channel", first_id + i);
    args.SetMaxReceiveMessageSize(64 << 20);
    out.push_back(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  }
  return out;
}

struct Row {
  int streams = 0;
  std::string note;  // why the row is incomplete
  bool measured = false;
  double window_s = 0;
  double xacts_per_s = 0, rows_per_s = 0;
  double cpu_pct = 0;
  double bench_cpu_pct = 0;  // this process (the simulated agents and watchers)
  int threads = 0;
  int64_t rss_kib = 0;
  double kib_per_stream = -1;
  std::vector<double> getjob_ms;
  int64_t getjob_errors = 0;
  double events_per_s = 0;
  Resizer::RowFigures ops;
};

// GetJob of random jobs, one call every 20 ms, from a thread until stopped.
class GetJobProbe {
 public:
  GetJobProbe(v1::CoordinatorService::Stub* stub, const std::vector<std::string>& jobs)
      : thread_([this, stub, &jobs] {
          std::mt19937 rng(1);
          while (!stop_.load()) {
            v1::GetJobRequest request;
            request.set_job_id(jobs[rng() % jobs.size()]);
            v1::Job job;
            grpc::ClientContext context;
            context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
            const auto t0 = Clock::now();
            const grpc::Status s = stub->GetJob(&context, request, &job);
            ms_.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
            if (!s.ok()) {
              ++errors_;
              if (first_error_.empty()) {
                first_error_ = absl::StrCat("GetJob: ", s.error_code(), " ", s.error_message());
              }
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
        }) {}
  // Stops and joins; the figures are readable afterwards.
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  ~GetJobProbe() { Stop(); }
  const std::vector<double>& ms() const { return ms_; }
  int64_t errors() const { return errors_; }
  const std::string& first_error() const { return first_error_; }

 private:
  std::atomic<bool> stop_{false};
  std::vector<double> ms_;
  int64_t errors_ = 0;
  std::string first_error_;
  std::thread thread_;
};

// CPU seconds this process has used (the simulated side's cost, to tell a
// saturated benchmark from a saturated coordinator).
double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

void RaiseFdLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  const rlim_t before = lim.rlim_cur;
  lim.rlim_cur = lim.rlim_max;
  if (before != lim.rlim_max && setrlimit(RLIMIT_NOFILE, &lim) == 0) {
    std::printf("setrlimit: RLIMIT_NOFILE raised from %llu to %llu (the coordinators inherit it)\n",
                static_cast<unsigned long long>(before),
                static_cast<unsigned long long>(lim.rlim_max));
  }
}

void PrintTable(const Options& opt, const std::vector<Row>& rows, double cross_p50,
                double cross_p99, size_t cross_n) {
  std::printf(
      "\n| streams | hosts | PG xact/s | PG rows read/s | coord CPU | bench CPU | threads | "
      "RSS MiB | "
      "KiB/stream | pickup p50 / p99 ms (n, by heartbeat) | GetJob p99 ms (n) | events/s | "
      "ops committed / created |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    if (!r.measured) {
      std::printf("| %d | %d | not measured: %s ||||||||||| |\n", r.streams, opt.hosts,
                  r.note.c_str());
      continue;
    }
    std::printf("| %d | %d | %.0f | %.0f | %.0f %% | %.0f %% | %d | %.1f | %s | "
                "%s / %s (%zu, %d) | %s (%zu) | "
                "%.0f | %d / %d |\n",
                r.streams, opt.hosts, r.xacts_per_s, r.rows_per_s, r.cpu_pct, r.bench_cpu_pct,
                r.threads,
                r.rss_kib / 1024.0,
                r.kib_per_stream < 0 ? "-" : absl::StrFormat("%.1f", r.kib_per_stream).c_str(),
                Ms(Percentile(r.ops.pickup_ms, 0.5)).c_str(),
                Ms(Percentile(r.ops.pickup_ms, 0.99)).c_str(), r.ops.pickup_ms.size(),
                r.ops.picked_by_heartbeat, Ms(Percentile(r.getjob_ms, 0.99)).c_str(),
                r.getjob_ms.size(), r.events_per_s, r.ops.committed, r.ops.created);
  }
  std::printf("\ncross-replica (Resize answered by replica A -> a WatchJob stream on replica B "
              "names the operation): p50 %s ms, p99 %s ms over %zu operations\n",
              Ms(cross_p50).c_str(), Ms(cross_p99).c_str(), cross_n);

  std::printf("\ntargets (issue 21):\n");
  const Row* base = nullptr;
  for (const Row& r : rows) {
    if (r.measured && (base == nullptr || r.streams < base->streams)) base = &r;
  }
  auto verdict = [](bool met) { return met ? "met" : "MISSED"; };
  for (const Row& r : rows) {
    if (!r.measured) continue;
    std::printf("  %d streams:", r.streams);
    if (base != nullptr && &r != base) {
      // Flat: transactions and rows read within kFlatRatio of the row with
      // the fewest streams, at (nearly) the same operation rate; a
      // coordinator too busy to run the operations reads less, not "flat".
      const double ops = r.ops.committed / r.window_s;
      const double base_ops = base->ops.committed / base->window_s;
      const bool kept_up = ops >= 0.75 * base_ops;
      const bool flat = kept_up && r.xacts_per_s <= kFlatRatio * base->xacts_per_s + 20 &&
                        r.rows_per_s <= kFlatRatio * base->rows_per_s + 1000;
      std::printf(" PG load flat (<= %.2fx the %d-stream row's %.0f xact/s, %.0f rows/s): %.0f, "
                  "%.0f %s%s;",
                  kFlatRatio, base->streams, base->xacts_per_s, base->rows_per_s, r.xacts_per_s,
                  r.rows_per_s, verdict(flat),
                  kept_up ? ""
                          : absl::StrFormat(" (saturated: operations/s %.1f, %.1f without streams)",
                                            ops, base_ops)
                                .c_str());
    }
    const double pickup = Percentile(r.ops.pickup_ms, 0.99);
    const double getjob = Percentile(r.getjob_ms, 0.99);
    std::printf(" pickup p99 <= %.0f ms: %s %s;", kPickupP99TargetMs, Ms(pickup).c_str(),
                pickup < 0 ? "no sample" : verdict(pickup <= kPickupP99TargetMs));
    std::printf(" GetJob p99 <= %.0f ms: %s %s;", kGetJobP99TargetMs, Ms(getjob).c_str(),
                getjob < 0 ? "no sample" : verdict(getjob <= kGetJobP99TargetMs));
    std::printf(" threads <= %d: %d %s;", kThreadsTarget, r.threads,
                verdict(r.threads <= kThreadsTarget));
    if (r.kib_per_stream >= 0) {
      std::printf(" <= %.0f KiB/stream: %.1f %s;", kKibPerStreamTarget, r.kib_per_stream,
                  verdict(r.kib_per_stream <= kKibPerStreamTarget));
    }
    std::printf("\n");
  }
  std::printf("  cross-replica p99 <= %.0f ms: %s %s\n", kCrossP99TargetMs, Ms(cross_p99).c_str(),
              cross_p99 < 0 ? "no sample" : verdict(cross_p99 <= kCrossP99TargetMs));
}

int Run(const Options& opt) {
  SetMinLogSeverity(LogSeverity::kWarning);
  RaiseFdLimit();
  coordinator::testing::TestPostgres::Options pg_options;
  if (opt.pg_profile > 0) {
    pg_options.settings.push_back("shared_preload_libraries=pg_stat_statements");
  }
  absl::StatusOr<std::unique_ptr<coordinator::testing::TestPostgres>> pg =
      coordinator::testing::TestPostgres::Start(pg_options);
  if (!pg.ok()) {
    std::fprintf(stderr, "control_plane_bench: PostgreSQL: %s\n", pg.status().ToString().c_str());
    return absl::IsNotFound(pg.status()) ? 77 : 1;
  }
  char dir_template[] = "/tmp/control_plane_bench.XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) {
    std::fprintf(stderr, "control_plane_bench: mkdtemp failed\n");
    return 1;
  }
  // The sum over the rows, not the largest: a replica may free the slots of
  // a row's cancelled streams only after the next row opened its own.
  int all_streams = 0;
  for (int n : opt.streams) all_streams += n;
  const int stream_limit = std::max(128, all_streams + opt.cross_watchers + 16);
  // Every flag beyond `serve --dsn --listen --metrics-listen --insecure
  // --replica-id`: the watch limits, raised so that the rows' streams fit
  // (--max-rpc-threads stays 0, no cap).
  const std::vector<std::string> flags = {
      "--max-watch-streams", absl::StrCat(stream_limit), "--max-watch-streams-per-identity",
      absl::StrCat(stream_limit)};
  std::printf("control_plane_bench: %d hosts, %d jobs (%d operations in flight), streams {%s}, "
              "%.0f s windows, %d channels, %d cross-replica watchers\n",
              opt.hosts, opt.jobs, opt.in_flight, absl::StrJoin(opt.streams, ", ").c_str(),
              opt.window_s, opt.channels, opt.cross_watchers);
  std::printf("coordinator: %s serve --dsn <test PostgreSQL> --listen 127.0.0.1:0 "
              "--metrics-listen 127.0.0.1:0 --insecure --replica-id cp-a|cp-b %s "
              "(all else default); logs in %s\n",
              opt.coordinator.c_str(), absl::StrJoin(flags, " ").c_str(), dir);
  std::fflush(stdout);
  absl::StatusOr<std::unique_ptr<CoordinatorProcess>> a = CoordinatorProcess::Start(
      opt.coordinator, (*pg)->dsn(), "cp-a", flags, absl::StrCat(dir, "/cp-a.log"));
  if (!a.ok()) {
    std::fprintf(stderr, "control_plane_bench: replica A: %s\n", a.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<CoordinatorProcess>> b = CoordinatorProcess::Start(
      opt.coordinator, (*pg)->dsn(), "cp-b", flags, absl::StrCat(dir, "/cp-b.log"));
  if (!b.ok()) {
    std::fprintf(stderr, "control_plane_bench: replica B: %s\n", b.status().ToString().c_str());
    return 1;
  }

  const auto agent_channels = Channels((*a)->address(), opt.channels, 0);
  const auto client_channel = Channels((*a)->address(), 2, opt.channels);
  const auto b_channels = Channels((*b)->address(), 2, opt.channels + 2);
  std::vector<std::unique_ptr<v1::CoordinatorService::Stub>> owned_stubs;
  std::vector<v1::CoordinatorService::Stub*> a_stubs, b_stubs;
  for (const auto& c : agent_channels) {
    owned_stubs.push_back(v1::CoordinatorService::NewStub(c));
    a_stubs.push_back(owned_stubs.back().get());
  }
  for (const auto& c : b_channels) {
    owned_stubs.push_back(v1::CoordinatorService::NewStub(c));
    b_stubs.push_back(owned_stubs.back().get());
  }
  // Connected before the first call: a connect failing under the burst of
  // registrations is not what the rows measure.
  for (const auto* set : {&agent_channels, &client_channel, &b_channels}) {
    for (const auto& c : *set) {
      if (!c->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30))) {
        std::fprintf(stderr, "control_plane_bench: a channel did not connect in 30 s\n");
        return 1;
      }
    }
  }
  auto resize_stub = v1::CoordinatorService::NewStub(client_channel[0]);
  auto probe_stub = v1::CoordinatorService::NewStub(client_channel[1]);

  std::vector<std::string> failures;
  Timer timer;
  Resizer resizer(resize_stub.get(), opt.jobs, opt.hosts, opt.in_flight);
  SimHosts hosts(agent_channels, opt.hosts, &timer,
                 [&resizer](const std::string& op, const std::string& host, Clock::time_point t,
                            bool by_poll) { resizer.Picked(op, host, t, by_poll); });
  WatchSet cross(b_stubs, [&resizer](const v1::Job& job, Clock::time_point t) {
    resizer.CrossSeen(job, t);
  });
  std::vector<Row> rows;
  const auto setup_start = Clock::now();
  if (absl::Status s = hosts.Start(std::chrono::milliseconds(60000 + 20 * opt.hosts)); !s.ok()) {
    failures.push_back(absl::StrCat("registering hosts: ", s.ToString()));
  } else if (s = resizer.RegisterJobs(); !s.ok()) {
    failures.push_back(absl::StrCat("registering jobs: ", s.ToString()));
  } else {
    std::vector<std::string> cross_jobs = resizer.job_ids();
    cross_jobs.resize(std::min<size_t>(cross_jobs.size(), opt.cross_watchers));
    if (s = cross.Open(cross_jobs, opt.cross_watchers, std::chrono::seconds(30)); !s.ok()) {
      failures.push_back(absl::StrCat("cross-replica watchers on replica B: ", s.ToString()));
    }
  }
  std::printf("setup: %d hosts (lease %lld ms, heartbeat every %lld ms) and %d jobs in %.1f s\n",
              opt.hosts, static_cast<long long>(hosts.lease_ms()),
              static_cast<long long>(hosts.lease_ms() / 3), opt.jobs,
              std::chrono::duration<double>(Clock::now() - setup_start).count());
  std::fflush(stdout);
  absl::StatusOr<ProcSample> base = SampleProcess((*a)->pid());
  if (failures.empty()) resizer.Start();
  for (size_t r = 0; r < opt.streams.size() && failures.empty(); ++r) {
    Row row;
    row.streams = opt.streams[r];
    WatchSet watch(a_stubs);
    const auto open_start = Clock::now();
    if (absl::Status s = watch.Open(resizer.job_ids(), row.streams,
                                    std::chrono::milliseconds(30000 + 5 * row.streams));
        !s.ok()) {
      row.note = absl::StrCat("opening ", row.streams, " streams: ", s.ToString());
      failures.push_back(row.note);
      rows.push_back(row);
      break;
    }
    std::printf("row %zu: %d streams open in %.1f s\n", r, row.streams,
                std::chrono::duration<double>(Clock::now() - open_start).count());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::duration<double>(opt.settle_s));
    absl::StatusOr<PgSample> pg0 = SamplePostgres((*pg)->dsn());
    absl::StatusOr<ProcSample> p0 = SampleProcess((*a)->pid());
    const int64_t events0 = watch.events();
    const double self0 = SelfCpuSeconds();
    const auto t0 = Clock::now();
    resizer.SetRow(static_cast<int>(r));
    GetJobProbe probe(probe_stub.get(), resizer.job_ids());
    ProcSample peak;
    while (Clock::now() - t0 < std::chrono::duration<double>(opt.window_s)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      if (absl::StatusOr<ProcSample> p = SampleProcess((*a)->pid()); p.ok()) {
        peak.threads = std::max(peak.threads, p->threads);
        peak.rss_kib = std::max(peak.rss_kib, p->rss_kib);
      }
      if (absl::Status s = (*a)->CheckRunning(); !s.ok()) {
        failures.push_back(absl::StrCat("replica A: ", s.ToString()));
        break;
      }
    }
    probe.Stop();
    resizer.SetRow(-1);
    if (!failures.empty()) {
      row.note = failures.back();
      rows.push_back(row);
      break;
    }
    const double window = std::chrono::duration<double>(Clock::now() - t0).count();
    absl::StatusOr<PgSample> pg1 = SamplePostgres((*pg)->dsn());
    absl::StatusOr<ProcSample> p1 = SampleProcess((*a)->pid());
    const int64_t events1 = watch.events();
    if (!pg0.ok() || !pg1.ok() || !p0.ok() || !p1.ok()) {
      row.note = !pg0.ok()   ? pg0.status().ToString()
                 : !pg1.ok() ? pg1.status().ToString()
                 : !p0.ok()  ? p0.status().ToString()
                             : p1.status().ToString();
      failures.push_back(absl::StrCat("row ", r, ": ", row.note));
    } else {
      row.measured = true;
      row.window_s = window;
      row.xacts_per_s = (pg1->transactions - pg0->transactions) / window;
      row.rows_per_s = (pg1->rows_read - pg0->rows_read) / window;
      row.cpu_pct = 100 * (p1->cpu_seconds - p0->cpu_seconds) / window;
      row.bench_cpu_pct = 100 * (SelfCpuSeconds() - self0) / window;
      row.threads = std::max(peak.threads, p1->threads);
      row.rss_kib = std::max(peak.rss_kib, p1->rss_kib);
      // Against the row without streams when there is one (the same
      // hosts and operations), else the coordinator's RSS before the rows.
      int64_t reference_kib = base.ok() ? base->rss_kib : -1;
      for (const Row& earlier : rows) {
        if (earlier.measured && earlier.streams == 0) reference_kib = earlier.rss_kib;
      }
      if (row.streams > 0 && reference_kib >= 0) {
        row.kib_per_stream = static_cast<double>(row.rss_kib - reference_kib) / row.streams;
      }
      row.events_per_s = (events1 - events0) / window;
    }
    row.getjob_ms = probe.ms();
    row.getjob_errors = probe.errors();
    if (probe.errors() > 0) failures.push_back(probe.first_error());
    if (watch.errors() > 0) {
      failures.push_back(absl::StrCat(watch.errors(),
                                      " WatchJob streams on replica A failed; first: ",
                                      watch.first_error()));
    }
    watch.Close();
    rows.push_back(row);
  }
  // Every operation created must commit, and its targets must have seen it.
  resizer.Stop(std::chrono::seconds(30));
  // No host here ever stops: one the leader marked LOST was lost falsely.
  int64_t lost_hosts = -1;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::ListHostsResponse listed;
    const grpc::Status s = resize_stub->ListHosts(&context, v1::ListHostsRequest(), &listed);
    if (s.ok()) {
      lost_hosts = std::count_if(listed.hosts().begin(), listed.hosts().end(), [](const auto& h) {
        return h.state() == v1::HOST_STATE_LOST;
      });
      if (lost_hosts > 0) failures.push_back(absl::StrCat(lost_hosts, " hosts marked LOST"));
    } else {
      failures.push_back(absl::StrCat("ListHosts: ", s.error_code(), " ", s.error_message()));
    }
  }
  hosts.Stop();
  timer.Stop();
  if (cross.errors() > 0) {
    failures.push_back(absl::StrCat(cross.errors(),
                                    " WatchJob streams on replica B failed; first: ",
                                    cross.first_error()));
  }
  cross.Close();
  if (resizer.errors() > 0) {
    failures.push_back(absl::StrCat(resizer.errors(), " operation errors; first: ",
                                    resizer.first_error()));
  }
  if (hosts.errors() > 0) {
    failures.push_back(absl::StrCat(hosts.errors(), " agent call errors; first: ",
                                    hosts.first_error()));
  }
  for (CoordinatorProcess* p : {a->get(), b->get()}) {
    if (absl::Status s = p->CheckRunning(); !s.ok()) failures.push_back(s.ToString());
  }
  std::vector<double> cross_ms;
  for (size_t r = 0; r < rows.size(); ++r) {
    rows[r].ops = resizer.Figures(static_cast<int>(r));
    cross_ms.insert(cross_ms.end(), rows[r].ops.cross_ms.begin(), rows[r].ops.cross_ms.end());
  }
  std::printf("\nagents: %lld heartbeats, %lld long polls answered, %lld DONE reports; %lld "
              "operations committed, %lld operation errors (not committed, or a call failed); "
              "%lld agent call errors; %lld hosts LOST\n",
              static_cast<long long>(hosts.heartbeats()), static_cast<long long>(hosts.polls()),
              static_cast<long long>(hosts.done_reports()),
              static_cast<long long>(resizer.committed()),
              static_cast<long long>(resizer.errors()), static_cast<long long>(hosts.errors()),
              static_cast<long long>(lost_hosts));
  PrintTable(opt, rows, Percentile(cross_ms, 0.5), Percentile(cross_ms, 0.99), cross_ms.size());
  if (opt.pg_profile > 0) {
    absl::StatusOr<std::vector<std::string>> top = TopStatements((*pg)->dsn(), opt.pg_profile);
    std::printf("\nPostgreSQL statements reading the most rows, whole run (pg_stat_statements):\n");
    if (!top.ok()) std::printf("  %s\n", top.status().ToString().c_str());
    for (const std::string& line : top.ok() ? *top : std::vector<std::string>()) {
      std::printf("  %s\n", line.c_str());
    }
  }
  if (!failures.empty()) {
    std::printf("\nFAILED (%zu):\n", failures.size());
    for (const std::string& f : failures) std::printf("  %s\n", f.c_str());
    std::printf("coordinator logs kept in %s\n", dir);
    return 1;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}

bool ParseInt(const std::string& v, int* out) { return absl::SimpleAtoi(v, out) && *out >= 0; }

}  // namespace
}  // namespace reshard::bench

int main(int argc, char** argv) {
  reshard::bench::Options opt;
  bool hosts_set = false, streams_set = false, jobs_set = false, window_set = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string v;
    bool ok = true;
    if (arg == "--quick") {
      opt.quick = true;
    } else if (arg == "--hosts") {
      ok = value(&v) && reshard::bench::ParseInt(v, &opt.hosts) && opt.hosts >= 4;
      hosts_set = true;
    } else if (arg == "--jobs") {
      ok = value(&v) && reshard::bench::ParseInt(v, &opt.jobs) && opt.jobs >= 1;
      jobs_set = true;
    } else if (arg == "--streams") {
      ok = value(&v);
      opt.streams.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) {
        int n = 0;
        ok = ok && absl::SimpleAtoi(s, &n) && n >= 0;
        opt.streams.push_back(n);
      }
      streams_set = true;
    } else if (arg == "--in-flight") {
      ok = value(&v) && reshard::bench::ParseInt(v, &opt.in_flight) && opt.in_flight >= 1;
    } else if (arg == "--window-s") {
      ok = value(&v) && absl::SimpleAtod(v, &opt.window_s) && opt.window_s > 0;
      window_set = true;
    } else if (arg == "--settle-s") {
      ok = value(&v) && absl::SimpleAtod(v, &opt.settle_s) && opt.settle_s >= 0;
    } else if (arg == "--channels") {
      ok = value(&v) && reshard::bench::ParseInt(v, &opt.channels) && opt.channels >= 1;
    } else if (arg == "--cross-watchers") {
      ok = value(&v) && reshard::bench::ParseInt(v, &opt.cross_watchers) &&
           opt.cross_watchers >= 1;
    } else if (arg == "--pg-profile") {
      ok = value(&v) && reshard::bench::ParseInt(v, &opt.pg_profile);
    } else if (arg == "--coordinator") {
      ok = value(&opt.coordinator);
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--hosts N] [--jobs J] [--streams W1,W2,...] "
                   "[--in-flight K] [--window-s S] [--settle-s S] [--channels C] "
                   "[--cross-watchers X] [--pg-profile N] [--coordinator PATH]\n"
                   "(bad or unknown argument \"%s\")\n",
                   argv[0], arg.c_str());
      return 2;
    }
  }
  if (opt.quick) {
    if (!hosts_set) opt.hosts = 200;
    if (!jobs_set) opt.jobs = 20;
    if (!streams_set) opt.streams = {0, 500};
    if (!window_set) opt.window_s = 4;
    opt.settle_s = std::min(opt.settle_s, 1.0);
    opt.cross_watchers = std::min(opt.cross_watchers, opt.jobs);
  }
  if (opt.streams.empty()) opt.streams = {0};
  return reshard::bench::Run(opt);
}
