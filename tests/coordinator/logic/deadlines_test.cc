// Deadlines and host notices (docs/scheduler.md, "Deadlines", "Host
// notices") through SchedulerApi and the driver, on both stores, with the
// coordinator's cost model at its defaults: a deadline the prediction
// misses is refused at once and changes nothing; one it meets is stored and
// shown with an ETA; past an aborting deadline the driver aborts and the
// generation stays; a host notice moves each job onto a spare or onto its
// other hosts, or says why not and what the job keeps.
#include "services/coordinator/logic/deadlines.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::MakeLayout;
using test_support::ReplicatedTwoLayerJob;
using test_support::TwoLayerJob;
using ::testing::HasSubstr;

class OperationDeadlinesTest : public LogicTest {
 protected:
  void SetUp() override {
    LogicTest::SetUp();
    SchedulerApi::Options api;
    api.cost = &model_;
    api_ = std::make_unique<SchedulerApi>(store_, &clock_, metrics_.get(), api);
    OperationDriver::Options driver;
    driver.cost = &model_;
    driver_ = MakeDriver(store_, driver);
  }

  v1::Deadline In(int64_t ms, bool abort_past) {
    v1::Deadline d;
    d.set_unix_ms(clock_.NowUnixMs() + ms);
    d.set_abort_past(abort_past);
    return d;
  }

  // The prediction PreviewPlan gives for the move (what a refusal names).
  v1::CostPrediction Preview(const v1::Job& job, const v1::Layout& target) {
    v1::PreviewPlanRequest request;
    request.set_job_id(job.id());
    *request.mutable_target() = target;
    absl::StatusOr<v1::PreviewPlanResponse> preview = api_->PreviewPlan(request);
    EXPECT_TRUE(preview.ok()) << preview.status();
    return preview.ok() ? preview->prediction() : v1::CostPrediction();
  }

  // A host with `devices` devices, registered and ALIVE.
  void RegisterHostWithDevices(const std::string& host, int devices) {
    v1::RegisterAgentRequest request;
    *request.mutable_host() = test_support::MakeHost(host, {.address = host + ":7171",
                                                            .devices = devices,
                                                            .transports = {"ucx"},
                                                            .ucx_address = "ucx-" + host,
                                                            .memory_limit_bytes = 0});
    absl::StatusOr<v1::RegisterAgentResponse> response = agents_->RegisterAgent(request);
    ASSERT_TRUE(response.ok()) << response.status();
    epochs_[host] = response->epoch();
  }

  // A resize of `job` (at generation 1) to tp 2 pp 2 on h2, h3 by `deadline`.
  absl::StatusOr<v1::Operation> ResizeBy(const v1::Job& job, const v1::Deadline& deadline) {
    v1::ResizeRequest resize;
    resize.set_job_id(job.id());
    resize.set_expected_generation(1);
    *resize.mutable_placement() = MakeLayout(2, 2, 1, {"h2", "h3"}, 2).placement();
    *resize.mutable_deadline() = deadline;
    return api_->Resize(resize);
  }

  absl::StatusOr<v1::NoticeHostResponse> Notice(const std::string& host, int64_t in_ms,
                                                const std::vector<std::string>& spares,
                                                const std::string& key = "") {
    v1::NoticeHostRequest request;
    request.set_host_id(host);
    request.set_leaves_unix_ms(clock_.NowUnixMs() + in_ms);
    for (const std::string& s : spares) request.add_spare_hosts(s);
    request.set_idempotency_key(key);
    return api_->NoticeHost(request);
  }

  cost::CostModel model_;
};

TEST_P(OperationDeadlinesTest, ADeadlineTheMoveMissesIsRefusedAtOnceAndChangesNothing) {
  const v1::Job job = Register(TwoLayerJob("hurry"));
  const v1::Layout target = MakeLayout(2, 2, 1, {"h2", "h3"}, 2);
  const v1::CostPrediction p = Preview(job, target);
  ASSERT_GE(p.seconds(), 0.5);  // the overhead at least
  const DatabaseSnapshot before = Snapshot();

  v1::ResizeRequest resize;
  resize.set_job_id(job.id());
  resize.set_expected_generation(1);
  *resize.mutable_placement() = target.placement();
  *resize.mutable_deadline() = In(100, /*abort_past=*/true);
  absl::Status s = api_->Resize(resize).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrFormat("predicted %.1f s", p.seconds())));
  EXPECT_THAT(s.message(), HasSubstr("s past the deadline"));
  EXPECT_THAT(s.message(), HasSubstr("the earliest deadline it meets is unix_ms"));
  EXPECT_THAT(s.message(), HasSubstr("with stop_free the job keeps training"));

  v1::MigrateRequest migrate;
  migrate.set_job_id(job.id());
  migrate.set_expected_generation(1);
  *migrate.mutable_placement() = target.placement();
  *migrate.mutable_deadline() = In(100, false);
  s = api_->Migrate(migrate).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrFormat("predicted %.1f s", p.seconds())));

  // A deadline already past is the request's own error.
  *resize.mutable_deadline() = In(0, false);
  s = api_->Resize(resize).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("is not in the future"));
  EXPECT_TRUE(Snapshot() == before);
}

TEST_P(OperationDeadlinesTest, ARecoveryDeadlineIsJudgedOnTheSurvivors) {
  const v1::Job job = Register(ReplicatedTwoLayerJob("survive"));
  v1::RecoverFromFailureRequest recover;
  recover.set_job_id(job.id());
  recover.set_expected_generation(1);
  recover.add_lost_hosts("h1");
  recover.set_accept_degraded(true);  // one replica left
  *recover.mutable_deadline() = In(100, false);
  absl::Status s = api_->RecoverFromFailure(recover).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("s past the deadline"));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("stop_free")));

  *recover.mutable_deadline() = In(60000, false);
  absl::StatusOr<v1::Operation> op = api_->RecoverFromFailure(recover);
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(op->deadline().unix_ms(), recover.deadline().unix_ms());
}

TEST_P(OperationDeadlinesTest, AMetDeadlineIsStoredWithTheOperationWhichShowsItsEta) {
  const v1::Job job = Register(TwoLayerJob("ontime"));
  RegisterAgents({"h0", "h1", "h2", "h3"});
  const v1::Deadline deadline = In(60000, true);
  absl::StatusOr<v1::Operation> op = ResizeBy(job, deadline);
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(op->deadline().unix_ms(), deadline.unix_ms());
  EXPECT_TRUE(op->deadline().abort_past());
  EXPECT_EQ(Op(op->id()).eta_unix_ms(), 0);  // not planned yet

  Tick();
  const v1::Operation planned = Op(op->id());
  ASSERT_EQ(planned.state(), v1::OPERATION_STATE_TRANSFERRING);
  EXPECT_EQ(planned.deadline().unix_ms(), deadline.unix_ms());
  ASSERT_GT(planned.planned_unix_ms(), 0);
  EXPECT_EQ(planned.eta_unix_ms(), EtaUnixMs(planned, clock_.NowUnixMs()));
  EXPECT_GE(planned.eta_unix_ms(), planned.planned_unix_ms() + 500);  // the overhead at least

  for (const std::string& h : Participants(op->id())) CompleteTask(h, op->id());
  Tick();
  EXPECT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_COMMITTED) << Op(op->id()).error();
  EXPECT_EQ(Op(op->id()).eta_unix_ms(), 0);
}

TEST_P(OperationDeadlinesTest, PastAnAbortingDeadlineTheDriverAbortsAndTheGenerationStays) {
  const v1::Job job = Register(TwoLayerJob("late"));
  RegisterAgents({"h0", "h1", "h2", "h3"});
  const v1::Deadline deadline = In(5000, true);
  absl::StatusOr<v1::Operation> op = ResizeBy(job, deadline);
  ASSERT_TRUE(op.ok()) << op.status();
  Tick();
  ASSERT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_TRANSFERRING);
  // One host finishes; the others do nothing (a stalled agent, within its
  // lease) until the deadline has passed.
  CompleteTask("h2", op->id());
  clock_.Advance(4999);
  Tick();
  EXPECT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_TRANSFERRING);
  clock_.Advance(2);
  Tick();
  const v1::Operation ended = Op(op->id());
  EXPECT_EQ(ended.state(), v1::OPERATION_STATE_ABORTED);
  EXPECT_THAT(ended.error(), HasSubstr("passed (abort_past) in TRANSFERRING"));
  const v1::Job after = Job(job.id());
  EXPECT_EQ(after.generation(), 1);
  EXPECT_EQ(after.state(), v1::JOB_STATE_ACTIVE);
}

TEST_P(OperationDeadlinesTest, PastADeadlineThatGoesOnTheOperationCommits) {
  const v1::Job job = Register(TwoLayerJob("patient"));
  RegisterAgents({"h0", "h1", "h2", "h3"});
  const v1::Deadline deadline = In(5000, false);
  absl::StatusOr<v1::Operation> op = ResizeBy(job, deadline);
  ASSERT_TRUE(op.ok()) << op.status();
  Tick();
  clock_.Advance(6000);
  Tick();
  EXPECT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_TRANSFERRING);
  for (const std::string& h : Participants(op->id())) CompleteTask(h, op->id());
  Tick();
  EXPECT_EQ(Op(op->id()).state(), v1::OPERATION_STATE_COMMITTED) << Op(op->id()).error();
  EXPECT_EQ(Job(job.id()).generation(), 2);
}

TEST_P(OperationDeadlinesTest, ANoticedHostsJobMovesOntoASpareWithTheLeavingTimeAsDeadline) {
  const v1::Job job = Register(TwoLayerJob("evicted"));
  RegisterAgents({"h0", "h1"});
  RegisterHostWithDevices("small", 1);  // too few devices for h1's two ranks
  RegisterHostWithDevices("spare", 2);
  absl::StatusOr<v1::NoticeHostResponse> notice = Notice("h1", 60000, {"small", "spare"}, "k1");
  ASSERT_TRUE(notice.ok()) << notice.status();
  ASSERT_EQ(notice->jobs_size(), 1);
  const v1::HostNoticeJob& moved = notice->jobs(0);
  EXPECT_EQ(moved.job_id(), job.id());
  EXPECT_EQ(moved.refused(), "");
  ASSERT_FALSE(moved.operation_id().empty());
  std::vector<std::string> slots;
  for (const v1::DeviceSlot& s : moved.target().placement().ranks()) {
    slots.push_back(absl::StrCat(s.host(), ":", s.device()));
  }
  EXPECT_EQ(slots, (std::vector<std::string>{"h0:0", "h0:1", "spare:0", "spare:1"}));
  EXPECT_GE(moved.prediction().seconds(), 0.5);

  const v1::Operation op = Op(moved.operation_id());
  EXPECT_EQ(op.kind(), v1::OPERATION_KIND_MIGRATE);
  EXPECT_EQ(op.deadline().unix_ms(), clock_.NowUnixMs() + 60000);
  EXPECT_FALSE(op.deadline().abort_past());
  // The same notice again (a retry) gets the same operation.
  absl::StatusOr<v1::NoticeHostResponse> again = Notice("h1", 60000, {"small", "spare"}, "k1");
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->jobs_size(), 1);
  EXPECT_EQ(again->jobs(0).operation_id(), moved.operation_id());
}

TEST_P(OperationDeadlinesTest, ASpareWithoutAcceleratorsTakesTheSameDeviceIndexes) {
  Register(TwoLayerJob("hostmem"));
  RegisterAgents({"h0", "h1"});
  v1::RegisterAgentRequest request;  // one "cpu" device: host memory only
  *request.mutable_host() = test_support::MakeHost("h9", {.address = "h9:7171",
                                                          .devices = 1,
                                                          .device_kind = "cpu",
                                                          .transports = {"ucx"},
                                                          .ucx_address = "ucx-h9",
                                                          .memory_limit_bytes = 0});
  ASSERT_TRUE(agents_->RegisterAgent(request).ok());
  absl::StatusOr<v1::NoticeHostResponse> notice = Notice("h0", 60000, {"h9"});
  ASSERT_TRUE(notice.ok()) << notice.status();
  ASSERT_EQ(notice->jobs_size(), 1);
  std::vector<std::string> slots;
  for (const v1::DeviceSlot& s : notice->jobs(0).target().placement().ranks()) {
    slots.push_back(absl::StrCat(s.host(), ":", s.device()));
  }
  EXPECT_EQ(slots, (std::vector<std::string>{"h9:0", "h9:1", "h1:0", "h1:1"}));
}

TEST_P(OperationDeadlinesTest, WithoutASpareTheJobShrinksOntoItsOtherHosts) {
  const v1::Job job = Register(ReplicatedTwoLayerJob("shrink"));
  RegisterAgents({"h0", "h1"});
  absl::StatusOr<v1::NoticeHostResponse> notice = Notice("h1", 60000, {});
  ASSERT_TRUE(notice.ok()) << notice.status();
  ASSERT_EQ(notice->jobs_size(), 1);
  ASSERT_FALSE(notice->jobs(0).operation_id().empty()) << notice->jobs(0).refused();
  const v1::Operation op = Op(notice->jobs(0).operation_id());
  EXPECT_EQ(op.kind(), v1::OPERATION_KIND_RESIZE);
  EXPECT_EQ(op.target_layout().config().dp(), 1);
  ASSERT_EQ(op.target_layout().placement().ranks_size(), 1);
  EXPECT_EQ(op.target_layout().placement().ranks(0).host(), "h0");
  // It runs like any resize: h1 still sends its bytes before it goes.
  Tick();
  for (const std::string& h : Participants(op.id())) CompleteTask(h, op.id());
  Tick();
  EXPECT_EQ(Op(op.id()).state(), v1::OPERATION_STATE_COMMITTED) << Op(op.id()).error();
  // Nothing is left on h1: a second notice has nothing to move.
  absl::StatusOr<v1::NoticeHostResponse> second = Notice("h1", 60000, {});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->jobs_size(), 0);
}

TEST_P(OperationDeadlinesTest, ANoticeTooShortIsAnsweredAtOnceWithWhatTheJobKeeps) {
  const v1::Job replicated = Register(ReplicatedTwoLayerJob("kept"));
  const v1::Job sharded = Register(TwoLayerJob("sharded"));
  v1::JobSpec split = TwoLayerJob("split");  // dp 2: each host holds half the optimizer
  *split.mutable_layout() = MakeLayout(1, 1, 2, {"h0", "h1"}, 1);
  const v1::Job halves = Register(split);
  RegisterAgents({"h0", "h1"});
  DatabaseSnapshot before = Snapshot();
  absl::StatusOr<v1::NoticeHostResponse> notice = Notice("h1", 100, {});
  ASSERT_TRUE(notice.ok()) << notice.status();
  ASSERT_EQ(notice->jobs_size(), 3);
  for (const v1::HostNoticeJob& j : notice->jobs()) {
    EXPECT_EQ(j.operation_id(), "") << j.job_id();
    EXPECT_THAT(j.refused(), HasSubstr("no spare host was offered"));
    if (j.job_id() == replicated.id()) {
      EXPECT_THAT(j.refused(), HasSubstr("s past the deadline"));
      EXPECT_THAT(j.refused(), HasSubstr("when h1 goes, a recovery onto the job's other hosts "
                                         "loses nothing"));
    } else if (j.job_id() == halves.id()) {
      EXPECT_THAT(j.refused(), HasSubstr("onto the job's other hosts: "));
      EXPECT_THAT(j.refused(), HasSubstr("when h1 goes, the job loses what only it holds: "));
    } else {
      EXPECT_EQ(j.job_id(), sharded.id());
      EXPECT_THAT(j.refused(), HasSubstr("the job cannot shrink onto its other hosts"));
      EXPECT_THAT(j.refused(), HasSubstr("when h1 goes, no layout is left"));
    }
  }
  // No job or operation changed; only h1 is marked as leaving.
  const DatabaseSnapshot after = Snapshot();
  EXPECT_TRUE(after.jobs == before.jobs);
  EXPECT_TRUE(after.operations == before.operations);
  absl::StatusOr<v1::Host> h1 = store_->GetHost("h1");
  ASSERT_TRUE(h1.ok()) << h1.status();
  EXPECT_EQ(h1->leaves_unix_ms(), clock_.NowUnixMs() + 100);
}

// The leaving host is marked: no spare for another notice, no target of a
// Resize or Migrate (a recovery still may); withdrawn, it is both again.
TEST_P(OperationDeadlinesTest, ALeavingHostIsNoSpareAndNoTargetUntilTheNoticeIsWithdrawn) {
  const v1::Job job = Register(ReplicatedTwoLayerJob("stays"));  // dp 2 on h0:0, h1:0
  RegisterAgents({"h0", "h1"});
  RegisterHostWithDevices("h8", 2);
  RegisterHostWithDevices("h9", 2);
  // h8 goes in a minute: it has no job, so nothing moves; it is marked.
  absl::StatusOr<v1::NoticeHostResponse> notice = Notice("h8", 60000, {});
  ASSERT_TRUE(notice.ok()) << notice.status();
  EXPECT_EQ(notice->jobs_size(), 0);
  absl::StatusOr<std::vector<v1::Host>> hosts = store_->ListHosts();
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  for (const v1::Host& h : *hosts) {
    EXPECT_EQ(h.leaves_unix_ms(), h.host_id() == "h8" ? clock_.NowUnixMs() + 60000 : 0)
        << h.host_id();
  }
  // h1's notice skips h8 as a spare and takes h9.
  notice = Notice("h1", 60000, {"h8", "h9"});
  ASSERT_TRUE(notice.ok()) << notice.status();
  ASSERT_EQ(notice->jobs_size(), 1);
  EXPECT_EQ(test_support::SlotsOf(notice->jobs(0).target()),
            (std::vector<std::string>{"h0:0", "h9:0"}));
  ASSERT_TRUE(api_->CancelOperation([&] {
                    v1::CancelOperationRequest c;
                    c.set_operation_id(notice->jobs(0).operation_id());
                    return c;
                  }())
                  .ok());
  // A Migrate or Resize onto h8 (or onto h1, leaving too) is refused.
  v1::MigrateRequest migrate;
  migrate.set_job_id(job.id());
  migrate.set_expected_generation(1);
  *migrate.mutable_placement() = MakeLayout(1, 1, 2, {"h0", "h8"}, 1).placement();
  EXPECT_THAT(
      api_->Migrate(migrate).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, "target.placement: host \"h8\" leaves at "));
  v1::ResizeRequest resize;
  resize.set_job_id(job.id());
  resize.set_expected_generation(1);
  *resize.mutable_placement() = MakeLayout(1, 1, 2, {"h9", "h1"}, 1).placement();
  EXPECT_THAT(api_->Resize(resize).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "host \"h1\" leaves at "));
  // Withdrawn: h8 takes ranks again.
  v1::NoticeHostRequest withdraw;
  withdraw.set_host_id("h8");
  withdraw.set_withdraw(true);
  ASSERT_TRUE(api_->NoticeHost(withdraw).ok());
  absl::StatusOr<v1::Host> h8 = store_->GetHost("h8");
  ASSERT_TRUE(h8.ok()) << h8.status();
  EXPECT_EQ(h8->leaves_unix_ms(), 0);
  absl::StatusOr<v1::Operation> moved = api_->Migrate(migrate);
  EXPECT_TRUE(moved.ok()) << moved.status();
  // A withdraw takes only the host.
  withdraw.add_spare_hosts("h9");
  EXPECT_THAT(api_->NoticeHost(withdraw).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "withdraw takes only host_id"));
  withdraw.clear_spare_hosts();
  withdraw.set_host_id("nowhere");
  EXPECT_THAT(api_->NoticeHost(withdraw).status(),
              StatusIs(absl::StatusCode::kNotFound, "host \"nowhere\" is not registered"));
}

// An agent registering again before the leaving time keeps the mark; one
// registering at or after it starts afresh.
TEST_P(OperationDeadlinesTest, ARegistrationAfterTheLeavingTimeClearsTheMark) {
  RegisterHostWithDevices("h8", 2);
  ASSERT_TRUE(Notice("h8", 60000, {}).ok());
  const int64_t leaves = clock_.NowUnixMs() + 60000;
  RegisterHostWithDevices("h8", 2);
  absl::StatusOr<v1::Host> h8 = store_->GetHost("h8");
  ASSERT_TRUE(h8.ok()) << h8.status();
  EXPECT_EQ(h8->leaves_unix_ms(), leaves);
  clock_.Advance(59999);
  RegisterHostWithDevices("h8", 2);
  EXPECT_EQ(store_->GetHost("h8")->leaves_unix_ms(), leaves);
  clock_.Advance(1);  // the leaving time: the host has gone
  RegisterHostWithDevices("h8", 2);
  EXPECT_EQ(store_->GetHost("h8")->leaves_unix_ms(), 0);
}

TEST_P(OperationDeadlinesTest, ANoticeNamesItsBadFields) {
  RegisterAgents({"h0"});
  EXPECT_THAT(Notice("nowhere", 60000, {}).status(),
              StatusIs(absl::StatusCode::kNotFound, "host \"nowhere\" is not registered"));
  EXPECT_THAT(Notice("h0", 0, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "is not in the future"));
  EXPECT_THAT(
      Notice("h0", 60000, {"h0"}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "spare_hosts names the leaving host \"h0\""));
  EXPECT_THAT(Notice("h0", 60000, {"s", "s"}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "spare_hosts names \"s\" twice"));
  v1::NoticeHostRequest none;
  none.set_host_id("h0");
  EXPECT_THAT(api_->NoticeHost(none).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "leaves_unix_ms is required"));
}

RESHARD_LOGIC_ON_BOTH_STORES(OperationDeadlinesTest);

}  // namespace
}  // namespace reshard::coordinator::testing
