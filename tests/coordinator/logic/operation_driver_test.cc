// OperationDriver against a real PostgreSQL, with the agents played through
// AgentApi and time through a fake clock: the whole flow to COMMITTED, and
// every way an operation ends otherwise.
#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "planner/layout.h"
#include "services/coordinator/logic/driver_hosts.h"
#include "services/coordinator/logic/task.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using test_support::MakeLayout;
using test_support::ReplicatedTwoLayerJob;
using test_support::TwoLayerJob;
using test_support::TwoLayerPtc;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

bool HasRef(const google::protobuf::RepeatedPtrField<v1::GenerationRef>& refs,
            const std::string& job_id, int64_t generation) {
  return std::any_of(refs.begin(), refs.end(), [&](const v1::GenerationRef& r) {
    return r.job_id() == job_id && r.generation() == generation;
  });
}

class OperationDriverTest : public LogicTest {};

TEST_P(OperationDriverTest, ResizeRunsToCommitted) {
  const v1::Job job = Register(TwoLayerJob("flow"));
  RegisterAgents({"h0", "h1", "h2", "h9"});
  // tp2 pp2 dp1 on h0,h1 -> tp1 pp2 dp2 on h1,h2: h0 only sends, h2 only
  // receives, h9 has nothing to do.
  const v1::Layout target = MakeLayout(1, 2, 2, {"h1", "h2"}, 2);
  absl::StatusOr<v1::Operation> created = ResizeTo(job, target);
  ASSERT_TRUE(created.ok()) << created.status();

  Tick();
  v1::Operation op = Op(created->id());
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_TRANSFERRING) << op.error();
  absl::StatusOr<v1::TransferPlan> plan =
      planner::PlanTransfer(TwoLayerPtc(), job.layout(), target, {});
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(MessageDifferencer::Equals(op.stats(), plan->stats()));
  EXPECT_EQ(op.bytes_total(), BytesTotal(*plan));
  EXPECT_EQ(op.to_generation(), 2);
  EXPECT_THAT(Participants(op.id()), UnorderedElementsAre("h0", "h1", "h2"));
  EXPECT_EQ(MetricValue("reshard_coordinator_planned_bytes_total", {{"locality", "cross_host"}}),
            plan->stats().bytes_cross_host());
  EXPECT_EQ(MetricValue("reshard_coordinator_planned_bytes_total", {{"locality", "local"}}),
            plan->stats().bytes_local());

  for (const std::string host : {"h0", "h1", "h2"}) {
    absl::StatusOr<v1::HeartbeatResponse> hb = Heartbeat(host);
    ASSERT_TRUE(hb.ok()) << hb.status();
    EXPECT_THAT(hb->assigned_operations(), ElementsAre(op.id())) << host;
  }
  EXPECT_TRUE(Heartbeat("h9")->assigned_operations().empty());

  // Each host gets only the steps it sends or receives, and its fills.
  const std::vector<v1::DeviceSlot> old_slots = planner::ExpandPlacement(job.layout().placement());
  const std::vector<v1::DeviceSlot> new_slots = planner::ExpandPlacement(target.placement());
  for (const std::string host : {"h0", "h1", "h2"}) {
    v1::GetTaskRequest get;
    get.set_host_id(host);
    get.set_operation_id(op.id());
    absl::StatusOr<v1::HostTask> task = agents_->GetTask(get);
    ASSERT_TRUE(task.ok()) << task.status();
    EXPECT_EQ(task->job_id(), job.id());
    EXPECT_EQ(task->from_generation(), 1);
    EXPECT_EQ(task->to_generation(), 2);
    EXPECT_TRUE(MessageDifferencer::Equals(task->ptc(), TwoLayerPtc()));
    EXPECT_EQ(task->plan().items_size(), plan->items_size());
    for (const v1::CopyStep& step : task->plan().steps()) {
      EXPECT_TRUE(old_slots[step.src_rank()].host() == host ||
                  new_slots[step.dsts(0).rank()].host() == host);
    }
    for (const v1::ZeroFill& fill : task->plan().zero_fills()) {
      EXPECT_EQ(new_slots[fill.rank()].host(), host);
    }
    EXPECT_EQ(task->peers_size(), 2);
    for (const v1::PeerHost& peer : task->peers()) {
      EXPECT_NE(peer.host_id(), host);
      EXPECT_EQ(peer.address(), peer.host_id() + ":7171");
      EXPECT_EQ(peer.ucx_address(), "ucx-" + peer.host_id());
      // What the peer advertises: the device communicator route needs it.
      EXPECT_THAT(peer.transports(), ElementsAre("ucx", "nccl"));
    }
  }
  EXPECT_GT(agents_
                ->GetTask([&] {
                  v1::GetTaskRequest r;
                  r.set_host_id("h0");
                  r.set_operation_id(op.id());
                  return r;
                }())
                ->plan()
                .steps_size(),
            0);
  v1::GetTaskRequest outsider;
  outsider.set_host_id("h9");
  outsider.set_operation_id(op.id());
  EXPECT_EQ(agents_->GetTask(outsider).status().code(), absl::StatusCode::kNotFound);

  // Progress, then DONE host by host; the commit waits for the last one.
  v1::ReportProgressRequest running;
  running.set_host_id("h2");
  running.set_operation_id(op.id());
  running.set_state(v1::HOST_TASK_STATE_RUNNING);
  running.set_bytes_done(16);
  ASSERT_TRUE(agents_->ReportProgress(running).ok());
  EXPECT_EQ(Op(op.id()).bytes_done(), 16);
  CompleteTask("h0", op.id());
  CompleteTask("h1", op.id());
  Tick();
  EXPECT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_TRANSFERRING);
  CompleteTask("h2", op.id());
  Tick();
  op = Op(op.id());
  EXPECT_EQ(op.state(), v1::OPERATION_STATE_COMMITTED) << op.error();
  EXPECT_EQ(op.bytes_done(), op.bytes_total());

  const v1::Job after = Job(job.id());
  EXPECT_EQ(after.generation(), 2);
  EXPECT_EQ(after.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_TRUE(after.active_operation_id().empty());
  EXPECT_TRUE(MessageDifferencer::Equals(after.layout(), target));
  absl::StatusOr<std::vector<v1::ShardChecksum>> sums = store_->GetGenerationChecksums(job.id(), 2);
  ASSERT_TRUE(sums.ok()) << sums.status();
  size_t shards = 0;
  for (const std::string host : {"h0", "h1", "h2"})
    shards += ShardsWrittenOnHost(*plan, host).size();
  EXPECT_EQ(sums->size(), shards);

  // Agents learn that generation 1 may be freed, and have nothing to do.
  absl::StatusOr<v1::HeartbeatResponse> hb = Heartbeat("h0");
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_TRUE(hb->assigned_operations().empty());
  EXPECT_TRUE(HasRef(hb->release(), job.id(), 1)) << hb->ShortDebugString();
  EXPECT_FALSE(HasRef(hb->discard(), job.id(), 2));
  EXPECT_EQ(MetricValue("reshard_coordinator_operations_total",
                        {{"kind", "resize"}, {"result", "committed"}}),
            1);

  // The next operation starts from generation 2.
  absl::StatusOr<v1::Operation> next = ResizeTo(after, MakeLayout(2, 2, 1, {"h1", "h2"}, 2));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->from_generation(), 2);
}

TEST_P(OperationDriverTest, FailedHostAbortsWithItsError) {
  const v1::Job job = Register(TwoLayerJob("host-fails"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation op = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  CompleteTask("h0", op.id());
  v1::ReportProgressRequest report;
  report.set_host_id("h2");
  report.set_operation_id(op.id());
  report.set_state(v1::HOST_TASK_STATE_FAILED);
  report.set_error("cudaMalloc: out of memory");
  ASSERT_TRUE(agents_->ReportProgress(report).ok());
  Tick();

  const v1::Operation after = Op(op.id());
  EXPECT_EQ(after.state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_EQ(after.error(), "host \"h2\": cudaMalloc: out of memory");
  const v1::Job j = Job(job.id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_EQ(j.generation(), 1);
  EXPECT_TRUE(MessageDifferencer::Equals(j.layout(), job.layout()));
  absl::StatusOr<v1::HeartbeatResponse> hb = Heartbeat("h1");
  ASSERT_TRUE(hb.ok());
  EXPECT_TRUE(HasRef(hb->discard(), job.id(), op.to_generation())) << hb->ShortDebugString();
  EXPECT_FALSE(HasRef(hb->release(), job.id(), 1));
  // The others learn to stop from their next report.
  report.set_host_id("h1");
  report.set_state(v1::HOST_TASK_STATE_RUNNING);
  EXPECT_TRUE(agents_->ReportProgress(report)->abort());
  EXPECT_EQ(MetricValue("reshard_coordinator_operations_total",
                        {{"kind", "resize"}, {"result", "aborted"}}),
            1);
}

TEST_P(OperationDriverTest, ExpiredLeaseAbortsTheTransferAndDegradesTheJob) {
  const v1::Job job = Register(TwoLayerJob("lease"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation op = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  // h0 and h2 heartbeat; h1 (in the current generation) goes silent.
  clock_.Advance(kLeaseMs / 2);
  ASSERT_TRUE(Heartbeat("h0").ok());
  ASSERT_TRUE(Heartbeat("h2").ok());
  Tick();
  EXPECT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_TRANSFERRING);
  clock_.Advance(kLeaseMs / 2 + 1);
  Tick();

  const v1::Operation after = Op(op.id());
  EXPECT_EQ(after.state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_EQ(after.error(), "host \"h1\" lost (lease expired) during transfer");
  const v1::Job j = Job(job.id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_DEGRADED);
  EXPECT_THAT(j.lost_hosts(), ElementsAre("h1"));
  EXPECT_EQ(j.generation(), 1);
  absl::StatusOr<v1::Host> h1 = store_->GetHost("h1");
  ASSERT_TRUE(h1.ok());
  EXPECT_EQ(h1->state(), v1::HOST_STATE_LOST);
  // The silent agent must register again.
  EXPECT_EQ(Heartbeat("h1").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MetricValue("reshard_coordinator_hosts", {{"state", "lost"}}), 1);
  EXPECT_EQ(MetricValue("reshard_coordinator_jobs_with_lost_hosts", {}), 1);
  EXPECT_EQ(MetricValue("reshard_coordinator_jobs", {{"state", "degraded"}}), 1);
}

TEST_P(OperationDriverTest, ExpiredLeaseDegradesAnIdleJob) {
  const v1::Job job = Register(TwoLayerJob("idle"));
  const v1::Job elsewhere = Register(TwoLayerJob("elsewhere"));
  (void)elsewhere;
  RegisterAgents({"h0", "h1"});
  clock_.Advance(kLeaseMs - 1);
  ASSERT_TRUE(Heartbeat("h0").ok());
  Tick();
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_ACTIVE);
  clock_.Advance(2);
  Tick();
  const v1::Job j = Job(job.id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_DEGRADED);
  EXPECT_THAT(j.lost_hosts(), ElementsAre("h1"));
}

TEST_P(OperationDriverTest, RecoverFromALostHostWithReplicasCommits) {
  const v1::Job job = Register(ReplicatedTwoLayerJob("replicas"));
  RegisterAgents({"h0", "h1", "h2"});
  clock_.Advance(kLeaseMs / 2);
  ASSERT_TRUE(Heartbeat("h0").ok());
  ASSERT_TRUE(Heartbeat("h2").ok());
  clock_.Advance(kLeaseMs / 2 + 1);
  Tick();
  ASSERT_EQ(Job(job.id()).state(), v1::JOB_STATE_DEGRADED);

  v1::RecoverFromFailureRequest request;
  request.set_job_id(job.id());
  request.set_expected_generation(1);
  request.add_lost_hosts("h1");
  *request.mutable_target() = MakeLayout(1, 1, 2, {"h0", "h2"}, 1);
  absl::StatusOr<v1::Operation> op = api_->RecoverFromFailure(request);
  ASSERT_TRUE(op.ok()) << op.status();
  Tick();
  ASSERT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_TRANSFERRING) << Op(op->id()).error();
  // The lost host has no part in its own recovery.
  EXPECT_THAT(Participants(op->id()), UnorderedElementsAre("h0", "h2"));
  CompleteTask("h0", op->id());
  CompleteTask("h2", op->id());
  Tick();
  EXPECT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_COMMITTED) << Op(op->id()).error();
  const v1::Job j = Job(job.id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_TRUE(j.lost_hosts().empty());
  EXPECT_EQ(j.generation(), 2);
}

TEST_P(OperationDriverTest, LostDataFailsNamingTheTensors) {
  // tp2 pp2 dp1: h1 holds the only copy of stage 1 (layer 1, final norm).
  const v1::Job job = Register(TwoLayerJob("no-replica"));
  RegisterAgents({"h0", "h2"});
  v1::RecoverFromFailureRequest request;
  request.set_job_id(job.id());
  request.set_expected_generation(1);
  request.add_lost_hosts("h1");
  *request.mutable_target() = MakeLayout(2, 2, 1, {"h0", "h2"}, 2);
  absl::StatusOr<v1::Operation> op = api_->RecoverFromFailure(request);
  ASSERT_TRUE(op.ok()) << op.status();
  Tick();
  const v1::Operation after = Op(op->id());
  EXPECT_EQ(after.state(), v1::OPERATION_STATE_FAILED);
  for (const char* lost : {"layers.1.qkv", "layers.1.proj", "layers.1.norm",
                           "optimizer.layers.1.exp_avg", "final_norm", "rng"}) {
    EXPECT_THAT(after.error(), HasSubstr(absl::StrCat("\"", lost, "\""))) << lost;
  }
  EXPECT_THAT(after.error(), ::testing::Not(HasSubstr("\"layers.0.qkv\"")));
  const v1::Job j = Job(job.id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_ACTIVE);
  EXPECT_EQ(j.generation(), 1);
  EXPECT_EQ(MetricValue("reshard_coordinator_operations_total",
                        {{"kind", "recover"}, {"result", "failed"}}),
            1);
}

TEST_P(OperationDriverTest, HostWithoutAgentAborts) {
  const v1::Job job = Register(TwoLayerJob("no-agent"));
  RegisterAgents({"h0", "h1"});  // h3 never registers
  absl::StatusOr<v1::Operation> op = ResizeTo(job, MakeLayout(2, 2, 1, {"h0", "h3"}, 2));
  ASSERT_TRUE(op.ok()) << op.status();
  Tick();
  const v1::Operation after = Op(op->id());
  EXPECT_EQ(after.state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_THAT(after.error(), HasSubstr("host \"h3\" has no live agent"));
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_ACTIVE);
}

TEST_P(OperationDriverTest, TransferTimesOut) {
  OperationDriver::Options options;
  options.transfer_timeout_ms = 60000;
  options.stall_timeout_ms = 10 * 60000;  // no task reports here: only the transfer timeout
  driver_ = MakeDriver(store_, options);
  const v1::Job job = Register(TwoLayerJob("slow"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation op = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  for (int i = 0; i < 7; ++i) {  // 70 s, heartbeating all along
    clock_.Advance(kLeaseMs);
    for (const std::string host : {"h0", "h1", "h2"}) ASSERT_TRUE(Heartbeat(host).ok());
    Tick();
  }
  const v1::Operation after = Op(op.id());
  EXPECT_EQ(after.state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_THAT(after.error(), HasSubstr("over transfer_timeout_ms 60000"));
}

TEST_P(OperationDriverTest, GaugesShowActiveOperationsAndTheOldestAge) {
  OperationDriver::Options options;
  options.transfer_timeout_ms = 60000;
  options.stall_timeout_ms = 10 * 60000;  // no task reports here: only the transfer timeout
  driver_ = MakeDriver(store_, options);
  const v1::Job job = Register(TwoLayerJob("gauged"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation op = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  for (int i = 0; i < 2; ++i) {
    clock_.Advance(kLeaseMs);
    for (const std::string host : {"h0", "h1", "h2"}) ASSERT_TRUE(Heartbeat(host).ok());
    Tick();
  }
  ASSERT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_TRANSFERRING);
  EXPECT_EQ(MetricValue("reshard_coordinator_active_operations", {{"state", "transferring"}}), 1);
  EXPECT_EQ(MetricValue("reshard_coordinator_active_operations", {{"state", "pending"}}), 0);
  EXPECT_EQ(MetricValue("reshard_coordinator_oldest_active_operation_seconds", {}),
            (clock_.NowUnixMs() - Op(op.id()).created_unix_ms()) / 1000.0);
  EXPECT_GT(MetricValue("reshard_coordinator_oldest_active_operation_seconds", {}),
            kLeaseMs / 1000.0);

  for (int i = 0; i < 7; ++i) {  // past the transfer timeout: ABORTED
    clock_.Advance(kLeaseMs);
    for (const std::string host : {"h0", "h1", "h2"}) ASSERT_TRUE(Heartbeat(host).ok());
    Tick();
  }
  ASSERT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_EQ(MetricValue("reshard_coordinator_active_operations", {{"state", "transferring"}}), 0);
  EXPECT_EQ(MetricValue("reshard_coordinator_oldest_active_operation_seconds", {}), 0);
}

TEST_P(OperationDriverTest, NewDriverResumesAfterRestart) {
  const v1::Job job = Register(TwoLayerJob("restart"));
  const v1::Job pending_job = Register(TwoLayerJob("restart-pending"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation op = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  absl::StatusOr<v1::Operation> pending =
      ResizeTo(pending_job, MakeLayout(2, 2, 1, {"h1", "h2"}, 2));
  ASSERT_TRUE(pending.ok()) << pending.status();
  CompleteTask("h0", op.id());

  // "Restart": nothing of the old driver or its store survives.
  driver_.reset();
  api_.reset();
  agents_.reset();
  store_.reset();
  store_ = ConnectStore();
  agents_ = std::make_unique<AgentApi>(store_, &clock_, nullptr, AgentApi::Options{kLeaseMs});
  api_ = std::make_unique<SchedulerApi>(store_, &clock_, nullptr, SchedulerApi::Options());
  std::unique_ptr<OperationDriver> driver = MakeDriver(store_);
  ASSERT_TRUE(driver->ResumeAll().ok());
  EXPECT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_TRANSFERRING);
  EXPECT_EQ(Op(pending->id()).state(), v1::OPERATION_STATE_TRANSFERRING);

  CompleteTask("h1", op.id());
  CompleteTask("h2", op.id());
  ASSERT_TRUE(driver->Tick().ok());
  EXPECT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_COMMITTED);
  EXPECT_EQ(Job(job.id()).generation(), 2);
}

TEST_P(OperationDriverTest, NewLeaderGivesAgentsALeaseBeforeMarkingThemLost) {
  const v1::Job job = Register(TwoLayerJob("grace"));
  RegisterAgents({"h0", "h1"});
  // No coordinator for longer than a lease: every lease has run out.
  clock_.Advance(3 * kLeaseMs);
  ASSERT_TRUE(driver_->ResumeAll().ok());
  Tick();
  EXPECT_EQ(store_->GetHost("h0")->state(), v1::HOST_STATE_ALIVE);
  ASSERT_TRUE(Heartbeat("h0").ok());
  clock_.Advance(kLeaseMs / 2);
  ASSERT_TRUE(Heartbeat("h0").ok());
  clock_.Advance(kLeaseMs / 2 + 1);
  Tick();
  EXPECT_EQ(store_->GetHost("h0")->state(), v1::HOST_STATE_ALIVE);
  EXPECT_EQ(store_->GetHost("h1")->state(), v1::HOST_STATE_LOST);
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_DEGRADED);
}

// ---- Busy is not dead (issue 32): the leader doubts itself first ----------

TEST_P(OperationDriverTest, MostHostsExpiringTogetherAreDeferredOneLeaseThenLost) {
  const v1::Job job = Register(TwoLayerJob("mass"));
  RegisterAgents({"h0", "h1", "h2", "h3"});
  // Only h0 heartbeats: three of four leases end in the same pass.
  clock_.Advance(kLeaseMs / 2);
  ASSERT_TRUE(Heartbeat("h0").ok());
  clock_.Advance(kLeaseMs / 2 + 1);
  Tick();
  for (const std::string h : {"h1", "h2", "h3"}) {
    EXPECT_EQ(store_->GetHost(h)->state(), v1::HOST_STATE_ALIVE) << h;
  }
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_ACTIVE);
  EXPECT_EQ(MetricValue("reshard_coordinator_lease_judgement_suspended_total",
                        {{"reason", "mass_expiry"}}),
            1);
  EXPECT_EQ(MetricValue("reshard_coordinator_lease_judgement_suspended", {}), 1);
  // h1 and h2 were only cut off: they beat again within the deferral.
  clock_.Advance(kLeaseMs / 2);
  for (const std::string h : {"h0", "h1", "h2"}) ASSERT_TRUE(Heartbeat(h).ok()) << h;
  Tick();  // h3 alone of four is no mass expiry: judged at once
  EXPECT_EQ(store_->GetHost("h3")->state(), v1::HOST_STATE_LOST);
  for (const std::string h : {"h0", "h1", "h2"}) {
    EXPECT_EQ(store_->GetHost(h)->state(), v1::HOST_STATE_ALIVE) << h;
  }
  EXPECT_EQ(MetricValue("reshard_coordinator_lease_judgement_suspended", {}), 0);
}

TEST_P(OperationDriverTest, AMassExpiryThatStaysSilentIsLostAfterOneMoreLease) {
  RegisterAgents({"h0", "h1", "h2"});
  clock_.Advance(kLeaseMs + 1);
  Tick();  // every lease ended at once: deferred
  EXPECT_EQ(store_->GetHost("h0")->state(), v1::HOST_STATE_ALIVE);
  clock_.Advance(kLeaseMs);
  Tick();  // deferred for exactly one lease: still deferred
  EXPECT_EQ(store_->GetHost("h0")->state(), v1::HOST_STATE_ALIVE);
  clock_.Advance(1);
  Tick();
  for (const std::string h : {"h0", "h1", "h2"}) {
    EXPECT_EQ(store_->GetHost(h)->state(), v1::HOST_STATE_LOST) << h;
  }
}

TEST_P(OperationDriverTest, ALatePassJudgesNoLeaseUntilOneHeartbeatPeriodLater) {
  OperationDriver::Options options;
  options.tick_ms = 200;
  driver_ = MakeDriver(store_, options);
  ASSERT_TRUE(driver_->ResumeAll().ok());
  RegisterAgents({"h0", "h1"});
  // Past the new leader's grace (one lease), passes on time.
  for (int i = 0; i < kLeaseMs / 200 + 5; ++i) {
    ASSERT_TRUE(Heartbeat("h0").ok());
    ASSERT_TRUE(Heartbeat("h1").ok());
    clock_.Advance(200);
    Tick();
  }
  // This process did not run for 8 s (a lease is 10): h1's beat of that
  // time was never recorded, its lease ended meanwhile.
  ASSERT_TRUE(Heartbeat("h0").ok());
  clock_.Advance(8000);
  ASSERT_TRUE(Heartbeat("h0").ok());
  clock_.Advance(2000);
  Tick();
  EXPECT_EQ(store_->GetHost("h1")->state(), v1::HOST_STATE_ALIVE);
  EXPECT_EQ(MetricValue("reshard_coordinator_lease_judgement_suspended_total",
                        {{"reason", "late_pass"}}),
            1);
  // Passes on time again: h1's queued beat arrives, it lives.
  ASSERT_TRUE(Heartbeat("h1").ok());
  for (int i = 0; i < 20; ++i) {
    clock_.Advance(200);
    ASSERT_TRUE(Heartbeat("h0").ok());
    Tick();
  }
  EXPECT_EQ(store_->GetHost("h1")->state(), v1::HOST_STATE_ALIVE);
  EXPECT_EQ(MetricValue("reshard_coordinator_lease_judgement_suspended", {}), 0);
  // A host that really went silent is still found: one lease after its
  // last beat (and a pass).
  for (int i = 0; i < kLeaseMs / 200 + 1; ++i) {
    clock_.Advance(200);
    ASSERT_TRUE(Heartbeat("h0").ok());
    Tick();
  }
  EXPECT_EQ(store_->GetHost("h1")->state(), v1::HOST_STATE_LOST);
  EXPECT_EQ(store_->GetHost("h0")->state(), v1::HOST_STATE_ALIVE);
}

TEST_P(OperationDriverTest, HeartbeatsWaitingToBeRecordedSuspendJudgement) {
  int64_t backlog_ms = 0;
  OperationDriver::Options options;
  options.heartbeat_lag_ms = [&backlog_ms] { return backlog_ms; };
  driver_ = MakeDriver(store_, options);
  RegisterAgents({"h0", "h1"});
  clock_.Advance(kLeaseMs / 2);
  ASSERT_TRUE(Heartbeat("h0").ok());
  clock_.Advance(kLeaseMs / 2 + 1);
  backlog_ms = kLeaseMs / 4 + 1;  // h1's beat waits in the batcher
  Tick();
  EXPECT_EQ(store_->GetHost("h1")->state(), v1::HOST_STATE_ALIVE);
  EXPECT_EQ(MetricValue("reshard_coordinator_lease_judgement_suspended_total",
                        {{"reason", "heartbeat_backlog"}}),
            1);
  // Recorded: h1 lives. Then it goes silent for real and is judged.
  ASSERT_TRUE(Heartbeat("h1").ok());
  backlog_ms = 0;
  Tick();
  EXPECT_EQ(store_->GetHost("h1")->state(), v1::HOST_STATE_ALIVE);
  clock_.Advance(kLeaseMs / 2);
  ASSERT_TRUE(Heartbeat("h0").ok());
  clock_.Advance(kLeaseMs / 2 + 1);
  Tick();
  EXPECT_EQ(store_->GetHost("h1")->state(), v1::HOST_STATE_LOST);
}

TEST_P(OperationDriverTest, TwoDriversRacingCommitEachOperationOnce) {
  constexpr int kJobs = 4;
  RegisterAgents({"h0", "h1", "h2"});
  std::vector<std::string> ops;
  for (int i = 0; i < kJobs; ++i) {
    const v1::Job job = Register(TwoLayerJob("race-" + std::to_string(i)));
    absl::StatusOr<v1::Operation> op = ResizeTo(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
    ASSERT_TRUE(op.ok()) << op.status();
    ops.push_back(op->id());
  }
  std::unique_ptr<OperationDriver> other = MakeDriver(ConnectStore());
  std::atomic<int> errors{0};
  auto run = [&](OperationDriver* driver) {
    for (int i = 0; i < 20; ++i) {
      if (!driver->Tick().ok()) ++errors;
    }
  };
  std::thread a(run, driver_.get());
  std::thread b(run, other.get());
  a.join();
  b.join();
  EXPECT_EQ(errors, 0);
  for (const std::string& id : ops) {
    ASSERT_EQ(Op(id).state(), v1::OPERATION_STATE_TRANSFERRING) << Op(id).error();
    for (const std::string& host : Participants(id)) CompleteTask(host, id);
  }
  std::thread c(run, driver_.get());
  std::thread d(run, other.get());
  c.join();
  d.join();
  EXPECT_EQ(errors, 0);
  for (const std::string& id : ops) {
    const v1::Operation op = Op(id);
    EXPECT_EQ(op.state(), v1::OPERATION_STATE_COMMITTED) << op.error();
    EXPECT_EQ(Job(op.job_id()).generation(), 2);
  }
  EXPECT_EQ(MetricValue("reshard_coordinator_operations_total",
                        {{"kind", "resize"}, {"result", "committed"}}),
            kJobs);
}

// The driver's copy of the hosts' states (driver_hosts.h): every host is
// read at most once per period; a host the copy does not show ALIVE is read
// again, alone, before a step acts on it.
TEST_P(OperationDriverTest, HostsAreReadWholeOncePerPeriodAndDoubtsOneByOne) {
  RegisterAgents({"h0", "h1"});
  DriverHosts hosts(store_.get(), /*refresh_ms=*/1000);
  ASSERT_TRUE(hosts.Refresh(5000, /*force=*/false).ok());
  ASSERT_TRUE(hosts.Refresh(5999, /*force=*/false).ok());
  EXPECT_EQ(hosts.full_reads(), 1);
  EXPECT_EQ(hosts.alive(), 2);
  EXPECT_EQ(*hosts.StateOf("h0"), std::optional<v1::HostState>(v1::HOST_STATE_ALIVE));
  EXPECT_EQ(hosts.host_reads(), 0);

  RegisterAgents({"h2"});  // after the copy was read
  EXPECT_EQ(*hosts.StateOf("h2"), std::optional<v1::HostState>(v1::HOST_STATE_ALIVE));
  EXPECT_EQ(*hosts.StateOf("h2"), std::optional<v1::HostState>(v1::HOST_STATE_ALIVE));
  EXPECT_EQ(hosts.host_reads(), 1);
  EXPECT_EQ(*hosts.StateOf("h9"), std::nullopt);  // never registered
  EXPECT_EQ(hosts.host_reads(), 2);

  // Marked LOST in the copy, but registered again in the store since.
  hosts.MarkLost("h1");
  EXPECT_EQ(hosts.alive(), 2);
  EXPECT_EQ(*hosts.StateOf("h1"), std::optional<v1::HostState>(v1::HOST_STATE_ALIVE));
  EXPECT_EQ(hosts.host_reads(), 3);

  ASSERT_TRUE(hosts.Refresh(6000, /*force=*/false).ok());
  ASSERT_TRUE(hosts.Refresh(6001, /*force=*/true).ok());
  EXPECT_EQ(hosts.full_reads(), 3);
  EXPECT_EQ(hosts.all().size(), 3u);
}

// A target host that registers after the driver last read every host is
// found when the operation starts (not "never registered").
TEST_P(OperationDriverTest, AHostRegisteredSinceTheLastFullReadTakesPart) {
  RegisterAgents({"h0", "h1"});
  const v1::Job job = Register(ReplicatedTwoLayerJob("late-host"));
  Tick();  // reads every host: h0, h1
  RegisterAgents({"h2"});
  const v1::Operation op = *ResizeTo(job, MakeLayout(1, 1, 2, {"h1", "h2"}, 1));
  Tick();
  Tick();
  EXPECT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_TRANSFERRING) << Op(op.id()).error();
  EXPECT_THAT(Participants(op.id()), ::testing::Contains("h2"));
}

RESHARD_LOGIC_ON_BOTH_STORES(OperationDriverTest);

}  // namespace
}  // namespace reshard::coordinator::testing
