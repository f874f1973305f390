// Liveness of operations and of jobs (issue 9, defects 3, 4 and 6) against a
// real PostgreSQL, agents played through AgentApi, time through a fake
// clock: a task without progress aborts its operation; an agent that comes
// back as a new incarnation fails the tasks its predecessor held; agents
// learn which of their jobs were deleted; a lost host that returns with its
// shards intact gives its jobs back, one that returns empty stays lost.
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/layout.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::MakeLayout;
using test_support::ReplicatedTwoLayerJob;
using test_support::TwoLayerJob;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class LivenessTest : public LogicTest {
 protected:
  void SetUp() override {
    LogicTest::SetUp();
    OperationDriver::Options options;
    options.stall_timeout_ms = kStallMs;
    driver_ = MakeDriver(store_, options);
  }

  static constexpr int64_t kStallMs = 20000;

  absl::Status Report(const std::string& host, const std::string& op_id, v1::HostTaskState state,
                      int64_t bytes_done, const std::string& waiting_on = "") {
    v1::ReportProgressRequest r;
    r.set_host_id(host);
    r.set_operation_id(op_id);
    r.set_state(state);
    r.set_bytes_done(bytes_done);
    r.set_waiting_on(waiting_on);
    return agents_->ReportProgress(r).status();
  }

  void Fetch(const std::string& host, const std::string& op_id) {
    v1::GetTaskRequest get;
    get.set_host_id(host);
    get.set_operation_id(op_id);
    ASSERT_TRUE(agents_->GetTask(get).ok());
  }

  // Advances the clock by `ms` with every host in `hosts` heartbeating.
  void Pass(int64_t ms, const std::vector<std::string>& hosts) {
    clock_.Advance(ms);
    for (const std::string& h : hosts) ASSERT_TRUE(Heartbeat(h).ok()) << h;
    Tick();
  }

  // RegisterAgent for `host` with `held` buffers; remembers the epoch.
  v1::RegisterAgentResponse RegisterHolding(const std::string& host,
                                            const std::vector<v1::HeldRank>& held,
                                            const std::vector<std::string>& held_jobs = {}) {
    v1::RegisterAgentRequest request;
    request.mutable_host()->set_host_id(host);
    request.mutable_host()->set_address(host + ":7171");
    request.mutable_host()->set_ucx_address("ucx-" + host);
    for (const v1::HeldRank& h : held) *request.add_held_ranks() = h;
    for (const std::string& j : held_jobs) request.add_held_jobs(j);
    absl::StatusOr<v1::RegisterAgentResponse> response = agents_->RegisterAgent(request);
    EXPECT_TRUE(response.ok()) << response.status();
    if (!response.ok()) return {};
    epochs_[host] = response->epoch();
    return *response;
  }

  // What `host` holds of the job's current generation, sealed with the
  // checksums the coordinator recorded at commit.
  std::vector<v1::HeldRank> IntactRanks(const v1::Job& job, const std::string& host) {
    absl::StatusOr<std::vector<v1::ShardChecksum>> sums =
        store_->GetGenerationChecksums(job.id(), job.generation());
    EXPECT_TRUE(sums.ok()) << sums.status();
    std::map<int, v1::HeldRank> by_rank;
    const std::vector<v1::DeviceSlot> slots = planner::ExpandPlacement(job.layout().placement());
    for (int rank = 0; rank < static_cast<int>(slots.size()); ++rank) {
      if (slots[rank].host() != host) continue;
      v1::HeldRank& h = by_rank[rank];
      h.set_job_id(job.id());
      h.set_generation(job.generation());
      h.set_rank(rank);
      h.set_sealed(true);
    }
    for (const v1::ShardChecksum& c : *sums) {
      auto it = by_rank.find(c.rank());
      if (it == by_rank.end()) continue;
      while (it->second.checksums_size() <= c.item()) it->second.add_checksums(0);
      it->second.set_checksums(c.item(), c.checksum());
    }
    std::vector<v1::HeldRank> out;
    for (auto& [rank, h] : by_rank) out.push_back(h);
    EXPECT_FALSE(out.empty());
    return out;
  }

  // A job at generation 2 (built by a committed resize, so the coordinator
  // holds its checksums), a replica each on h1 and h2, and h2's lease then
  // expired.
  v1::Job CommittedJobWithLostHost() {
    const v1::Job job = Register(ReplicatedTwoLayerJob("returns"));
    RegisterAgents({"h0", "h1", "h2"});
    // tp1 pp1 dp2: h1 and h2 each hold a whole replica.
    const v1::Operation op = StartTransfer(job, MakeLayout(1, 1, 2, {"h1", "h2"}, 1));
    for (const std::string h : {"h0", "h1", "h2"}) CompleteTask(h, op.id());
    Tick();
    EXPECT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_COMMITTED) << Op(op.id()).error();
    clock_.Advance(kLeaseMs / 2);
    EXPECT_TRUE(Heartbeat("h0").ok());
    EXPECT_TRUE(Heartbeat("h1").ok());
    clock_.Advance(kLeaseMs / 2 + 1);
    Tick();
    const v1::Job degraded = Job(job.id());
    EXPECT_EQ(degraded.state(), v1::JOB_STATE_DEGRADED);
    EXPECT_THAT(degraded.lost_hosts(), ElementsAre("h2"));
    EXPECT_EQ(degraded.generation(), 2);
    return degraded;
  }
};

// ---- Defect 4 (b): a task without progress ends its operation --------------

TEST_F(LivenessTest, AHostThatWaitsWhileItsPeersMoveIsSlowNotStalled) {
  const v1::Job job = Register(TwoLayerJob("stalls"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation op = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  CompleteTask("h0", op.id());
  Fetch("h1", op.id());
  Fetch("h2", op.id());
  ASSERT_TRUE(
      Report("h1", op.id(), v1::HOST_TASK_STATE_RUNNING, 8, "step 3 (receive from host h0)").ok());
  // h2 moves on every 5 s for 60 s; h1 keeps reporting the same bytes: it
  // waits (a busy host, or its own wait on a peer, which the agent bounds),
  // and the operation moves.
  for (int i = 1; i <= 12; ++i) {
    ASSERT_NO_FATAL_FAILURE(Pass(5000, {"h0", "h1", "h2"}));
    ASSERT_TRUE(
        Report("h1", op.id(), v1::HOST_TASK_STATE_RUNNING, 8, "step 3 (receive from host h0)")
            .ok());
    ASSERT_TRUE(Report("h2", op.id(), v1::HOST_TASK_STATE_RUNNING, i).ok());
    Tick();
    ASSERT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_TRANSFERRING) << i;
  }
  // Then nothing moves anywhere: a stall, named by its first waiting host.
  ASSERT_NO_FATAL_FAILURE(Pass(kStallMs, {"h0", "h1", "h2"}));
  ASSERT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_TRANSFERRING);
  ASSERT_NO_FATAL_FAILURE(Pass(1, {"h0", "h1", "h2"}));
  const v1::Operation after = Op(op.id());
  EXPECT_EQ(after.state(), v1::OPERATION_STATE_ABORTED);
  absl::StatusOr<std::vector<HostProgress>> rows = store_->GetHostProgress(op.id());
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->at(1).host_id, "h1");
  EXPECT_EQ(after.error(), absl::StrCat("host \"h1\" made no progress for 20001 ms, nor did any "
                                        "other host of the operation (stall_timeout_ms 20000): "
                                        "its task is at 8 of ",
                                        rows->at(1).bytes_total,
                                        " bytes, waiting on step 3 (receive from host h0)"));
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_ACTIVE);
}

TEST_F(LivenessTest, TaskNeverFetchedAborts) {
  const v1::Job job = Register(TwoLayerJob("never-fetched"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation op = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  CompleteTask("h0", op.id());
  CompleteTask("h1", op.id());
  ASSERT_NO_FATAL_FAILURE(Pass(kStallMs, {"h0", "h1", "h2"}));
  ASSERT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_TRANSFERRING);
  ASSERT_NO_FATAL_FAILURE(Pass(1, {"h0", "h1", "h2"}));
  const v1::Operation after = Op(op.id());
  EXPECT_EQ(after.state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_EQ(after.error(),
            "host \"h2\" made no progress for 20001 ms, nor did any other host of the operation "
            "(stall_timeout_ms 20000): its task was never fetched");
}

TEST_F(LivenessTest, TasksThatMoveOnAreNotStalled) {
  const v1::Job job = Register(TwoLayerJob("moves"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation op = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  for (const std::string h : {"h0", "h1", "h2"}) Fetch(h, op.id());
  for (int i = 1; i <= 6; ++i) {  // 90 s in all, each host moving every 15 s
    ASSERT_NO_FATAL_FAILURE(Pass(15000, {"h0", "h1", "h2"}));
    for (const std::string h : {"h0", "h1", "h2"}) {
      ASSERT_TRUE(Report(h, op.id(), v1::HOST_TASK_STATE_RUNNING, i).ok());
    }
  }
  Tick();
  EXPECT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_TRANSFERRING) << Op(op.id()).error();
}

TEST_F(LivenessTest, HostLeftOnlySendingProgressesWithItsPeers) {
  const v1::Job job = Register(TwoLayerJob("sends-last"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation op = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  for (const std::string h : {"h0", "h1", "h2"}) Fetch(h, op.id());
  absl::StatusOr<std::vector<HostProgress>> rows = store_->GetHostProgress(op.id());
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->at(1).host_id, "h1");
  const int64_t h1_total = rows->at(1).bytes_total;
  ASSERT_GT(h1_total, 0);
  // h1 wrote everything it writes and only sends from now on; h2 receives.
  ASSERT_TRUE(Report("h1", op.id(), v1::HOST_TASK_STATE_RUNNING, h1_total).ok());
  for (int i = 1; i <= 4; ++i) {  // 60 s
    ASSERT_NO_FATAL_FAILURE(Pass(15000, {"h0", "h1", "h2"}));
    ASSERT_TRUE(Report("h1", op.id(), v1::HOST_TASK_STATE_RUNNING, h1_total).ok());
    ASSERT_TRUE(Report("h2", op.id(), v1::HOST_TASK_STATE_RUNNING, i).ok());
    ASSERT_TRUE(Report("h0", op.id(), v1::HOST_TASK_STATE_RUNNING, 0).ok());
  }
  Tick();
  EXPECT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_TRANSFERRING) << Op(op.id()).error();
  // Once h2 stops moving too, the operation ends naming it.
  ASSERT_NO_FATAL_FAILURE(Pass(kStallMs + 1, {"h0", "h1", "h2"}));
  const v1::Operation after = Op(op.id());
  EXPECT_EQ(after.state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_THAT(after.error(), HasSubstr("made no progress for 20001 ms"));
}

TEST_F(LivenessTest, StallsCountFromANewLeadersStart) {
  const v1::Job job = Register(TwoLayerJob("resumed"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation op = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  clock_.Advance(kStallMs * 3);  // no leader meanwhile
  OperationDriver::Options options;
  options.stall_timeout_ms = kStallMs;
  options.lease_grace_ms = kLeaseMs;
  driver_ = MakeDriver(store_, options);
  ASSERT_TRUE(driver_->ResumeAll().ok());
  EXPECT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_TRANSFERRING);
}

// ---- Defect 4 (a): a new incarnation fails what its predecessor held --------

TEST_F(LivenessTest, RestartedAgentFailsTheTasksOfItsPreviousIncarnation) {
  const v1::Job job = Register(TwoLayerJob("restarts"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation op = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  // The sources finish (their bytes went to h2's first process), then h2
  // restarts before it fetched its task.
  CompleteTask("h0", op.id());
  CompleteTask("h1", op.id());
  const int64_t first_epoch = epochs_["h2"];
  RegisterAgents({"h2"});
  ASSERT_EQ(epochs_["h2"], first_epoch + 1);
  Tick();
  const v1::Operation after = Op(op.id());
  EXPECT_EQ(after.state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_THAT(after.error(), HasSubstr("host \"h2\": the agent restarted (epoch 1 -> 2)"));
  EXPECT_THAT(after.error(), HasSubstr("HOST_TASK_STATE_ASSIGNED"));

  // The retry commits with the new incarnation.
  const v1::Operation retry = StartTransfer(Job(job.id()), MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  for (const std::string h : {"h0", "h1", "h2"}) CompleteTask(h, retry.id());
  Tick();
  EXPECT_EQ(Op(retry.id()).state(), v1::OPERATION_STATE_COMMITTED) << Op(retry.id()).error();
}

TEST_F(LivenessTest, RestartKeepsTasksItsPreviousIncarnationFinished) {
  const v1::Job job = Register(TwoLayerJob("finished-first"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation op = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  CompleteTask("h0", op.id());
  RegisterAgents({"h0"});  // h0 was DONE: nothing of it is lost
  CompleteTask("h1", op.id());
  CompleteTask("h2", op.id());
  Tick();
  EXPECT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_COMMITTED) << Op(op.id()).error();
}

// ---- Defect 3: agents learn which of their jobs were deleted ----------------

TEST_F(LivenessTest, AgentsLearnWhichHeldJobsWereDeleted) {
  const v1::Job kept = Register(TwoLayerJob("kept"));
  const v1::Job gone = Register(TwoLayerJob("gone"));
  RegisterAgents({"h0", "h1"});
  v1::DeleteJobRequest del;
  del.set_job_id(gone.id());
  ASSERT_TRUE(api_->DeleteJob(del).ok());

  v1::HeartbeatRequest hb;
  hb.set_host_id("h0");
  hb.set_epoch(epochs_["h0"]);
  hb.add_held_jobs(kept.id());
  hb.add_held_jobs(gone.id());
  absl::StatusOr<v1::HeartbeatResponse> answer = agents_->Heartbeat(hb);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_THAT(answer->deleted_jobs(), ElementsAre(gone.id()));

  // An agent that was down learns it when it registers again.
  const v1::RegisterAgentResponse registered = RegisterHolding("h1", {}, {gone.id(), kept.id()});
  EXPECT_THAT(registered.deleted_jobs(), ElementsAre(gone.id()));
}

// An agent that was away while generations were released or discarded (and
// maybe pruned since) learns at registration which of its generations to
// drop: every one that is neither current nor pending.
TEST_F(LivenessTest, RegistrationReleasesGenerationsNoLongerCurrentOrPending) {
  const v1::Job job = CommittedJobWithLostHost();  // generation 2 current, 1 retired
  auto held = [&](int64_t generation) {
    v1::HeldRank h;
    h.set_job_id(job.id());
    h.set_generation(generation);
    h.set_rank(0);
    h.set_sealed(true);
    return h;
  };
  const v1::RegisterAgentResponse r = RegisterHolding("h0", {held(1), held(2), held(7)});
  std::vector<std::pair<std::string, int64_t>> released;
  for (const v1::GenerationRef& g : r.release()) released.emplace_back(g.job_id(), g.generation());
  EXPECT_THAT(released, ElementsAre(std::make_pair(job.id(), int64_t{1}),
                                    std::make_pair(job.id(), int64_t{7})));
}

// ---- Defect 6: a lost host that returns ------------------------------------

TEST_F(LivenessTest, LostHostBackWithIntactShardsMakesTheJobActive) {
  const v1::Job job = CommittedJobWithLostHost();
  EXPECT_EQ(MetricValue("reshard_coordinator_jobs", {{"state", "degraded"}}), 1);
  RegisterHolding("h2", IntactRanks(job, "h2"));
  const v1::Job back = Job(job.id());
  EXPECT_EQ(back.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_TRUE(back.lost_hosts().empty());
  clock_.Advance(1000);  // the gauges refresh at most once a second
  Tick();
  EXPECT_EQ(MetricValue("reshard_coordinator_jobs", {{"state", "degraded"}}), 0);
  EXPECT_EQ(MetricValue("reshard_coordinator_jobs", {{"state", "active"}}), 1);
}

TEST_F(LivenessTest, LostHostBackEmptyStaysLostAndRecoveryWorks) {
  const v1::Job job = CommittedJobWithLostHost();
  RegisterHolding("h2", {});
  const v1::Job still = Job(job.id());
  EXPECT_EQ(still.state(), v1::JOB_STATE_DEGRADED);
  EXPECT_THAT(still.lost_hosts(), ElementsAre("h2"));
  absl::StatusOr<v1::Host> h2 = store_->GetHost("h2");
  ASSERT_TRUE(h2.ok());
  EXPECT_EQ(h2->state(), v1::HOST_STATE_ALIVE);
  Tick();  // the driver does not forget it either
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_DEGRADED);

  // Recovery naming the returned host: h1 holds a replica of everything.
  v1::RecoverFromFailureRequest request;
  request.set_job_id(job.id());
  request.set_expected_generation(2);
  request.add_lost_hosts("h2");
  *request.mutable_target() = MakeLayout(1, 1, 2, {"h0", "h1"}, 1);
  absl::StatusOr<v1::Operation> op = api_->RecoverFromFailure(request);
  ASSERT_TRUE(op.ok()) << op.status();
  Tick();
  ASSERT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_TRANSFERRING) << Op(op->id()).error();
  for (const std::string& h : Participants(op->id())) CompleteTask(h, op->id());
  Tick();
  EXPECT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_COMMITTED) << Op(op->id()).error();
  const v1::Job recovered = Job(job.id());
  EXPECT_EQ(recovered.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_TRUE(recovered.lost_hosts().empty());
}

TEST_F(LivenessTest, LostHostBackWithAWrongChecksumStaysLost) {
  const v1::Job job = CommittedJobWithLostHost();
  std::vector<v1::HeldRank> held = IntactRanks(job, "h2");
  ASSERT_GT(held[0].checksums_size(), 0);
  held[0].set_checksums(held[0].checksums_size() - 1,
                        held[0].checksums(held[0].checksums_size() - 1) ^ 1);
  RegisterHolding("h2", held);
  const v1::Job still = Job(job.id());
  EXPECT_EQ(still.state(), v1::JOB_STATE_DEGRADED);
  EXPECT_THAT(still.lost_hosts(), ElementsAre("h2"));
}

}  // namespace
}  // namespace reshard::coordinator::testing
