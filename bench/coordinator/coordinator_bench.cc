// coordinator_bench: how fast one reshard-coordinator replica answers, end
// to end (gRPC + logic + PostgreSQL), on a throwaway PostgreSQL:
//  - RegisterJob and PreviewPlan latency for a GPT-3 175B-shaped job
//    (tp 8, pp 16, dp 8 on 128 hosts x 8 GPUs; preview to dp 6 on 96 hosts);
//  - read throughput (GetJob, ListJobs) and durable mutation throughput
//    (RegisterJob of small jobs, each one committed transaction) with 1, 4
//    and 16 concurrent clients, each for a fixed time, over mutual TLS (the
//    default) and, in the same run, against a second replica on the same
//    database run --insecure (plaintext): the cost of TLS in calls/s.
// Prints a table. --quick runs each case briefly (the CTest smoke run) and
// exits non-zero only when a call fails.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/planner/gpt_model.h"
#include "common/log.h"
#include "common/tls.h"
#include "grpcpp/grpcpp.h"
#include "reshard/v1/coordinator.grpc.pb.h"
#include "services/coordinator/server/server.h"
#include "tests/coordinator/harness/test_pki.h"
#include "tests/coordinator/harness/test_postgres.h"

namespace reshard::bench {
namespace {

using Clock = std::chrono::steady_clock;
using Stub = v1::CoordinatorService::Stub;

struct Options {
  bool quick = false;
  double seconds = 3;  // per throughput case
  int latency_reps = 5;
};

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

// Where a throughput case sends its calls: a replica's port and the
// credentials it takes.
struct Target {
  std::string name;  // "mTLS", "plaintext"
  int port = 0;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

std::unique_ptr<Stub> NewStub(const Target& target, int channel_id) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  // A distinct argument gives each client its own connection.
  args.SetInt("reshard.bench.channel", channel_id);
  return v1::CoordinatorService::NewStub(
      grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", target.port), target.credentials, args));
}

// Fails the benchmark on a call error: a number measured over errors means
// nothing.
void Check(const grpc::Status& s, const std::string& what) {
  RESHARD_CHECK(s.ok()) << what << ": " << s.error_code() << " " << s.error_message();
}

v1::JobSpec Gpt175bSpec(const std::string& name) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.set_tenant("bench");
  *spec.mutable_ptc() = BuildGptPtc(kGpt3_175b, 8);
  *spec.mutable_layout() = MakeLayout(8, 16, 8, "node-", 0, 8);
  return spec;
}

// A small GPT (2 layers, hidden 64) at tp 2, dp 2 on one 4-GPU host.
v1::JobSpec SmallSpec(const std::string& name) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.set_tenant("bench-small");
  *spec.mutable_ptc() = BuildGptPtc(GptShape{2, 64, 64, 256}, 2);
  *spec.mutable_layout() = MakeLayout(2, 1, 2, "small-", 0, 4);
  return spec;
}

struct LatencyRow {
  std::string what;
  std::vector<double> ms;
  std::string note;
};

struct ThroughputRow {
  std::string what;
  int clients;
  int64_t calls;
  double seconds;
  std::vector<double> ms;
};

// Runs `call(client, i)` from `clients` threads for `seconds`; each
// thread has its own stub and connection.
ThroughputRow Throughput(const std::string& what, const Target& target, int clients, double seconds,
                         const std::function<void(Stub*, int, int64_t)>& call) {
  std::vector<std::unique_ptr<Stub>> stubs;
  for (int c = 0; c < clients; ++c) stubs.push_back(NewStub(target, c + 1));
  // Connected (and, with TLS, handshaken) before the clock starts.
  for (auto& stub : stubs) {
    grpc::ClientContext context;
    v1::ListHostsResponse reply;
    Check(stub->ListHosts(&context, v1::ListHostsRequest(), &reply), "ListHosts warm-up");
  }
  std::vector<std::vector<double>> ms(clients);
  std::atomic<bool> go{false};
  const auto deadline_after =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::vector<std::thread> threads;
  Clock::time_point start;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      while (!go.load()) std::this_thread::yield();
      const Clock::time_point end = start + deadline_after;
      for (int64_t i = 0; Clock::now() < end; ++i) {
        const Clock::time_point t0 = Clock::now();
        call(stubs[c].get(), c, i);
        ms[c].push_back(Ms(Clock::now() - t0));
      }
    });
  }
  start = Clock::now();
  go.store(true);
  for (std::thread& t : threads) t.join();
  ThroughputRow row{
      absl::StrCat(what, " ", target.name), clients, 0, Ms(Clock::now() - start) / 1000, {}};
  for (const std::vector<double>& v : ms) {
    row.calls += static_cast<int64_t>(v.size());
    row.ms.insert(row.ms.end(), v.begin(), v.end());
  }
  return row;
}

int Run(const Options& opt) {
  SetMinLogSeverity(LogSeverity::kWarning);
  absl::StatusOr<std::unique_ptr<coordinator::testing::TestPostgres>> pg =
      coordinator::testing::TestPostgres::Start();
  if (!pg.ok()) {
    std::fprintf(stderr, "coordinator_bench: PostgreSQL: %s\n", pg.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<coordinator::testing::TestPki>> pki =
      coordinator::testing::TestPki::Create("coordinator-bench");
  absl::StatusOr<coordinator::testing::CertFiles> server_cert =
      pki.ok() ? (*pki)->Issue("coordinator") : pki.status();
  absl::StatusOr<coordinator::testing::CertFiles> client_cert =
      pki.ok() ? (*pki)->Issue("admin:bench") : pki.status();
  if (!server_cert.ok() || !client_cert.ok()) {
    std::fprintf(
        stderr, "coordinator_bench: test CA: %s\n",
        (server_cert.ok() ? client_cert.status() : server_cert.status()).ToString().c_str());
    return 1;
  }
  coordinator::CoordinatorConfig config;
  config.listen = "127.0.0.1:0";
  config.metrics_listen = "127.0.0.1:0";
  config.dsn = (*pg)->dsn();
  config.replica_id = "bench";
  config.pool_size = 16;
  config.log_level = LogSeverity::kWarning;
  config.tls.cert = server_cert->cert;
  config.tls.key = server_cert->key;
  config.tls.ca = (*pki)->ca();
  coordinator::CoordinatorServer server(config);
  // The same replica's code, plaintext, on the same database.
  coordinator::CoordinatorConfig plain_config = config;
  plain_config.replica_id = "bench-plain";
  plain_config.tls = TlsFiles();
  plain_config.tls.insecure = true;
  coordinator::CoordinatorServer plain_server(plain_config);
  for (coordinator::CoordinatorServer* s : {&server, &plain_server}) {
    if (absl::Status st = s->Start(); !st.ok()) {
      std::fprintf(stderr, "coordinator_bench: coordinator: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  TlsFiles client_tls;
  client_tls.cert = client_cert->cert;
  client_tls.key = client_cert->key;
  client_tls.ca = (*pki)->ca();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> client_credentials =
      MakeChannelCredentials(client_tls);
  RESHARD_CHECK(client_credentials.ok()) << client_credentials.status();
  const Target tls_target{"mTLS", server.port(), *client_credentials};
  const Target plain_target{"plaintext", plain_server.port(), grpc::InsecureChannelCredentials()};
  std::unique_ptr<Stub> stub = NewStub(tls_target, 0);

  // ---- 175B latency ----------------------------------------------------
  std::vector<LatencyRow> latency;
  const v1::JobSpec big = Gpt175bSpec("gpt3-175b-0");
  LatencyRow reg{"RegisterJob 175B", {}, ""};
  std::string big_id;
  for (int r = 0; r < opt.latency_reps; ++r) {
    v1::RegisterJobRequest request;
    *request.mutable_spec() = big;
    request.mutable_spec()->set_name(absl::StrCat("gpt3-175b-", r));
    grpc::ClientContext context;
    v1::RegisterJobResponse reply;
    const Clock::time_point t0 = Clock::now();
    Check(stub->RegisterJob(&context, request, &reply), "RegisterJob 175B");
    reg.ms.push_back(Ms(Clock::now() - t0));
    if (big_id.empty()) big_id = reply.job().id();
  }
  reg.note = absl::StrFormat("%d tensors, spec %.1f KiB", big.ptc().tensors_size(),
                             big.ByteSizeLong() / 1024.0);
  latency.push_back(reg);

  LatencyRow preview{"PreviewPlan 175B dp8->dp6", {}, ""};
  v1::PreviewPlanRequest preview_request;
  preview_request.set_job_id(big_id);
  *preview_request.mutable_target() = MakeLayout(8, 16, 6, "node-", 0, 8);
  for (int r = 0; r < opt.latency_reps; ++r) {
    grpc::ClientContext context;
    v1::PreviewPlanResponse reply;
    const Clock::time_point t0 = Clock::now();
    Check(stub->PreviewPlan(&context, preview_request, &reply), "PreviewPlan 175B");
    preview.ms.push_back(Ms(Clock::now() - t0));
    preview.note = absl::StrFormat("%d steps, %.1f GiB cross-host", reply.stats().steps(),
                                   reply.stats().bytes_cross_host() / double(1 << 30));
  }
  latency.push_back(preview);

  LatencyRow get_big{"GetJob 175B include_ptc", {}, ""};
  for (int r = 0; r < opt.latency_reps; ++r) {
    v1::GetJobRequest request;
    request.set_job_id(big_id);
    request.set_include_ptc(true);
    grpc::ClientContext context;
    v1::Job reply;
    const Clock::time_point t0 = Clock::now();
    Check(stub->GetJob(&context, request, &reply), "GetJob 175B");
    get_big.ms.push_back(Ms(Clock::now() - t0));
  }
  latency.push_back(get_big);

  // ---- throughput ------------------------------------------------------
  std::vector<std::string> small_ids;
  for (int i = 0; i < 100; ++i) {
    v1::RegisterJobRequest request;
    *request.mutable_spec() = SmallSpec(absl::StrCat("seed-", i));
    grpc::ClientContext context;
    v1::RegisterJobResponse reply;
    Check(stub->RegisterJob(&context, request, &reply), "RegisterJob seed");
    small_ids.push_back(reply.job().id());
  }
  std::vector<ThroughputRow> throughput;
  std::atomic<int64_t> serial{0};
  using Call = std::function<void(Stub*, int, int64_t)>;
  const std::vector<std::pair<std::string, Call>> cases = {
      {"GetJob",
       [&](Stub* s, int c, int64_t i) {
         v1::GetJobRequest request;
         request.set_job_id(small_ids[(c * 7919 + i) % small_ids.size()]);
         grpc::ClientContext context;
         v1::Job reply;
         Check(s->GetJob(&context, request, &reply), "GetJob");
       }},
      {"ListJobs (100/page)",
       [&](Stub* s, int, int64_t) {
         v1::ListJobsRequest request;
         request.set_page_size(100);
         grpc::ClientContext context;
         v1::ListJobsResponse reply;
         Check(s->ListJobs(&context, request, &reply), "ListJobs");
       }},
      {"RegisterJob (small)",
       [&](Stub* s, int, int64_t) {
         v1::RegisterJobRequest request;
         *request.mutable_spec() = SmallSpec(absl::StrCat("job-", serial.fetch_add(1)));
         grpc::ClientContext context;
         v1::RegisterJobResponse reply;
         Check(s->RegisterJob(&context, request, &reply), "RegisterJob small");
       }},
  };
  // Plaintext, then mTLS, case by case: both see the same database and the
  // same load on the machine.
  for (const auto& [name, call] : cases) {
    for (int clients : {1, 4, 16}) {
      for (const Target* target : {&plain_target, &tls_target}) {
        throughput.push_back(Throughput(name, *target, clients, opt.seconds, call));
      }
    }
  }
  server.Shutdown();
  plain_server.Shutdown();

  std::printf("coordinator_bench: one replica, PostgreSQL on the same machine (%u cores)%s\n\n",
              std::thread::hardware_concurrency(), opt.quick ? ", --quick" : "");
  std::printf("%-28s %5s %10s %10s  %s\n", "latency", "runs", "median ms", "min ms", "");
  for (const LatencyRow& r : latency) {
    std::printf("%-28s %5zu %10.1f %10.1f  %s\n", r.what.c_str(), r.ms.size(),
                Percentile(r.ms, 0.5), *std::min_element(r.ms.begin(), r.ms.end()), r.note.c_str());
  }
  std::printf("\n%-32s %7s %8s %10s %8s %8s %9s\n", "throughput", "clients", "calls", "calls/s",
              "p50 ms", "p99 ms", "vs plain");
  // Rows alternate: plaintext, then the same case over mTLS.
  for (size_t k = 0; k < throughput.size(); ++k) {
    const ThroughputRow& r = throughput[k];
    const double rate = r.calls / r.seconds;
    std::string vs;
    if (k % 2 == 1) {
      const ThroughputRow& plain = throughput[k - 1];
      const double plain_rate = plain.calls / plain.seconds;
      if (plain_rate > 0) vs = absl::StrFormat("%+.1f%%", 100.0 * (rate / plain_rate - 1));
    }
    std::printf("%-32s %7d %8lld %10.0f %8.2f %8.2f %9s\n", r.what.c_str(), r.clients,
                static_cast<long long>(r.calls), rate, Percentile(r.ms, 0.5),
                Percentile(r.ms, 0.99), vs.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace reshard::bench

int main(int argc, char** argv) {
  reshard::bench::Options opt;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      opt.quick = true;
      opt.seconds = 0.2;
      opt.latency_reps = 1;
    } else if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc &&
               absl::SimpleAtod(argv[i + 1], &opt.seconds) && opt.seconds > 0) {
      ++i;
    } else {
      std::fprintf(stderr,
                   "usage: coordinator_bench [--quick] [--seconds S]\n"
                   "  --quick      one run per latency case, 0.2 s per throughput case\n"
                   "  --seconds S  time per throughput case (default 3)\n");
      return 2;
    }
  }
  return reshard::bench::Run(opt);
}
