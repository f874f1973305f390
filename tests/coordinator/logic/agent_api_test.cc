// AgentApi against a real PostgreSQL: registration and epochs, heartbeats
// and leases, GetTask's checks, and ReportProgress's checks of states and
// checksums.
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/logic/ids.h"
#include "services/coordinator/logic/task.h"
#include "services/coordinator/store/memory_store.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::MakeLayout;
using test_support::TwoLayerJob;
using ::testing::HasSubstr;

class AgentApiTest : public LogicTest {
 protected:
  v1::ReportProgressRequest Report(const std::string& host, const std::string& op,
                                   v1::HostTaskState state) {
    v1::ReportProgressRequest r;
    r.set_host_id(host);
    r.set_operation_id(op);
    r.set_state(state);
    return r;
  }

  /// A DONE report with a checksum for each shard `host` writes.
  v1::ReportProgressRequest DoneReport(const std::string& host, const v1::Operation& op) {
    v1::ReportProgressRequest r = Report(host, op.id(), v1::HOST_TASK_STATE_DONE);
    absl::StatusOr<OperationRecord> record = store_->GetOperation(op.id(), true);
    EXPECT_TRUE(record.ok() && record->plan.has_value());
    for (const auto& [item, rank] : ShardsWrittenOnHost(*record->plan, host)) {
      v1::ShardChecksum* sum = r.add_checksums();
      sum->set_item(item);
      sum->set_rank(rank);
      sum->set_checksum(item * 1000 + rank);
      sum->set_bytes(4);
    }
    return r;
  }
};

TEST_F(AgentApiTest, RegisterAgentStartsALeaseAndCountsEpochs) {
  v1::RegisterAgentRequest request;
  EXPECT_THAT(agents_->RegisterAgent(request).status().message(),
              HasSubstr("host.host_id is empty"));
  request.mutable_host()->set_host_id("h0");
  request.mutable_host()->set_address("h0:7171");
  absl::StatusOr<v1::RegisterAgentResponse> first = agents_->RegisterAgent(request);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->lease_ms(), kLeaseMs);
  absl::StatusOr<v1::RegisterAgentResponse> second = agents_->RegisterAgent(request);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->epoch(), first->epoch() + 1);
  absl::StatusOr<v1::Host> host = store_->GetHost("h0");
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(host->state(), v1::HOST_STATE_ALIVE);
  EXPECT_EQ(host->address(), "h0:7171");
  EXPECT_EQ(host->lease_expires_unix_ms(), clock_.NowUnixMs() + kLeaseMs);
}

TEST_F(AgentApiTest, HeartbeatExtendsTheLeaseOfTheLatestEpochOnly) {
  RegisterAgents({"h0"});
  clock_.Advance(1000);
  absl::StatusOr<v1::HeartbeatResponse> hb = Heartbeat("h0");
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(hb->lease_ms(), kLeaseMs);
  EXPECT_EQ(store_->GetHost("h0")->lease_expires_unix_ms(), clock_.NowUnixMs() + kLeaseMs);

  v1::HeartbeatRequest request;
  request.set_host_id("h0");
  request.set_epoch(epochs_["h0"] + 5);
  EXPECT_EQ(agents_->Heartbeat(request).status().code(), absl::StatusCode::kFailedPrecondition);
  request.set_epoch(0);
  EXPECT_EQ(agents_->Heartbeat(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.set_host_id("nobody");
  request.set_epoch(1);
  EXPECT_EQ(agents_->Heartbeat(request).status().code(), absl::StatusCode::kNotFound);
  request.clear_host_id();
  EXPECT_EQ(agents_->Heartbeat(request).status().code(), absl::StatusCode::kInvalidArgument);

  // An older process of the host, after a newer one registered.
  const int64_t old_epoch = epochs_["h0"];
  RegisterAgents({"h0"});
  request.set_host_id("h0");
  request.set_epoch(old_epoch);
  EXPECT_EQ(agents_->Heartbeat(request).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Heartbeat("h0").ok());
}

TEST_F(AgentApiTest, LostHostMustRegisterAgain) {
  RegisterAgents({"h0"});
  clock_.Advance(kLeaseMs + 1);
  Tick();
  EXPECT_EQ(Heartbeat("h0").status().code(), absl::StatusCode::kFailedPrecondition);
  RegisterAgents({"h0"});
  EXPECT_TRUE(Heartbeat("h0").ok());
  EXPECT_EQ(store_->GetHost("h0")->state(), v1::HOST_STATE_ALIVE);
}

TEST_F(AgentApiTest, GetTaskChecks) {
  const v1::Job job = Register(TwoLayerJob("tasks"));
  RegisterAgents({"h0", "h1", "h2"});
  absl::StatusOr<v1::Operation> pending = ResizeTo(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(pending.ok());
  v1::GetTaskRequest request;
  request.set_host_id("h1");
  request.set_operation_id(pending->id());
  EXPECT_THAT(agents_->GetTask(request).status().message(),
              HasSubstr("is PENDING, not TRANSFERRING"));
  EXPECT_EQ(agents_->GetTask(request).status().code(), absl::StatusCode::kFailedPrecondition);
  request.set_operation_id(NewId());
  EXPECT_EQ(agents_->GetTask(request).status().code(), absl::StatusCode::kNotFound);
  request.clear_operation_id();
  EXPECT_EQ(agents_->GetTask(request).status().code(), absl::StatusCode::kInvalidArgument);
}

// A host's final DONE report timed out at the agent but was recorded, the
// operation committed, and the agent retries it (PostgreSQL was slow or
// frozen): the retry is answered as taken, not "abort", which would make the
// agent drop the committed generation's buffers. A report that is not that
// retry still aborts.
TEST_F(AgentApiTest, ARetriedDoneOfACommittedOperationIsNotAnAbort) {
  const v1::Job job = Register(TwoLayerJob("retried-done"));
  RegisterAgents({"h0", "h1", "h2"});
  absl::StatusOr<v1::Operation> created = ResizeTo(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(created.ok()) << created.status();
  Tick();
  for (const std::string& host : Participants(created->id())) CompleteTask(host, created->id());
  Tick();
  ASSERT_EQ(Op(created->id()).state(), v1::OPERATION_STATE_COMMITTED);

  auto report = [&](const std::string& host, v1::HostTaskState state) {
    v1::ReportProgressRequest r;
    r.set_host_id(host);
    r.set_operation_id(created->id());
    r.set_state(state);
    absl::StatusOr<v1::ReportProgressResponse> reply = agents_->ReportProgress(r);
    EXPECT_TRUE(reply.ok()) << host << ": " << reply.status();
    return reply.ok() && reply->abort();
  };
  EXPECT_FALSE(report("h2", v1::HOST_TASK_STATE_DONE));
  EXPECT_TRUE(report("h2", v1::HOST_TASK_STATE_RUNNING));
  EXPECT_TRUE(report("h9", v1::HOST_TASK_STATE_DONE));  // no task of it
  EXPECT_EQ(Job(job.id()).generation(), 2);
}

TEST_F(AgentApiTest, ReportProgressChecksStatesAndChecksums) {
  const v1::Job job = Register(TwoLayerJob("reports"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation op = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  const DatabaseSnapshot before = Snapshot();

  EXPECT_EQ(
      agents_->ReportProgress(Report("h1", op.id(), v1::HOST_TASK_STATE_ASSIGNED)).status().code(),
      absl::StatusCode::kInvalidArgument);
  v1::ReportProgressRequest negative = Report("h1", op.id(), v1::HOST_TASK_STATE_RUNNING);
  negative.set_bytes_done(-1);
  EXPECT_EQ(agents_->ReportProgress(negative).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      agents_->ReportProgress(Report("h9", op.id(), v1::HOST_TASK_STATE_RUNNING)).status().code(),
      absl::StatusCode::kNotFound);
  EXPECT_EQ(
      agents_->ReportProgress(Report("h1", NewId(), v1::HOST_TASK_STATE_RUNNING)).status().code(),
      absl::StatusCode::kNotFound);

  // DONE must vouch for exactly the shards written on the host.
  v1::ReportProgressRequest done = DoneReport("h1", op);
  ASSERT_GT(done.checksums_size(), 1);
  v1::ReportProgressRequest missing = done;
  missing.mutable_checksums()->RemoveLast();
  EXPECT_THAT(agents_->ReportProgress(missing).status().message(),
              HasSubstr("no checksum for item"));
  v1::ReportProgressRequest twice = done;
  *twice.add_checksums() = done.checksums(0);
  EXPECT_THAT(agents_->ReportProgress(twice).status().message(), HasSubstr("given twice"));
  v1::ReportProgressRequest foreign = done;
  foreign.mutable_checksums(0)->set_rank(99);
  EXPECT_THAT(agents_->ReportProgress(foreign).status().message(),
              HasSubstr("is not a shard the plan writes on host \"h1\""));
  EXPECT_EQ(agents_->ReportProgress(foreign).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Snapshot() == before);

  ASSERT_TRUE(agents_->ReportProgress(done).ok());
  // A resent DONE (its reply was lost) is fine; changing its mind is not.
  absl::StatusOr<v1::ReportProgressResponse> again = agents_->ReportProgress(done);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->abort());
  EXPECT_EQ(
      agents_->ReportProgress(Report("h1", op.id(), v1::HOST_TASK_STATE_FAILED)).status().code(),
      absl::StatusCode::kFailedPrecondition);
  // Its operation is no longer assigned to it.
  EXPECT_TRUE(Heartbeat("h1")->assigned_operations().empty());
  EXPECT_EQ(Heartbeat("h2")->assigned_operations_size(), 1);

  // A host that only sends writes nothing and reports no checksums.
  ASSERT_TRUE(agents_->ReportProgress(DoneReport("h0", op)).ok());
}

TEST_F(AgentApiTest, ProgressIsBoundedByTheHostsBytes) {
  const v1::Job job = Register(TwoLayerJob("bytes"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation op = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  v1::ReportProgressRequest running = Report("h2", op.id(), v1::HOST_TASK_STATE_RUNNING);
  running.set_bytes_done(int64_t{1} << 40);
  ASSERT_TRUE(agents_->ReportProgress(running).ok());
  absl::StatusOr<std::vector<HostProgress>> rows = store_->GetHostProgress(op.id());
  ASSERT_TRUE(rows.ok());
  for (const HostProgress& row : *rows) {
    if (row.host_id == "h2") {
      EXPECT_EQ(row.bytes_done, row.bytes_total);
      EXPECT_GT(row.bytes_total, 0);
    }
  }
}

// The in-memory store with a hook that runs once, before the next DONE is
// recorded (what another request does in that window), and a failure of the
// next read of host progress.
class HookedMemoryStore : public MemoryStore {
 public:
  void BeforeRecordingDone(std::function<void()> hook) { hook_ = std::move(hook); }
  void FailNextHostProgressRead(absl::Status error) { progress_error_ = std::move(error); }

  absl::Status RecordHostProgress(const std::string& operation_id, const HostProgress& progress,
                                  const std::vector<v1::ShardChecksum>& checksums) override {
    if (hook_ && progress.state == v1::HOST_TASK_STATE_DONE) std::exchange(hook_, nullptr)();
    return MemoryStore::RecordHostProgress(operation_id, progress, checksums);
  }
  absl::StatusOr<std::vector<HostProgress>> GetHostProgress(
      const std::string& operation_id) override {
    if (!progress_error_.ok()) return std::exchange(progress_error_, absl::OkStatus());
    return MemoryStore::GetHostProgress(operation_id);
  }

 private:
  std::function<void()> hook_;
  absl::Status progress_error_;
};

class AgentApiRaceTest : public LogicTest {
 protected:
  void SetUp() override {
    memory_store_ = true;
    ASSERT_NO_FATAL_FAILURE(LogicTest::SetUp());
    hooked_ = std::make_shared<HookedMemoryStore>();
    memory_database_ = hooked_;
    store_ = hooked_;
    api_ = std::make_unique<SchedulerApi>(store_, &clock_, metrics_.get(), SchedulerApi::Options());
    AgentApi::Options agent_options;
    agent_options.lease_ms = kLeaseMs;
    agents_ = std::make_unique<AgentApi>(store_, &clock_, metrics_.get(), agent_options);
    driver_ = MakeDriver(store_);
  }

  std::shared_ptr<HookedMemoryStore> hooked_;
};

// An agent's DONE timed out (PostgreSQL frozen) and its retry raced the
// first attempt: the retry read the operation TRANSFERRING, then, before it
// recorded, the first attempt was recorded and the operation committed. The
// retry is answered as taken, not "abort" (on which the agent would drop the
// committed generation: tests/fault's resize across a frozen PostgreSQL lost
// a rank so in ci44).
TEST_F(AgentApiRaceTest, ADoneRetryThatLosesTheRaceToItsFirstAttemptIsNotAnAbort) {
  const v1::Job job = Register(TwoLayerJob("raced-done"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation op = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_FALSE(op.id().empty());
  const std::vector<std::string> hosts = Participants(op.id());
  ASSERT_GE(hosts.size(), 2u);
  const std::string last = hosts.back();
  for (const std::string& host : hosts) {
    if (host != last) CompleteTask(host, op.id());
  }
  bool raced = false;
  hooked_->BeforeRecordingDone([&] {
    CompleteTask(last, op.id());  // the first attempt
    Tick();
    raced = Op(op.id()).state() == v1::OPERATION_STATE_COMMITTED;
  });
  CompleteTask(last, op.id());  // the retry: EXPECT_FALSE(abort) inside
  EXPECT_TRUE(raced);
  EXPECT_EQ(Job(job.id()).generation(), 2);
}

// A DONE retry for a committed operation whose host rows cannot be read
// (the store failing) gets the store's error, which the agent retries, never
// "abort"; the next retry is taken.
TEST_F(AgentApiRaceTest, ADoneRetryThatCannotBeCheckedIsAnErrorNotAnAbort) {
  const v1::Job job = Register(TwoLayerJob("unchecked-done"));
  RegisterAgents({"h0", "h1", "h2"});
  const v1::Operation op = StartTransfer(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_FALSE(op.id().empty());
  const std::vector<std::string> hosts = Participants(op.id());
  for (const std::string& host : hosts) CompleteTask(host, op.id());
  Tick();
  ASSERT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_COMMITTED);
  v1::ReportProgressRequest retry;
  retry.set_host_id(hosts.back());
  retry.set_operation_id(op.id());
  retry.set_state(v1::HOST_TASK_STATE_DONE);
  hooked_->FailNextHostProgressRead(absl::UnavailableError("store unavailable"));
  absl::StatusOr<v1::ReportProgressResponse> reply = agents_->ReportProgress(retry);
  EXPECT_EQ(reply.status(), absl::UnavailableError("store unavailable"));
  reply = agents_->ReportProgress(retry);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_FALSE(reply->abort());
}

}  // namespace
}  // namespace reshard::coordinator::testing
