// Lifecycle and liveness end to end (issue 9, defects 3, 4 and 6), with real
// processes and real faults: DeleteJob releases every host's memory (also on
// an agent that was down); a destination agent SIGKILLed and restarted within
// its lease ends its operation at once instead of hanging; a host SIGSTOPped
// past its lease gives its jobs back when it returns with its shards intact,
// and one restarted without its shm files stays lost until a recovery.
#include <signal.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <thread>

#include "tests/agent/e2e/e2e_fixture.h"
#include "tests/coordinator/server/scrape.h"
#include "tests/support/wait.h"

namespace reshard::agent::testing {
namespace {

using coordinator::testing::HttpGet;
using coordinator::testing::MakeLayout;
using coordinator::testing::MetricValue;

constexpr absl::Duration kDeadline = absl::Seconds(20);

class LivenessE2eTest : public AgentE2eTest {
 protected:
  // Files of the job's rank buffers in `host`'s shm dir.
  int ShardFiles(const std::string& host) {
    int n = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_ + "/shm-" + host, ec)) {
      if (e.path().filename().string().find(job_id_) != std::string::npos) ++n;
    }
    return n;
  }

  std::optional<double> CoordinatorMetric(const std::string& name,
                                          const std::map<std::string, std::string>& labels) {
    absl::StatusOr<std::string> body = HttpGet(coordinator_->metrics_port(), "/metrics");
    if (!body.ok()) return std::nullopt;
    return MetricValue(*body, name, labels);
  }

  v1::Job GetJob() {
    v1::GetJobRequest req;
    req.set_job_id(job_id_);
    v1::Job job;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub_->GetJob(&ctx, req, &job).ok());
    return job;
  }

  grpc::StatusCode OpenRank(const std::string& host, int64_t generation, int rank) {
    auto worker = v1::WorkerService::NewStub(
        grpc::CreateChannel("unix:" + sockets_[host], grpc::InsecureChannelCredentials()));
    v1::OpenGenerationRequest open;
    open.set_job_id(job_id_);
    open.set_generation(generation);
    open.set_rank(rank);
    v1::OpenGenerationResponse opened;
    grpc::ClientContext ctx;
    AddWorkerToken(&ctx, job_id_);
    return worker->OpenGeneration(&ctx, open, &opened).error_code();
  }

  void DeleteJob() {
    v1::DeleteJobRequest req;
    req.set_job_id(job_id_);
    v1::DeleteJobResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->DeleteJob(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  // The replicated job (h0/h1 and h2/h3 each hold the same ranks' data)
  // migrated once, so that the coordinator holds the checksums of its
  // current generation.
  void ReplicatedJobAtGeneration2() {
    ASSERT_NO_FATAL_FAILURE(
        RegisterAndPublish(test_support::ReplicatedGptJobSpec("gpt-replicated", "e2e")));
    const v1::Layout target = MakeLayout(2, 2, 2, {"h1", "h0", "h3", "h2"}, 2);
    ASSERT_NO_FATAL_FAILURE(MigrateTo(target));
    ASSERT_EQ(generation_, 2);
  }
};

// ---- Defect 3 ----------------------------------------------------------------

TEST_F(LivenessE2eTest, DeleteJobReleasesEveryHostsMemory) {
  ASSERT_NO_FATAL_FAILURE(RegisterAndPublish(test_support::GptJobSpec("gpt", "e2e", {"h0", "h1"})));
  for (const std::string h : {"h0", "h1"}) {
    ASSERT_GT(ShardFiles(h), 0) << h;
    std::optional<double> used = AgentMetric(h, "reshard_agent_shard_store_used_bytes");
    ASSERT_TRUE(used.has_value()) << h;
    ASSERT_GT(*used, 0) << h;
  }
  ASSERT_EQ(OpenRank("h0", 1, 0), grpc::StatusCode::OK);
  ASSERT_NO_FATAL_FAILURE(DeleteJob());
  for (const std::string h : {"h0", "h1"}) {
    EXPECT_TRUE(test_support::Eventually([&] { return ShardFiles(h) == 0; }, kDeadline))
        << h << ": " << ShardFiles(h);
    EXPECT_TRUE(test_support::Eventually(
        [&] {
          return AgentMetric(h, "reshard_agent_shard_store_used_bytes") == std::optional<double>(0);
        },
        kDeadline))
        << h;
  }
  EXPECT_EQ(OpenRank("h0", 1, 0), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(OpenRank("h1", 1, 4), grpc::StatusCode::NOT_FOUND);
}

TEST_F(LivenessE2eTest, AgentDownDuringDeleteJobDropsItWhenItComesBack) {
  ASSERT_NO_FATAL_FAILURE(RegisterAndPublish(test_support::GptJobSpec("gpt", "e2e", {"h0", "h1"})));
  ASSERT_GT(ShardFiles("h1"), 0);
  agents_["h1"]->Kill();
  ASSERT_NO_FATAL_FAILURE(DeleteJob());
  EXPECT_TRUE(test_support::Eventually([&] { return ShardFiles("h0") == 0; }, kDeadline));
  ASSERT_GT(ShardFiles("h1"), 0);  // nobody told the dead agent
  ASSERT_NO_FATAL_FAILURE(StartAgent("h1"));
  EXPECT_TRUE(test_support::Eventually([&] { return ShardFiles("h1") == 0; }, kDeadline))
      << ShardFiles("h1");
  EXPECT_TRUE(test_support::Eventually(
      [&] {
        return AgentMetric("h1", "reshard_agent_shard_store_used_bytes") ==
               std::optional<double>(0);
      },
      kDeadline));
  EXPECT_EQ(OpenRank("h1", 1, 4), grpc::StatusCode::NOT_FOUND);
}

// ---- Defect 4 (a) ------------------------------------------------------------

// A lease long enough for the agent to restart inside it, and a stall
// timeout longer than the test's bound, so that only the new incarnation's
// registration can end the operation in time.
class RestartWithinLeaseTest : public LivenessE2eTest {
 protected:
  int LeaseMs() const override { return 8000; }
  std::vector<std::string> CoordinatorFlags() const override {
    return {"--stall-timeout-ms", "120000"};
  }
};

TEST_F(RestartWithinLeaseTest, DestinationRestartedWithinItsLeaseAbortsAtOnceAndRetryCommits) {
  ASSERT_NO_FATAL_FAILURE(RegisterAndPublish(test_support::GptJobSpec("gpt", "e2e", {"h0", "h1"})));
  const v1::Layout target = MakeLayout(2, 2, 2, {"h2", "h3"}, 4);
  v1::Operation op = StartResize(target);
  ASSERT_FALSE(op.id().empty());
  op = WaitTransferring(op);
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_TRANSFERRING);
  agents_["h3"]->Kill();
  const auto restarted = std::chrono::steady_clock::now();
  ASSERT_NO_FATAL_FAILURE(StartAgent("h3"));
  op = WaitFinal(op.id(), /*timeout_s=*/30);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - restarted).count();
  EXPECT_EQ(op.state(), v1::OPERATION_STATE_ABORTED) << op.error();
  // The first error recorded names h3: the coordinator saw its new epoch, or
  // (agents start tasks as soon as they are told, not at a heartbeat) a
  // source found the killed destination first.
  const std::string& error = op.error();
  const bool epoch_moved =
      error.find("host \"h3\": the agent restarted (epoch 1 -> 2)") != std::string::npos;
  const bool peer_lost = error.find("to host \"h3\"") != std::string::npos ||
                         error.find("peer \"h3\"") != std::string::npos;
  EXPECT_TRUE(epoch_moved || peer_lost) << error;
  EXPECT_LT(seconds, 6.0) << "within the lease (8 s): only the restart can have ended it";

  absl::Status v = Verify(sockets_, job_id_, generation_, contents_);
  ASSERT_TRUE(v.ok()) << v;
  v1::Operation retry = StartResize(target);
  ASSERT_NO_FATAL_FAILURE(ExpectCommitted(retry, target));
}

// ---- Defect 6 ----------------------------------------------------------------

TEST_F(LivenessE2eTest, HostStoppedPastItsLeaseGivesTheJobBackWhenItContinues) {
  ASSERT_NO_FATAL_FAILURE(ReplicatedJobAtGeneration2());
  ASSERT_EQ(kill(agents_["h1"]->pid(), SIGSTOP), 0);
  ASSERT_NO_FATAL_FAILURE(WaitLost("h1"));
  // The driver marks the host LOST, then degrades its jobs in a later step:
  // wait for that, not just for the host.
  EXPECT_TRUE(test_support::Eventually([&] { return GetJob().state() == v1::JOB_STATE_DEGRADED; },
                                       kDeadline))
      << GetJob().ShortDebugString();
  EXPECT_TRUE(test_support::Eventually(
      [&] {
        return CoordinatorMetric("reshard_coordinator_jobs", {{"state", "degraded"}}) ==
               std::optional<double>(1);
      },
      kDeadline));
  ASSERT_EQ(kill(agents_["h1"]->pid(), SIGCONT), 0);

  EXPECT_TRUE(test_support::Eventually(
      [&] {
        const v1::Job job = GetJob();
        return job.state() == v1::JOB_STATE_ACTIVE && job.lost_hosts().empty();
      },
      kDeadline))
      << GetJob().ShortDebugString();
  EXPECT_TRUE(test_support::Eventually(
      [&] {
        return CoordinatorMetric("reshard_coordinator_jobs", {{"state", "degraded"}}) ==
                   std::optional<double>(0) &&
               CoordinatorMetric("reshard_coordinator_jobs", {{"state", "active"}}) ==
                   std::optional<double>(1);
      },
      kDeadline));
  absl::Status v = Verify(sockets_, job_id_, generation_, contents_);
  EXPECT_TRUE(v.ok()) << v;
}

// ---- Issue 32: busy is not dead ------------------------------------------------

// A lease of 3 s (heartbeats every second): an agent frozen for 1.5 s misses
// a heartbeat period but never its lease.
class BusyHostTest : public LivenessE2eTest {
 protected:
  int LeaseMs() const override { return 3000; }

  // Heartbeats whose agent measured them leaving more than 100 ms late.
  std::optional<double> LateHeartbeats() {
    const std::optional<double> all =
        CoordinatorMetric("reshard_coordinator_agent_heartbeat_lag_seconds_count", {});
    const std::optional<double> on_time = CoordinatorMetric(
        "reshard_coordinator_agent_heartbeat_lag_seconds_bucket", {{"le", "0.1"}});
    if (!all.has_value() || !on_time.has_value()) return std::nullopt;
    return *all - *on_time;
  }

  std::optional<v1::Host> HostNamed(const std::string& id) {
    v1::ListHostsResponse resp;
    grpc::ClientContext ctx;
    if (!stub_->ListHosts(&ctx, v1::ListHostsRequest(), &resp).ok()) return std::nullopt;
    for (const v1::Host& h : resp.hosts()) {
      if (h.host_id() == id) return h;
    }
    return std::nullopt;
  }
};

TEST_F(BusyHostTest, AnAgentFrozenForAHeartbeatPeriodIsSlowNotLost) {
  ASSERT_NO_FATAL_FAILURE(ReplicatedJobAtGeneration2());
  const std::optional<v1::Host> before = HostNamed("h1");
  ASSERT_TRUE(before.has_value());
  ASSERT_EQ(before->state(), v1::HOST_STATE_ALIVE);
  const std::optional<double> registrations =
      AgentMetric("h1", "reshard_agent_registrations_total", {{"result", "ok"}});
  ASSERT_TRUE(registrations.has_value());
  const std::optional<double> late_before = LateHeartbeats();
  ASSERT_TRUE(late_before.has_value());
  // The fault itself lasts 1.5 s: the agent's process gets no CPU at all.
  ASSERT_EQ(kill(agents_["h1"]->pid(), SIGSTOP), 0);
  std::this_thread::sleep_until(std::chrono::steady_clock::now() + std::chrono::milliseconds(1500));
  ASSERT_EQ(kill(agents_["h1"]->pid(), SIGCONT), 0);
  // Its next heartbeat tells how late it left (between 0.5 and 1.5 s).
  EXPECT_TRUE(test_support::Eventually(
      [&] {
        const std::optional<double> late = LateHeartbeats();
        return late.has_value() && *late > *late_before;
      },
      kDeadline));
  const std::optional<v1::Host> after = HostNamed("h1");
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->state(), v1::HOST_STATE_ALIVE);
  EXPECT_EQ(AgentMetric("h1", "reshard_agent_registrations_total", {{"result", "ok"}}),
            registrations)
      << "the host was marked LOST and its agent registered again";
  const v1::Job job = GetJob();
  EXPECT_EQ(job.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_TRUE(job.lost_hosts().empty());
  EXPECT_EQ(CoordinatorMetric("reshard_coordinator_hosts", {{"state", "lost"}}),
            std::optional<double>(0));
}

TEST_F(LivenessE2eTest, HostBackWithoutItsShardsStaysLostUntilRecovered) {
  ASSERT_NO_FATAL_FAILURE(ReplicatedJobAtGeneration2());
  agents_["h1"]->Kill();
  ASSERT_NO_FATAL_FAILURE(WaitLost("h1"));
  std::error_code ec;
  std::filesystem::remove_all(dir_ + "/shm-h1", ec);
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_NO_FATAL_FAILURE(StartAgent("h1"));
  ASSERT_NO_FATAL_FAILURE(WaitHostsAlive());  // registered: judged already
  const v1::Job job = GetJob();
  EXPECT_EQ(job.state(), v1::JOB_STATE_DEGRADED);
  ASSERT_EQ(job.lost_hosts_size(), 1) << job.ShortDebugString();
  EXPECT_EQ(job.lost_hosts(0), "h1");

  const v1::Layout target = MakeLayout(2, 2, 1, {"h3", "h0"}, 2);
  ASSERT_NO_FATAL_FAILURE(RecoverOnto("h1", target));
  const v1::Job recovered = GetJob();
  EXPECT_EQ(recovered.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_TRUE(recovered.lost_hosts().empty());
}

}  // namespace
}  // namespace reshard::agent::testing
