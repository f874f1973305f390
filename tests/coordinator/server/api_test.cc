// Every CoordinatorService and AgentService call over real gRPC against the
// real reshard-coordinator binary, happy paths: jobs, previews, each kind of
// operation driven to COMMITTED by simulated agents (one watched), cancel,
// hosts, delete, and /metrics.
#include <set>

#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "tests/coordinator/server/scrape.h"
#include "tests/coordinator/server/server_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using test_support::GptJobSpec;
using test_support::HostsPlacement;
using test_support::MakeLayout;
using test_support::ReplicatedGptJobSpec;

class ApiTest : public ServerTest {};

TEST_F(ApiTest, EveryCoordinatorCallHappyPath) {
  std::unique_ptr<CoordinatorProcess> c = StartCoordinator();
  ASSERT_NE(c, nullptr);
  auto stub = CoordinatorClient(c->address());
  StartAgents({"h0", "h1", "h2", "h3"}, c->address());

  // RegisterJob, GetJob (with and without the PTC), ListJobs.
  const v1::JobSpec spec = GptJobSpec("gpt-small", "team-a");
  const v1::Job job = Register(stub.get(), spec);
  ASSERT_EQ(job.id().size(), 32u);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.state(), v1::JOB_STATE_ACTIVE);
  {
    v1::GetJobRequest request;
    request.set_job_id(job.id());
    request.set_include_ptc(true);
    v1::Job got;
    ASSERT_TRUE(stub->GetJob(Ctx().get(), request, &got).ok());
    EXPECT_EQ(got.name(), "gpt-small");
    EXPECT_EQ(got.tenant(), "team-a");
    EXPECT_EQ(got.ptc().tensors_size(), spec.ptc().tensors_size());
    EXPECT_EQ(got.tensor_count(), spec.ptc().tensors_size());
    EXPECT_FALSE(GetJob(stub.get(), job.id()).has_ptc());
  }
  Register(stub.get(), GptJobSpec("other", "team-b"));
  {
    v1::ListJobsRequest request;
    request.set_tenant("team-a");
    v1::ListJobsResponse page;
    ASSERT_TRUE(stub->ListJobs(Ctx().get(), request, &page).ok());
    ASSERT_EQ(page.jobs_size(), 1);
    EXPECT_EQ(page.jobs(0).id(), job.id());
    request.Clear();
    request.set_page_size(1);
    ASSERT_TRUE(stub->ListJobs(Ctx().get(), request, &page).ok());
    EXPECT_EQ(page.jobs_size(), 1);
    EXPECT_FALSE(page.next_page_token().empty());
  }

  // PreviewPlan: stats only, nothing stored.
  {
    const std::string before = JobsSnapshot(stub.get());
    v1::PreviewPlanRequest request;
    request.set_job_id(job.id());
    *request.mutable_target() = MakeLayout(2, 2, 1, {"h2"}, 4);
    v1::PreviewPlanResponse reply;
    const grpc::Status s = stub->PreviewPlan(Ctx().get(), request, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_GT(reply.stats().steps(), 0);
    EXPECT_GT(reply.stats().bytes_cross_host(), 0);  // h2 held nothing
    EXPECT_EQ(JobsSnapshot(stub.get()), before);
  }

  // Resize to dp 1 on h2, watched: the states arrive in order. The agents
  // hold the transfer until the stream has shown TRANSFERRING.
  HoldAgents(true);
  const v1::Layout target = MakeLayout(2, 2, 1, {"h2"}, 4);
  const v1::Operation resize = Resize(stub.get(), job.id(), 1, target);
  ASSERT_FALSE(resize.id().empty());
  EXPECT_EQ(resize.kind(), v1::OPERATION_KIND_RESIZE);
  {
    v1::WatchOperationRequest request;
    request.set_operation_id(resize.id());
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    auto reader = stub->WatchOperation(&context, request);
    std::vector<v1::OperationState> states;
    v1::Operation update;
    while (reader->Read(&update)) {
      if (states.empty() || states.back() != update.state()) states.push_back(update.state());
      if (update.state() == v1::OPERATION_STATE_TRANSFERRING) HoldAgents(false);
    }
    const grpc::Status s = reader->Finish();
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_GE(states.size(), 2u);
    EXPECT_EQ(states[states.size() - 2], v1::OPERATION_STATE_TRANSFERRING);
    EXPECT_EQ(states.back(), v1::OPERATION_STATE_COMMITTED) << update.error();
    for (size_t i = 1; i < states.size(); ++i) EXPECT_LT(states[i - 1], states[i]);
    HoldAgents(false);
  }
  {
    v1::GetOperationRequest request;
    request.set_operation_id(resize.id());
    v1::Operation op;
    ASSERT_TRUE(stub->GetOperation(Ctx().get(), request, &op).ok());
    EXPECT_EQ(op.state(), v1::OPERATION_STATE_COMMITTED);
    EXPECT_EQ(op.bytes_done(), op.bytes_total());
    const v1::Job after = GetJob(stub.get(), job.id());
    EXPECT_EQ(after.generation(), 2);
    EXPECT_EQ(after.state(), v1::JOB_STATE_ACTIVE);
    EXPECT_TRUE(MessageDifferencer::Equivalent(after.layout(), op.target_layout()));
  }

  // Migrate: same config onto h3.
  {
    v1::MigrateRequest request;
    request.set_job_id(job.id());
    request.set_expected_generation(2);
    *request.mutable_placement() = HostsPlacement({"h3"}, 4);
    v1::Operation op;
    const grpc::Status s = stub->Migrate(Ctx().get(), request, &op);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(op.kind(), v1::OPERATION_KIND_MIGRATE);
    absl::StatusOr<v1::Operation> final_op = WaitFinal(stub.get(), op.id());
    ASSERT_TRUE(final_op.ok()) << final_op.status();
    EXPECT_EQ(final_op->state(), v1::OPERATION_STATE_COMMITTED) << final_op->error();
    EXPECT_EQ(GetJob(stub.get(), job.id()).generation(), 3);
  }

  // CancelOperation: an operation held in TRANSFERRING by the agents.
  {
    HoldAgents(true);
    const v1::Operation op = Resize(stub.get(), job.id(), 3, MakeLayout(2, 2, 2, {"h0", "h1"}, 4));
    ASSERT_TRUE(WaitState(stub.get(), op.id(), v1::OPERATION_STATE_TRANSFERRING).ok());
    v1::CancelOperationRequest request;
    request.set_operation_id(op.id());
    v1::Operation cancelled;
    const grpc::Status s = stub->CancelOperation(Ctx().get(), request, &cancelled);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(cancelled.state(), v1::OPERATION_STATE_ABORTED);
    EXPECT_FALSE(cancelled.error().empty());
    const v1::Job after = GetJob(stub.get(), job.id());
    EXPECT_EQ(after.generation(), 3);
    EXPECT_EQ(after.state(), v1::JOB_STATE_ACTIVE);
    EXPECT_TRUE(after.active_operation_id().empty());
    HoldAgents(false);
  }

  // RecoverFromFailure: h1 held one data-parallel replica of stage 0.
  {
    const v1::Job rjob = Register(stub.get(), ReplicatedGptJobSpec("replicated", "team-a"));
    v1::RecoverFromFailureRequest request;
    request.set_job_id(rjob.id());
    request.set_expected_generation(1);
    request.add_lost_hosts("h1");
    *request.mutable_target() = MakeLayout(2, 2, 1, {"h0", "h2"}, 2);
    request.set_accept_degraded(true);  // dp 1: one copy left, accepted
    v1::Operation op;
    const grpc::Status s = stub->RecoverFromFailure(Ctx().get(), request, &op);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(op.kind(), v1::OPERATION_KIND_RECOVER);
    absl::StatusOr<v1::Operation> final_op = WaitFinal(stub.get(), op.id());
    ASSERT_TRUE(final_op.ok()) << final_op.status();
    EXPECT_EQ(final_op->state(), v1::OPERATION_STATE_COMMITTED) << final_op->error();
    EXPECT_EQ(GetJob(stub.get(), rjob.id()).generation(), 2);
  }

  // ListHosts: the four simulated agents, alive.
  {
    v1::ListHostsResponse reply;
    ASSERT_TRUE(stub->ListHosts(Ctx().get(), v1::ListHostsRequest(), &reply).ok());
    std::set<std::string> alive;
    for (const v1::Host& h : reply.hosts()) {
      if (h.state() == v1::HOST_STATE_ALIVE) alive.insert(h.host_id());
    }
    EXPECT_EQ(alive, (std::set<std::string>{"h0", "h1", "h2", "h3"}));
  }

  // DeleteJob, then it is gone.
  {
    v1::DeleteJobRequest request;
    request.set_job_id(job.id());
    v1::DeleteJobResponse reply;
    const grpc::Status s = stub->DeleteJob(Ctx().get(), request, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    v1::GetJobRequest get;
    get.set_job_id(job.id());
    v1::Job gone;
    EXPECT_EQ(stub->GetJob(Ctx().get(), get, &gone).error_code(), grpc::StatusCode::NOT_FOUND);
  }

  // /metrics: operations by result, RPC durations by method and code, leader.
  absl::StatusOr<std::string> metrics = HttpGet(c->metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_GE(MetricValue(*metrics, "reshard_coordinator_operations_total", {{"result", "committed"}})
                .value_or(0),
            3);
  EXPECT_GE(MetricValue(*metrics, "reshard_coordinator_operations_total", {{"result", "aborted"}})
                .value_or(0),
            1);
  EXPECT_GE(MetricValue(*metrics, "reshard_coordinator_rpc_duration_seconds_count",
                        {{"method", "RegisterJob"}, {"code", "OK"}})
                .value_or(0),
            3);
  EXPECT_GE(MetricValue(*metrics, "reshard_coordinator_rpc_duration_seconds_count",
                        {{"method", "GetJob"}, {"code", "NOT_FOUND"}})
                .value_or(0),
            1);
  EXPECT_GE(MetricValue(*metrics, "reshard_coordinator_rpc_duration_seconds_count",
                        {{"method", "Heartbeat"}})
                .value_or(0),
            1);
  EXPECT_TRUE(
      MetricValue(*metrics, "reshard_coordinator_store_duration_seconds_count").has_value());
  EXPECT_TRUE(MetricValue(*metrics, "reshard_coordinator_operation_duration_seconds_count",
                          {{"kind", "resize"}})
                  .has_value());
  EXPECT_EQ(MetricValue(*metrics, "reshard_coordinator_leader").value_or(-1), 1);

  // SIGTERM: a clean exit.
  absl::StatusOr<int> exit_status = c->Terminate();
  ASSERT_TRUE(exit_status.ok()) << exit_status.status();
  EXPECT_EQ(*exit_status, 0);
}

TEST_F(ApiTest, SigtermEndsOpenWatchesAndExitsCleanly) {
  std::unique_ptr<CoordinatorProcess> c = StartCoordinator();
  ASSERT_NE(c, nullptr);
  auto stub = CoordinatorClient(c->address());
  StartAgents({"h0", "h1"}, c->address());
  HoldAgents(true);  // the operation never finishes on its own
  const v1::Job job = Register(stub.get(), GptJobSpec("held", "t"));
  const v1::Operation op = Resize(stub.get(), job.id(), 1, MakeLayout(2, 2, 1, {"h0"}, 4));
  ASSERT_TRUE(WaitState(stub.get(), op.id(), v1::OPERATION_STATE_TRANSFERRING).ok());

  v1::WatchOperationRequest request;
  request.set_operation_id(op.id());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto reader = stub->WatchOperation(&context, request);
  v1::Operation update;
  ASSERT_TRUE(reader->Read(&update));  // the stream is open and has sent the operation
  EXPECT_EQ(update.state(), v1::OPERATION_STATE_TRANSFERRING);

  absl::StatusOr<int> exit_status = c->Terminate(absl::Seconds(20));
  ASSERT_TRUE(exit_status.ok()) << exit_status.status();
  EXPECT_EQ(*exit_status, 0);
  while (reader->Read(&update)) {
  }
  EXPECT_FALSE(reader->Finish().ok());  // ended by the shutdown, not by a final state
}

TEST_F(ApiTest, EveryAgentCallDirectly) {
  std::unique_ptr<CoordinatorProcess> c = StartCoordinator();
  ASSERT_NE(c, nullptr);
  auto agent_stub = AgentClient(c->address(), "agent:solo");

  v1::RegisterAgentRequest reg;
  reg.mutable_host()->set_host_id("solo");
  reg.mutable_host()->set_address("solo:7171");
  v1::RegisterAgentResponse first, second;
  ASSERT_TRUE(agent_stub->RegisterAgent(Ctx().get(), reg, &first).ok());
  EXPECT_EQ(first.lease_ms(), 5000);
  ASSERT_TRUE(agent_stub->RegisterAgent(Ctx().get(), reg, &second).ok());
  EXPECT_GT(second.epoch(), first.epoch());

  v1::HeartbeatRequest hb;
  hb.set_host_id("solo");
  hb.set_epoch(second.epoch());
  v1::HeartbeatResponse hb_reply;
  ASSERT_TRUE(agent_stub->Heartbeat(Ctx().get(), hb, &hb_reply).ok());
  EXPECT_EQ(hb_reply.assigned_operations_size(), 0);
  hb.set_epoch(first.epoch());  // an older agent process
  EXPECT_EQ(agent_stub->Heartbeat(Ctx().get(), hb, &hb_reply).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  hb.set_host_id("nobody");
  hb.set_epoch(1);
  // Not the certificate's host: refused before anything is looked up.
  EXPECT_EQ(agent_stub->Heartbeat(Ctx().get(), hb, &hb_reply).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(
      AgentClient(c->address(), "agent:nobody")->Heartbeat(Ctx().get(), hb, &hb_reply).error_code(),
      grpc::StatusCode::NOT_FOUND);

  v1::GetTaskRequest task;
  task.set_host_id("solo");
  task.set_operation_id("0123456789abcdef0123456789abcdef");
  v1::HostTask task_reply;
  EXPECT_EQ(agent_stub->GetTask(Ctx().get(), task, &task_reply).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::ReportProgressRequest report;
  report.set_host_id("solo");
  report.set_operation_id("0123456789abcdef0123456789abcdef");
  report.set_state(v1::HOST_TASK_STATE_RUNNING);
  v1::ReportProgressResponse report_reply;
  EXPECT_EQ(agent_stub->ReportProgress(Ctx().get(), report, &report_reply).error_code(),
            grpc::StatusCode::NOT_FOUND);
  reg.mutable_host()->clear_host_id();
  EXPECT_EQ(agent_stub->RegisterAgent(Ctx().get(), reg, &first).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);  // "" is not the certificate's host

  // A whole operation through the four calls: GetTask and ReportProgress
  // by the simulated agents; a report after the end gets abort.
  auto stub = CoordinatorClient(c->address());
  StartAgents({"h0", "h1"}, c->address());
  const v1::Job job = Register(stub.get(), GptJobSpec("agents", "t"));
  const v1::Operation op = Resize(stub.get(), job.id(), 1, MakeLayout(2, 2, 1, {"h0"}, 4));
  absl::StatusOr<v1::Operation> final_op = WaitFinal(stub.get(), op.id());
  ASSERT_TRUE(final_op.ok()) << final_op.status();
  EXPECT_EQ(final_op->state(), v1::OPERATION_STATE_COMMITTED) << final_op->error();
  EXPECT_TRUE(agent("h0")->Fetched(op.id()));
  EXPECT_TRUE(agent("h1")->Fetched(op.id()));
  report.set_host_id("h0");
  report.set_operation_id(op.id());
  ASSERT_TRUE(AgentClient(c->address(), "agent:h0")
                  ->ReportProgress(Ctx().get(), report, &report_reply)
                  .ok());
  EXPECT_TRUE(report_reply.abort());
}

TEST_F(ApiTest, HelpMigrateAndBadFlags) {
  absl::StatusOr<int> help = CoordinatorProcess::Run({"--help"});
  ASSERT_TRUE(help.ok()) << help.status();
  EXPECT_EQ(*help, 0);
  absl::StatusOr<int> bad = CoordinatorProcess::Run({"serve", "--lease-ms", "banana"});
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_EQ(*bad, 2);
  absl::StatusOr<int> no_dsn = CoordinatorProcess::Run({"serve"});
  ASSERT_TRUE(no_dsn.ok()) << no_dsn.status();
  EXPECT_EQ(*no_dsn, 2);
  // migrate twice: the second finds nothing to do.
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<int> migrate = CoordinatorProcess::Run({"migrate", "--dsn", dsn_});
    ASSERT_TRUE(migrate.ok()) << migrate.status();
    EXPECT_EQ(*migrate, 0);
  }
  // An unreachable database: a runtime error, not a crash.
  absl::StatusOr<int> unreachable = CoordinatorProcess::Run(
      {"migrate", "--dsn", "host=/nonexistent/reshard-test-socket-dir dbname=x connect_timeout=2"});
  ASSERT_TRUE(unreachable.ok()) << unreachable.status();
  EXPECT_EQ(*unreachable, 1);
}

}  // namespace
}  // namespace reshard::coordinator::testing
