// The fixture of the agent's end-to-end tests: PostgreSQL, the real
// reshard-coordinator and four real reshard-agent processes (h0..h3, each
// with its own shm dir, UCX over loopback); the test plays the training
// workers. Not thread-safe.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "tests/agent/e2e/e2e_support.h"
#include "tests/coordinator/harness/test_postgres.h"
#include "tests/coordinator/server/coordinator_process.h"
#include "tests/coordinator/server/scrape.h"
#include "tests/coordinator/server/test_jobs.h"
#include "tests/support/wait.h"

namespace reshard::agent::testing {

using coordinator::testing::CoordinatorProcess;
using coordinator::testing::CreateFreshDatabase;
using coordinator::testing::HostsPlacement;
using coordinator::testing::MakeLayout;

inline constexpr int kLeaseMs = 1500;

inline bool Final(v1::OperationState s) {
  return s == v1::OPERATION_STATE_COMMITTED || s == v1::OPERATION_STATE_ABORTED ||
         s == v1::OPERATION_STATE_FAILED;
}

/// The dataset state the stop-free tests register with (a cut-over
/// checkpoint carries a step): 1000 samples, fully shuffled with seed 7,
/// `global_batch` samples a step.
inline v1::DatasetState TokensDataset(int64_t global_batch) {
  v1::DatasetState d;
  d.mutable_dataset()->set_id("tokens");
  d.mutable_dataset()->set_num_samples(1000);
  d.mutable_dataset()->set_fingerprint("sha1:abc");
  d.mutable_order()->set_seed(7);
  d.mutable_order()->set_shuffle(v1::SHUFFLE_FULL);
  d.set_global_batch(global_batch);
  return d;
}

class AgentE2eTest : public ::testing::Test {
 protected:
  /// The coordinator's lease (--lease-ms); a test may choose another.
  virtual int LeaseMs() const { return kLeaseMs; }
  /// Flags added to the coordinator's command line.
  virtual std::vector<std::string> CoordinatorFlags() const { return {}; }

  void SetUp() override {
    char tmpl[] = "/tmp/reshard-agent-e2e-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    absl::StatusOr<std::string> dsn = CreateFreshDatabase("agent_e2e");
    ASSERT_TRUE(dsn.ok()) << dsn.status();
    std::vector<std::string> flags = {"--dsn",
                                      *dsn,
                                      "--listen",
                                      "127.0.0.1:0",
                                      "--metrics-listen",
                                      "127.0.0.1:0",
                                      "--lease-ms",
                                      std::to_string(LeaseMs()),
                                      "--tick-ms",
                                      "50",
                                      "--leader-retry-ms",
                                      "100",
                                      "--log-level",
                                      "info",
                                      "--insecure"};  // not about security (issue 11)
    for (const std::string& f : CoordinatorFlags()) flags.push_back(f);
    auto c = CoordinatorProcess::Start(flags);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(*c);
    stub_ = v1::CoordinatorService::NewStub(
        grpc::CreateChannel(coordinator_->address(), grpc::InsecureChannelCredentials()));
    for (const char* h : {"h0", "h1", "h2", "h3"}) {
      sockets_[h] = dir_ + "/" + h + ".sock";
      ASSERT_NO_FATAL_FAILURE(StartAgent(h));
    }
    ASSERT_NO_FATAL_FAILURE(WaitHostsAlive());
  }

  void TearDown() override {
    agents_.clear();
    if (coordinator_) coordinator_->Kill();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void StartAgent(const std::string& h) {
    AgentProcess::Options o;
    o.host_id = h;
    o.coordinator = coordinator_->address();
    o.worker_socket = sockets_[h];
    o.shm_dir = dir_ + "/shm-" + h;
    o.extra_args = {"--memory-limit-bytes", std::to_string(int64_t{1} << 30), "--metrics-listen",
                    "127.0.0.1:0", "--insecure"};
    o.env = {{"UCX_NET_DEVICES", "lo"}, {"UCX_TLS", "tcp,self"}};
    auto a = AgentProcess::Start(o);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_NE((*a)->metrics_port(), 0) << "agent " << h << " logged no /metrics port";
    agents_[h] = std::move(*a);
  }

  /// The /metrics exposition of the agent of `host` (an error when it
  /// serves none: a rogue agent, or one that is down).
  absl::StatusOr<std::string> AgentMetrics(const std::string& host) {
    return coordinator::testing::HttpGet(agents_.at(host)->metrics_port(), "/metrics");
  }

  /// The value of metric `name` (samples with `labels`, summed) on the
  /// agent of `host`; nullopt when it cannot be scraped or has none.
  std::optional<double> AgentMetric(const std::string& host, const std::string& name,
                                    const std::map<std::string, std::string>& labels = {}) {
    absl::StatusOr<std::string> body = AgentMetrics(host);
    if (!body.ok()) return std::nullopt;
    return coordinator::testing::MetricValue(*body, name, labels);
  }

  // Every running agent's own registration reaches the coordinator before a
  // job needs it: ListHosts shows each host ALIVE, and a host whose agent was
  // replaced since the last call (a restart, a rogue) shows a UCX address
  // other than its earlier agent's. The earlier agent's lease may still hold,
  // so ALIVE alone would let an operation go to the incarnation that is gone.
  void WaitHostsAlive() {
    const bool all = test_support::Eventually(
        [&] {
          v1::ListHostsResponse resp;
          grpc::ClientContext ctx;
          if (!stub_->ListHosts(&ctx, v1::ListHostsRequest(), &resp).ok()) return false;
          std::map<std::string, Registration> seen;
          for (const v1::Host& h : resp.hosts()) {
            auto agent = agents_.find(h.host_id());
            if (h.state() != v1::HOST_STATE_ALIVE || agent == agents_.end()) continue;
            auto earlier = registered_.find(h.host_id());
            const bool same_agent =
                earlier != registered_.end() && earlier->second.pid == agent->second->pid();
            const bool stale = earlier != registered_.end() && !same_agent &&
                               earlier->second.ucx_address == h.ucx_address();
            if (!stale) seen[h.host_id()] = {agent->second->pid(), h.ucx_address()};
          }
          if (seen.size() != agents_.size()) return false;
          for (auto& [host, r] : seen) registered_[host] = std::move(r);
          return true;
        },
        absl::Seconds(10));
    if (!all) FAIL() << "agents did not all register";
  }

  // Registers the job (with `data` as its dataset state when given) and
  // publishes generation 1; the registered job goes to `registered` if set.
  void RegisterAndPublish(const v1::JobSpec& spec, const v1::DatasetState* data = nullptr,
                          v1::Job* registered = nullptr) {
    v1::RegisterJobRequest req;
    *req.mutable_spec() = spec;
    if (data != nullptr) *req.mutable_dataset_state() = *data;
    v1::RegisterJobResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->RegisterJob(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    if (registered != nullptr) *registered = resp.job();
    job_id_ = resp.job().id();
    SetWorkerToken(job_id_, resp.worker_token());
    ptc_ = spec.ptc();
    generation_ = 1;
    auto c = RandomContents(ptc_, spec.layout(), 42);
    ASSERT_TRUE(c.ok()) << c.status();
    contents_ = std::move(*c);
    absl::Status p = Publish(sockets_, job_id_, generation_, contents_);
    ASSERT_TRUE(p.ok()) << p;
  }

  // RecoverFromFailure with `lost_host` lost, onto `target`; expects it to
  // commit, the lost host's shards rebuilt from the replicas that survive.
  void RecoverOnto(const std::string& lost_host, const v1::Layout& target) {
    v1::RecoverFromFailureRequest req;
    req.set_job_id(job_id_);
    req.set_expected_generation(generation_);
    req.add_lost_hosts(lost_host);
    *req.mutable_target() = target;
    // The tests move bytes; a target with fewer copies than the job had is
    // theirs to choose (docs/coordinator.md, "Recovery keeps the job's
    // redundancy").
    req.set_accept_degraded(true);
    v1::Operation op;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->RecoverFromFailure(&ctx, req, &op);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_NO_FATAL_FAILURE(ExpectCommitted(op, target, {lost_host}));
  }

  // Polls `op` until it is TRANSFERRING (or ended), for at most ~4 s.
  v1::Operation WaitTransferring(v1::Operation op) {
    test_support::Eventually(
        [&] {
          if (op.state() == v1::OPERATION_STATE_TRANSFERRING || Final(op.state())) return true;
          v1::GetOperationRequest req;
          req.set_operation_id(op.id());
          grpc::ClientContext ctx;
          v1::Operation now;
          if (stub_->GetOperation(&ctx, req, &now).ok()) op = now;
          return op.state() == v1::OPERATION_STATE_TRANSFERRING || Final(op.state());
        },
        absl::Seconds(4), absl::Milliseconds(2));
    return op;
  }

  v1::Operation WaitFinal(const std::string& op_id, int timeout_s = 90) {
    v1::Operation op;
    if (test_support::Eventually(
            [&] {
              v1::GetOperationRequest req;
              req.set_operation_id(op_id);
              grpc::ClientContext ctx;
              return stub_->GetOperation(&ctx, req, &op).ok() && Final(op.state());
            },
            absl::Seconds(timeout_s))) {
      return op;
    }
    ADD_FAILURE() << "operation " << op_id << " did not end; now "
                  << v1::OperationState_Name(op.state());
    return op;
  }

  v1::Operation GetOperation(const std::string& id) {
    v1::GetOperationRequest req;
    req.set_operation_id(id);
    v1::Operation op;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->GetOperation(&ctx, req, &op);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return op;
  }

  // Polls `id` until `done(op)` or the operation ended, for at most 60 s.
  v1::Operation WaitUntil(const std::string& id,
                          const std::function<bool(const v1::Operation&)>& done) {
    v1::Operation op;
    test_support::Eventually(
        [&] {
          op = GetOperation(id);
          return done(op) || Final(op.state());
        },
        absl::Seconds(60), absl::Milliseconds(20));
    return op;
  }

  v1::Job GetJob() {
    v1::GetJobRequest req;
    req.set_job_id(job_id_);
    v1::Job job;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->GetJob(&ctx, req, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }

  v1::Operation Checkpoint(const v1::CheckpointRequest& req) {
    v1::Operation op;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->Checkpoint(&ctx, req, &op);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return op;
  }

  // The workers publish `c` into a checkpoint's generation: a rank's publish
  // is refused (UNAVAILABLE) until the checkpoint's task reached its agent,
  // so each is tried again until then (30 s at most).
  absl::Status PublishCheckpoint(int64_t generation, const Contents& c) {
    for (size_t r = 0; r < c.ranks.size(); ++r) {
      absl::Status s;
      test_support::Eventually(
          [&] {
            s = PublishRank(sockets_, job_id_, generation, c, static_cast<int>(r));
            return !absl::IsUnavailable(s);
          },
          absl::Seconds(30), absl::Milliseconds(20));
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // The job's contents a step later, in its current layout: every tensor of
  // even index changed (the optimizer's steps, say), the others and the
  // blobs kept their bytes.
  absl::StatusOr<Contents> EvenTensorsChanged() {
    auto later = RandomContents(ptc_, contents_.layout, 4242);
    if (!later.ok()) return later.status();
    Contents next = contents_;
    for (size_t r = 0; r < next.ranks.size(); ++r) {
      for (int i = 0; i < ptc_.tensors_size(); i += 2) next.ranks[r][i] = later->ranks[r][i];
    }
    return next;
  }

  // Starts a resize to `target` (config and placement), two-phase when
  // `stop_free` (docs/coordinator.md, "Stop-free reconfiguration").
  grpc::Status TryResize(const v1::Layout& target, bool stop_free, v1::Operation* op) {
    v1::ResizeRequest req;
    req.set_job_id(job_id_);
    req.set_expected_generation(generation_);
    *req.mutable_placement() = target.placement();
    *req.mutable_config() = target.config();
    req.set_stop_free(stop_free);
    grpc::ClientContext ctx;
    return stub_->Resize(&ctx, req, op);
  }

  v1::Operation StartResize(const v1::Layout& target, bool stop_free = false) {
    v1::Operation op;
    grpc::Status s = TryResize(target, stop_free, &op);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return op;
  }

  // StartResize, sent again (for up to 30 s) while the coordinator refuses
  // a new operation as not possible yet (FAILED_PRECONDITION, UNAVAILABLE:
  // a host that just came back); any other answer is final.
  v1::Operation StartResizeOnceAccepted(const v1::Layout& target) {
    v1::Operation op;
    grpc::Status last;
    test_support::Eventually(
        [&] {
          last = TryResize(target, /*stop_free=*/false, &op);
          return last.error_code() != grpc::StatusCode::FAILED_PRECONDITION &&
                 last.error_code() != grpc::StatusCode::UNAVAILABLE;
        },
        absl::Seconds(30), absl::Milliseconds(100));
    EXPECT_TRUE(last.ok()) << last.error_code() << " " << last.error_message();
    return op;
  }

  // Expects `op` to commit, then checks every new rank against the reference.
  void ExpectCommitted(const v1::Operation& started, const v1::Layout& target,
                       const std::vector<std::string>& lost_hosts = {}) {
    ASSERT_FALSE(started.id().empty());
    v1::Operation op = WaitFinal(started.id());
    ASSERT_EQ(op.state(), v1::OPERATION_STATE_COMMITTED) << op.error();
    auto next = Reshard(ptc_, contents_, target, lost_hosts);
    ASSERT_TRUE(next.ok()) << next.status();
    contents_ = std::move(*next);
    generation_ = op.to_generation();
    absl::Status v = Verify(sockets_, job_id_, generation_, contents_);
    ASSERT_TRUE(v.ok()) << v;
  }

  // Migrates the job to `target`'s placement (same config) and expects it
  // to commit.
  void MigrateTo(const v1::Layout& target) {
    v1::MigrateRequest req;
    req.set_job_id(job_id_);
    req.set_expected_generation(generation_);
    *req.mutable_placement() = target.placement();
    v1::Operation op;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->Migrate(&ctx, req, &op);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_NO_FATAL_FAILURE(ExpectCommitted(op, target));
  }

  void ResizeTo(const v1::Layout& target) {
    SCOPED_TRACE(absl::StrCat("resize to tp ", target.config().tp(), " pp ", target.config().pp(),
                              " dp ", target.config().dp()));
    ASSERT_NO_FATAL_FAILURE(ExpectCommitted(StartResize(target), target));
  }

  void WaitLost(const std::string& host) {
    const bool lost = test_support::Eventually(
        [&] {
          v1::GetJobRequest req;
          req.set_job_id(job_id_);
          v1::Job job;
          grpc::ClientContext ctx;
          if (!stub_->GetJob(&ctx, req, &job).ok()) return false;
          for (const std::string& h : job.lost_hosts()) {
            if (h == host) return true;
          }
          return false;
        },
        absl::Seconds(20));
    if (!lost) FAIL() << "host " << host << " was not marked lost";
  }

  std::string dir_;
  std::unique_ptr<CoordinatorProcess> coordinator_;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
  std::map<std::string, std::string> sockets_;
  std::map<std::string, std::unique_ptr<AgentProcess>> agents_;
  // The registration WaitHostsAlive last saw for each host, and the agent
  // (by pid) that made it.
  struct Registration {
    pid_t pid = -1;
    std::string ucx_address;
  };
  std::map<std::string, Registration> registered_;
  std::string job_id_;
  v1::Ptc ptc_;
  int64_t generation_ = 0;
  Contents contents_;
};

}  // namespace reshard::agent::testing
