// The agents' prepare of a stop-free operation against a real PostgreSQL,
// agents played through AgentApi (docs/coordinator.md, "Agents prepare"):
// every host of the plan gets a prepare task from the generation current
// when the operation was planned into the final generation; PREPARED
// reports carry the checksums of the sources read (checked); the operation
// is prepared once workers and agents both are, in either order, and only
// then cut over; its transfer skips exactly the steps whose source did not
// change at the cut-over; a host that fails or is lost during the prepare
// aborts it and its pending generation is discarded; WaitForTasks answers
// a new operation at once; a final report wakes the leader's driver.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pqxx/pqxx"
#include "services/coordinator/logic/leader.h"
#include "tests/coordinator/harness/eventually.h"
#include "tests/coordinator/logic/feed_fixture.h"
#include "tests/coordinator/logic/stop_free_fixture.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::MakeLayout;
using test_support::TwoLayerJob;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class StopFreePrepareTest : public StopFreeTest {
 protected:
  /// A stop-free resize of a fresh job onto h1, h2, planned and preparing.
  v1::Operation Preparing(const std::string& name, v1::Job* job = nullptr) {
    const v1::Job created = RegisterWithData(name);
    RegisterAgents({"h0", "h1", "h2"});
    absl::StatusOr<v1::Operation> op =
        StopFreeResize(created, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
    EXPECT_TRUE(op.ok()) << op.status();
    if (job != nullptr) *job = created;
    if (!op.ok()) return v1::Operation();
    Tick();
    return Op(op->id());
  }

  std::vector<int64_t> Discarded(const std::string& host) {
    absl::StatusOr<std::vector<v1::GenerationRef>> refs = store_->GenerationsToDiscard(host);
    EXPECT_TRUE(refs.ok()) << refs.status();
    std::vector<int64_t> generations;
    if (refs.ok()) {
      for (const v1::GenerationRef& ref : *refs) generations.push_back(ref.generation());
    }
    return generations;
  }
};

TEST_F(StopFreePrepareTest, EveryPlanHostGetsAPrepareTaskIntoTheFinalGeneration) {
  v1::Job job;
  const v1::Operation op = Preparing("phases", &job);
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_PLANNED) << op.error();
  // The number below its own is reserved for the cut-over checkpoint.
  EXPECT_EQ(op.from_generation(), 1);
  EXPECT_EQ(op.to_generation(), 3);
  EXPECT_EQ(op.prepared_from_generation(), 1);
  EXPECT_EQ(Participants(op.id()), PlanHosts(op.id()));
  EXPECT_THAT(Participants(op.id()), ElementsAre("h0", "h1", "h2"));
  absl::StatusOr<v1::HeartbeatResponse> beat = Heartbeat("h0");
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_THAT(beat->assigned_operations(), ElementsAre(op.id()));

  const v1::TransferPlan plan = PlanOf(op.id());
  absl::StatusOr<v1::HostTask> task = GetTask("h2", op.id());
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_TRUE(task->prepare());
  EXPECT_FALSE(task->prepared());
  EXPECT_FALSE(task->publish_by_workers());
  EXPECT_EQ(task->from_generation(), 1);
  EXPECT_EQ(task->to_generation(), 3);
  EXPECT_EQ(task->plan().SerializeAsString(), SliceForHost(plan, "h2").SerializeAsString());
  EXPECT_EQ(task->peers_size(), 2);

  // The pending generation is the final one; nothing is discarded yet.
  absl::StatusOr<std::vector<v1::GenerationRef>> stale = store_->StaleGenerations({[&] {
    v1::GenerationRef ref;
    ref.set_job_id(job.id());
    ref.set_generation(3);
    return ref;
  }()});
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_THAT(*stale, IsEmpty());
  EXPECT_THAT(Discarded("h1"), IsEmpty());

  // Agents first, workers second: prepared at the MarkPrepared.
  PrepareAll(op.id());
  beat = Heartbeat("h0");
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_THAT(beat->assigned_operations(), IsEmpty());
  v1::Operation agents_done = Op(op.id());
  EXPECT_GT(agents_done.agents_prepared_unix_ms(), 0);
  EXPECT_EQ(agents_done.workers_prepared_unix_ms(), 0);
  EXPECT_EQ(agents_done.prepared_unix_ms(), 0);
  EXPECT_EQ(agents_done.bytes_precopied(), BytesTotal(plan));
  EXPECT_EQ(agents_done.bytes_done(), 0);
  EXPECT_THAT(CheckpointAt(job, 3, op.id()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "MarkPrepared"));
  absl::StatusOr<v1::Operation> prepared = MarkPrepared(op.id());
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_GT(prepared->workers_prepared_unix_ms(), 0);
  EXPECT_EQ(prepared->prepared_unix_ms(),
            std::max(prepared->workers_prepared_unix_ms(), prepared->agents_prepared_unix_ms()));
  // A resent PREPARED changes nothing.
  absl::StatusOr<v1::ReportProgressResponse> resent =
      agents_->ReportProgress(PreparedReport("h1", op.id()));
  ASSERT_TRUE(resent.ok()) << resent.status();
  EXPECT_EQ(Op(op.id()).bytes_precopied(), BytesTotal(plan));
}

TEST_F(StopFreePrepareTest, WatchOperationStreamsEachAgentsPrepare) {
  const v1::Operation op = Preparing("watched");
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_PLANNED) << op.error();
  // Through the change feed, as a WatchOperation stream gets it.
  TestFeed feed;
  ASSERT_NO_FATAL_FAILURE(feed.Start(dsn_, store_));
  Recorder<v1::Operation> watcher;
  feed.feed->operations().Subscribe(op.id(), 0, &watcher);
  auto saw = [&](const std::function<bool(const v1::Operation&)>& pred) {
    return Eventually(
        [&] {
          const std::vector<v1::Operation> seen = watcher.states();
          return std::any_of(seen.begin(), seen.end(), pred);
        },
        absl::Seconds(20), absl::Milliseconds(5));
  };
  EXPECT_TRUE(saw([](const v1::Operation& o) { return o.bytes_precopied() == 0; }));
  PrepareHost("h1", op.id());  // one agent: neither prepared nor cut over
  EXPECT_TRUE(saw([](const v1::Operation& o) {
    return o.bytes_precopied() > 0 && o.agents_prepared_unix_ms() == 0;
  }));
  feed.feed->operations().Unsubscribe(op.id(), &watcher);
}

TEST_F(StopFreePrepareTest, PreparedReportsAreChecked) {
  const v1::Operation op = Preparing("checked");
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_PLANNED) << op.error();
  const v1::TransferPlan plan = PlanOf(op.id());
  // h2 reads no old shard (the old layout is on h0, h1): h0's sources are
  // not its to name.
  ASSERT_THAT(ShardsReadOnHost(plan, "h2"), IsEmpty());
  ASSERT_FALSE(ShardsReadOnHost(plan, "h0").empty());
  v1::ReportProgressRequest foreign = PreparedReport("h0", op.id());
  foreign.set_host_id("h2");
  EXPECT_THAT(
      agents_->ReportProgress(foreign).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "source_checksums[0]: item " + std::to_string(foreign.source_checksums(0).item())));
  v1::ReportProgressRequest twice = PreparedReport("h0", op.id());
  *twice.add_source_checksums() = twice.source_checksums(0);
  EXPECT_THAT(
      agents_->ReportProgress(twice).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               absl::StrCat("source_checksums[", twice.source_checksums_size() - 1, "]: item")));
  v1::ReportProgressRequest done = PreparedReport("h0", op.id());
  done.set_state(v1::HOST_TASK_STATE_DONE);
  EXPECT_THAT(agents_->ReportProgress(done).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "report PREPARED"));
  // Nothing was recorded.
  EXPECT_EQ(Op(op.id()).bytes_precopied(), 0);
  absl::StatusOr<std::vector<HostProgress>> rows = store_->GetHostProgress(op.id());
  ASSERT_TRUE(rows.ok()) << rows.status();
  for (const HostProgress& row : *rows) EXPECT_EQ(row.state, v1::HOST_TASK_STATE_ASSIGNED);
  // PREPARED outside a prepare phase is refused too.
  v1::Job other = RegisterWithData("plain");
  absl::StatusOr<v1::Operation> plain = ResizeTo(other, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(plain.ok()) << plain.status();
  Tick();
  ASSERT_EQ(Op(plain->id()).state(), v1::OPERATION_STATE_TRANSFERRING);
  v1::ReportProgressRequest early = PreparedReport("h0", op.id());
  early.set_operation_id(plain->id());
  early.clear_source_checksums();
  EXPECT_THAT(agents_->ReportProgress(early).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a stop-free operation in its"));
}

TEST_F(StopFreePrepareTest, WorkersFirstThenTheLastAgentPreparesIt) {
  v1::Job job;
  const v1::Operation op = Preparing("workers-first", &job);
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_PLANNED) << op.error();
  absl::StatusOr<v1::Operation> workers = MarkPrepared(op.id());
  ASSERT_TRUE(workers.ok()) << workers.status();
  EXPECT_GT(workers->workers_prepared_unix_ms(), 0);
  EXPECT_EQ(workers->prepared_unix_ms(), 0);
  EXPECT_THAT(CheckpointAt(job, 3, op.id()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "hosts not prepared yet (not PREPARED): \"h0\", \"h1\", \"h2\""));
  PrepareHost("h0", op.id());
  PrepareHost("h2", op.id());
  EXPECT_EQ(Op(op.id()).prepared_unix_ms(), 0);
  absl::Status refused = CheckpointAt(job, 3, op.id()).status();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kFailedPrecondition, ": \"h1\""));
  EXPECT_THAT(std::string(refused.message()), ::testing::Not(HasSubstr("MarkPrepared")));
  PrepareHost("h1", op.id());
  const v1::Operation prepared = Op(op.id());
  EXPECT_GT(prepared.prepared_unix_ms(), 0);
  EXPECT_EQ(prepared.prepared_unix_ms(), prepared.agents_prepared_unix_ms());
  EXPECT_GE(prepared.agents_prepared_unix_ms(), prepared.workers_prepared_unix_ms());
  absl::StatusOr<v1::Operation> cut = CheckpointAt(job, 3, op.id());
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(cut->to_generation(), 2);
}

// The checkpoint changed the shards of old rank 0 since the prepare read
// them (the prepare saw other checksums) and left the others: only the
// steps reading rank 0 move again.
TEST_F(StopFreePrepareTest, TheTransferSkipsExactlyTheStepsWhoseSourceDidNotChange) {
  v1::Job job;
  const v1::Operation op = Preparing("pruned", &job);
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_PLANNED) << op.error();
  const v1::TransferPlan plan = PlanOf(op.id());
  PrepareAll(op.id(), [](int item, int rank) {
    return rank == 0 ? ShardChecksumOf(item, rank) ^ 0xFFu : ShardChecksumOf(item, rank);
  });
  ASSERT_TRUE(MarkPrepared(op.id()).ok());
  absl::StatusOr<v1::Operation> cut = CheckpointAt(job, 3, op.id());
  ASSERT_TRUE(cut.ok()) << cut.status();
  Tick();
  CompleteAll(cut->id());  // generation 2 records ShardChecksumOf for every shard
  Tick();
  ASSERT_EQ(Op(cut->id()).state(), v1::OPERATION_STATE_COMMITTED);
  Tick();
  const v1::Operation moving = Op(op.id());
  ASSERT_EQ(moving.state(), v1::OPERATION_STATE_TRANSFERRING) << moving.error();
  EXPECT_EQ(moving.from_generation(), 2);
  EXPECT_EQ(moving.to_generation(), 3);
  EXPECT_EQ(moving.prepared_from_generation(), 1);

  // Expected, from the plan: the steps reading rank 0 stay.
  std::set<int64_t> kept;
  int64_t kept_bytes = 0;
  for (const v1::CopyStep& step : plan.steps()) {
    if (step.src_rank() != 0) continue;
    kept.insert(step.index());
    kept_bytes += step.bytes() * step.dsts_size();
  }
  ASSERT_FALSE(kept.empty());
  ASSERT_LT(kept.size(), static_cast<size_t>(plan.steps_size()));
  EXPECT_EQ(moving.bytes_total(), kept_bytes);
  EXPECT_EQ(moving.bytes_skipped_unchanged(), BytesTotal(plan) - kept_bytes);
  EXPECT_EQ(moving.bytes_precopied(), BytesTotal(plan));
  EXPECT_EQ(Participants(op.id()), PlanHosts(op.id()));

  int64_t rows_total = 0;
  absl::StatusOr<std::vector<HostProgress>> rows = store_->GetHostProgress(op.id());
  ASSERT_TRUE(rows.ok()) << rows.status();
  for (const HostProgress& row : *rows) {
    EXPECT_EQ(row.state, v1::HOST_TASK_STATE_ASSIGNED) << row.host_id;
    EXPECT_EQ(row.bytes_done, 0) << row.host_id;
    rows_total += row.bytes_total;
  }
  EXPECT_EQ(rows_total, kept_bytes);

  for (const std::string& host : Participants(op.id())) {
    absl::StatusOr<v1::HostTask> task = GetTask(host, op.id());
    ASSERT_TRUE(task.ok()) << host << ": " << task.status();
    EXPECT_TRUE(task->prepared()) << host;
    EXPECT_FALSE(task->prepare()) << host;
    EXPECT_EQ(task->from_generation(), 2);
    EXPECT_EQ(task->to_generation(), 3);
    EXPECT_EQ(task->plan().zero_fills_size(), 0) << host;
    EXPECT_EQ(task->plan().regenerate_size(), 0) << host;
    std::set<int64_t> expected;
    const v1::TransferPlan slice = SliceForHost(plan, host);
    for (const v1::CopyStep& step : slice.steps()) {
      if (kept.count(step.index()) > 0) expected.insert(step.index());
    }
    std::set<int64_t> got;
    for (const v1::CopyStep& step : task->plan().steps()) got.insert(step.index());
    EXPECT_EQ(got, expected) << host;
  }
  CompleteAll(op.id());
  Tick();
  const v1::Operation done = Op(op.id());
  ASSERT_EQ(done.state(), v1::OPERATION_STATE_COMMITTED) << done.error();
  EXPECT_EQ(done.bytes_done(), kept_bytes);
  EXPECT_EQ(Job(job.id()).generation(), 3);
  EXPECT_EQ(MetricValue("reshard_coordinator_stop_free_bytes_total", {{"kind", "precopied"}}),
            static_cast<double>(BytesTotal(plan)));
  EXPECT_EQ(
      MetricValue("reshard_coordinator_stop_free_bytes_total", {{"kind", "skipped_unchanged"}}),
      static_cast<double>(BytesTotal(plan) - kept_bytes));
}

TEST_F(StopFreePrepareTest, AHostThatFailsItsPrepareAbortsAndTheNewGenerationIsDiscarded) {
  v1::Job job;
  const v1::Operation op = Preparing("failed", &job);
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_PLANNED) << op.error();
  PrepareHost("h0", op.id());
  v1::ReportProgressRequest failed;
  failed.set_host_id("h2");
  failed.set_operation_id(op.id());
  failed.set_state(v1::HOST_TASK_STATE_FAILED);
  failed.set_error("cannot allocate 4 GiB of pinned memory");
  ASSERT_TRUE(agents_->ReportProgress(failed).ok());
  Tick();
  const v1::Operation ended = Op(op.id());
  EXPECT_EQ(ended.state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_EQ(ended.error(), "host \"h2\": cannot allocate 4 GiB of pinned memory");
  const v1::Job after = Job(job.id());
  EXPECT_EQ(after.generation(), 1);
  EXPECT_EQ(after.state(), v1::JOB_STATE_ACTIVE);
  for (const char* host : {"h1", "h2"}) EXPECT_THAT(Discarded(host), ElementsAre(3));
  // A late PREPARED is told to stop.
  absl::StatusOr<v1::ReportProgressResponse> late =
      agents_->ReportProgress(PreparedReport("h1", op.id()));
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_TRUE(late->abort());
}

TEST_F(StopFreePrepareTest, APreparedHostThatFailsLaterAbortsIt) {
  v1::Job job;
  const v1::Operation op = Preparing("failed-later", &job);
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_PLANNED) << op.error();
  PrepareAll(op.id());
  v1::ReportProgressRequest running;
  running.set_host_id("h1");
  running.set_operation_id(op.id());
  running.set_state(v1::HOST_TASK_STATE_RUNNING);
  EXPECT_THAT(agents_->ReportProgress(running).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "already reported"));
  v1::ReportProgressRequest failed = running;
  failed.set_state(v1::HOST_TASK_STATE_FAILED);
  failed.set_error("prepared buffers evicted");
  ASSERT_TRUE(agents_->ReportProgress(failed).ok());
  Tick();
  const v1::Operation ended = Op(op.id());
  EXPECT_EQ(ended.state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_EQ(ended.error(), "host \"h1\": prepared buffers evicted");
  EXPECT_THAT(Discarded("h2"), ElementsAre(3));
}

TEST_F(StopFreePrepareTest, AHostLostDuringThePrepareAbortsIt) {
  v1::Job job;
  const v1::Operation op = Preparing("lost", &job);
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_PLANNED) << op.error();
  PrepareAll(op.id());  // a PREPARED host's buffers go with it too
  ASSERT_TRUE(MarkPrepared(op.id()).ok());
  clock_.Advance(kLeaseMs / 2);
  ASSERT_TRUE(Heartbeat("h0").ok());
  ASSERT_TRUE(Heartbeat("h1").ok());
  clock_.Advance(kLeaseMs / 2 + 1);  // h2's lease ends
  Tick();
  const v1::Operation ended = Op(op.id());
  EXPECT_EQ(ended.state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_EQ(ended.error(), "host \"h2\" lost (lease expired) during its prepare");
  EXPECT_EQ(Job(job.id()).generation(), 1);
  EXPECT_EQ(Job(job.id()).state(), v1::JOB_STATE_ACTIVE);
  EXPECT_THAT(Discarded("h1"), ElementsAre(3));
  EXPECT_THAT(CheckpointAt(job, 3, op.id()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "not the active operation"));
}

TEST_F(StopFreePrepareTest, AStalledOrRestartedHostAbortsThePrepare) {
  v1::Job job;
  const v1::Operation op = Preparing("stalled", &job);
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_PLANNED) << op.error();
  PrepareHost("h0", op.id());
  PrepareHost("h1", op.id());
  // Leases kept, but h2 never fetches its task: PREPARED hosts do not stall.
  for (int i = 0; i < 2; ++i) {
    clock_.Advance(10000 + i);
    for (const char* host : {"h0", "h1", "h2"}) ASSERT_TRUE(Heartbeat(host).ok());
  }
  Tick();
  v1::Operation ended = Op(op.id());
  EXPECT_EQ(ended.state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_EQ(ended.error(),
            "host \"h2\" made no progress in its prepare for 20001 ms, nor did any other host of "
            "the operation (stall_timeout_ms 20000): its task was never fetched");
  EXPECT_EQ(Job(job.id()).generation(), 1);
  EXPECT_THAT(Discarded("h2"), ElementsAre(3));

  // A PREPARED host whose agent restarts lost its buffers: the prepare fails.
  absl::StatusOr<v1::Operation> again =
      StopFreeResize(Job(job.id()), MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->to_generation(), 5);  // 3 was used (discarded): never reused
  Tick();
  PrepareAll(again->id());
  RegisterAgents({"h1"});  // a new incarnation
  Tick();
  ended = Op(again->id());
  EXPECT_EQ(ended.state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_THAT(ended.error(), HasSubstr("host \"h1\": the agent restarted"));
  EXPECT_THAT(ended.error(), HasSubstr("HOST_TASK_STATE_PREPARED"));
  EXPECT_THAT(Discarded("h2"), ElementsAre(3, 5));
}

TEST_F(StopFreePrepareTest, WaitForTasksAnswersANewOperationAtOnceAndOtherwiseAfterWaitMs) {
  const v1::Job job = RegisterWithData("wait");
  RegisterAgents({"h0", "h1", "h2"});
  v1::WaitForTasksRequest idle;
  idle.set_host_id("h1");
  idle.set_wait_ms(10000);
  std::future<absl::StatusOr<v1::WaitForTasksResponse>> waiting =
      std::async(std::launch::async, [&] { return agents_->WaitForTasks(idle); });
  absl::StatusOr<v1::Operation> op = StopFreeResize(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(op.ok()) << op.status();
  const auto started = std::chrono::steady_clock::now();
  Tick();  // planned, prepare rows: h1 has a task
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(5)), std::future_status::ready)
      << "WaitForTasks did not answer the new operation";
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
  absl::StatusOr<v1::WaitForTasksResponse> got = waiting.get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->assigned_operations(), ElementsAre(op->id()));

  // Known already: the list as it is after wait_ms.
  v1::WaitForTasksRequest known = idle;
  known.add_known_operations(op->id());
  known.set_wait_ms(300);
  const auto before = std::chrono::steady_clock::now();
  got = agents_->WaitForTasks(known);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_GE(std::chrono::steady_clock::now() - before, std::chrono::milliseconds(300));
  EXPECT_THAT(got->assigned_operations(), ElementsAre(op->id()));

  v1::WaitForTasksRequest bad = idle;
  bad.set_wait_ms(-1);
  EXPECT_THAT(agents_->WaitForTasks(bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "wait_ms is -1"));
  bad = idle;
  bad.set_host_id("h9");
  EXPECT_THAT(agents_->WaitForTasks(bad).status(), StatusIs(absl::StatusCode::kNotFound, "h9"));
  EXPECT_THAT(agents_->WaitForTasks(bad).status(), StatusIs(absl::StatusCode::kNotFound, "h9"));
  // Polls remember registered hosts only: h9 polls once it registered.
  RegisterAgents({"h9"});
  bad.set_wait_ms(1);
  got = agents_->WaitForTasks(bad);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->assigned_operations().empty());
}

// A stop-free operation created before migration 0011 reserved no
// generation number and its agents never prepare: the migration counts them
// prepared, the cut-over takes the next number and moves the operation past
// it, and the transfer moves the whole plan.
TEST_F(StopFreePrepareTest, AnOperationFromBeforeMigration0011IsNotPreparedByAgents) {
  const v1::Job job = RegisterWithData("legacy");
  RegisterAgents({"h0", "h1", "h2"});
  absl::StatusOr<v1::Operation> op = StopFreeResize(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(op.ok()) << op.status();
  {
    // As 0010 created it (to_generation = current + 1), then 0011's update.
    pqxx::connection conn(dsn_);
    pqxx::nontransaction sql(conn);
    sql.exec_params("UPDATE operations SET to_generation = from_generation + 1 WHERE id = $1",
                    op->id());
    sql.exec(
        "UPDATE operations SET agents_prepared_at = now() WHERE stop_free AND state IN (1, 2)");
  }
  Tick();
  Tick();
  v1::Operation planned = Op(op->id());
  ASSERT_EQ(planned.state(), v1::OPERATION_STATE_PLANNED) << planned.error();
  EXPECT_EQ(planned.prepared_from_generation(), 0);
  EXPECT_THAT(Participants(op->id()), IsEmpty());
  absl::StatusOr<v1::Operation> marked = MarkPrepared(op->id());
  ASSERT_TRUE(marked.ok()) << marked.status();
  EXPECT_GT(marked->prepared_unix_ms(), 0);
  absl::StatusOr<v1::Operation> cut = CheckpointAt(job, 3, op->id());
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(cut->to_generation(), 2);
  EXPECT_EQ(Op(op->id()).to_generation(), 3);
  Tick();
  CompleteAll(cut->id());
  Tick();
  Tick();
  const v1::Operation moving = Op(op->id());
  ASSERT_EQ(moving.state(), v1::OPERATION_STATE_TRANSFERRING) << moving.error();
  EXPECT_EQ(moving.bytes_total(), BytesTotal(PlanOf(op->id())));
  EXPECT_EQ(moving.bytes_skipped_unchanged(), 0);
  absl::StatusOr<v1::HostTask> task = GetTask("h2", op->id());
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_FALSE(task->prepare());
  EXPECT_FALSE(task->prepared());
  CompleteAll(op->id());
  Tick();
  EXPECT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_COMMITTED) << Op(op->id()).error();
  EXPECT_EQ(Job(job.id()).generation(), 3);
}

/// A lock always held: this replica leads.
class HeldLock : public LeaderLock {
 public:
  absl::StatusOr<bool> TryAcquire() override { return true; }
  bool StillHeld() override { return true; }
  void Release() override {}
};

// With a tick far longer than the test's deadline, only the kick can make
// the leader act on the agents' DONE reports.
TEST_F(StopFreePrepareTest, AFinalReportWakesTheLeadersDriver) {
  const v1::Job job = Register(TwoLayerJob("kick"));
  RegisterAgents({"h0", "h1", "h2"});
  absl::StatusOr<v1::Operation> op = ResizeTo(job, MakeLayout(1, 2, 2, {"h1", "h2"}, 2));
  ASSERT_TRUE(op.ok()) << op.status();
  LeaderLoop loop(std::make_unique<HeldLock>(), driver_.get(), metrics_.get(),
                  LeaderLoop::Options{/*tick_ms=*/600000, /*retry_ms=*/5});
  AgentApi::Options options;
  options.lease_ms = kLeaseMs;
  options.on_final_report = [&loop] { loop.Kick(); };
  agents_ = std::make_unique<AgentApi>(store_, &clock_, metrics_.get(), options);
  loop.Start();
  // Becoming leader resumes the operation: planned and transferring.
  ASSERT_TRUE(Eventually([&] { return Op(op->id()).state() == v1::OPERATION_STATE_TRANSFERRING; },
                         absl::Seconds(20), absl::Milliseconds(5)));
  CompleteAll(op->id());
  EXPECT_TRUE(Eventually([&] { return Op(op->id()).state() == v1::OPERATION_STATE_COMMITTED; },
                         absl::Seconds(20), absl::Milliseconds(5)))
      << v1::OperationState_Name(Op(op->id()).state());
  loop.Stop();
}

}  // namespace
}  // namespace reshard::coordinator::testing
