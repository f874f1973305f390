#include "tests/coordinator/server/server_fixture.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "tests/coordinator/harness/test_pki.h"
#include "tests/coordinator/harness/test_postgres.h"

namespace reshard::coordinator::testing {

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  return context;
}

std::string DefaultIdentity() { return DefaultTestInsecure() ? kInsecureIdentity : kAdminIdentity; }

std::unique_ptr<CoordinatorStub> CoordinatorClient(const std::string& address,
                                                   const std::string& identity) {
  return v1::CoordinatorService::NewStub(
      TestChannel(address, identity.empty() ? DefaultIdentity() : identity));
}

std::unique_ptr<AgentStub> AgentClient(const std::string& address, const std::string& identity) {
  return v1::AgentService::NewStub(TestChannel(address, identity));
}

v1::Job GetJob(CoordinatorStub* stub, const std::string& id) {
  v1::GetJobRequest request;
  request.set_job_id(id);
  v1::Job job;
  const grpc::Status s = stub->GetJob(Ctx().get(), request, &job);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return job;
}

v1::Operation GetOperation(CoordinatorStub* stub, const std::string& id) {
  v1::GetOperationRequest request;
  request.set_operation_id(id);
  v1::Operation op;
  const grpc::Status s = stub->GetOperation(Ctx().get(), request, &op);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return op;
}

v1::Operation Resize(CoordinatorStub* stub, const std::string& job_id, int64_t generation,
                     const v1::Layout& target, bool stop_free) {
  v1::ResizeRequest request;
  request.set_job_id(job_id);
  request.set_expected_generation(generation);
  *request.mutable_placement() = target.placement();
  *request.mutable_config() = target.config();
  request.set_stop_free(stop_free);
  v1::Operation op;
  const grpc::Status s = stub->Resize(Ctx().get(), request, &op);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return op;
}

v1::Operation MarkPrepared(CoordinatorStub* stub, const std::string& operation_id) {
  v1::MarkPreparedRequest request;
  request.set_operation_id(operation_id);
  v1::Operation op;
  const grpc::Status s = stub->MarkPrepared(Ctx().get(), request, &op);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return op;
}

std::string JobsSnapshot(CoordinatorStub* stub) {
  std::string out;
  v1::ListJobsRequest list;
  list.set_page_size(2);  // several pages even for few jobs: paging is part of it
  while (true) {
    v1::ListJobsResponse page;
    const grpc::Status s = stub->ListJobs(Ctx().get(), list, &page);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (!s.ok()) return "error";
    for (const v1::Job& job : page.jobs()) {
      v1::GetJobRequest get;
      get.set_job_id(job.id());
      get.set_include_ptc(true);
      v1::Job full;
      const grpc::Status g = stub->GetJob(Ctx().get(), get, &full);
      EXPECT_TRUE(g.ok()) << g.error_message();
      absl::StrAppend(&out, job.SerializeAsString(), "|", full.SerializeAsString(), "\n");
    }
    if (page.next_page_token().empty()) break;
    list.set_page_token(page.next_page_token());
  }
  return out;
}

bool IsFinal(v1::OperationState state) {
  return state == v1::OPERATION_STATE_COMMITTED || state == v1::OPERATION_STATE_ABORTED ||
         state == v1::OPERATION_STATE_FAILED;
}

absl::StatusOr<v1::Operation> WaitFinal(CoordinatorStub* stub, const std::string& operation_id,
                                        absl::Duration timeout) {
  v1::Operation op;
  grpc::Status last;
  const bool done = Eventually(
      [&] {
        v1::GetOperationRequest request;
        request.set_operation_id(operation_id);
        last = stub->GetOperation(Ctx().get(), request, &op);
        return last.ok() && IsFinal(op.state());
      },
      timeout);
  if (done) return op;
  return absl::DeadlineExceededError(absl::StrCat(
      "operation ", operation_id, " not final after ", absl::FormatDuration(timeout), ": state ",
      v1::OperationState_Name(op.state()), " last status ", last.error_message()));
}

absl::Status WaitState(CoordinatorStub* stub, const std::string& operation_id,
                       v1::OperationState state, absl::Duration timeout) {
  v1::Operation op;
  const bool done = Eventually(
      [&] {
        v1::GetOperationRequest request;
        request.set_operation_id(operation_id);
        if (!stub->GetOperation(Ctx().get(), request, &op).ok()) return false;
        return op.state() == state || IsFinal(op.state());
      },
      timeout);
  if (done && op.state() == state) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("operation ", operation_id, " is ", v1::OperationState_Name(op.state()),
                   ", waited for ", v1::OperationState_Name(state), "; error: ", op.error()));
}

void ServerTest::SetUp() {
  SetDefaultTestSecurity(Insecure());
  absl::StatusOr<std::string> dsn = CreateFreshDatabase("server");
  ASSERT_TRUE(dsn.ok()) << dsn.status();
  dsn_ = *dsn;
}

void ServerTest::TearDown() {
  for (auto& a : agents_) a->Stop();
}

std::vector<std::string> ServerTest::Flags(const std::vector<std::string>& extra) const {
  std::vector<std::string> flags = {"--dsn",
                                    dsn_,
                                    "--listen",
                                    "127.0.0.1:0",
                                    "--metrics-listen",
                                    "127.0.0.1:0",
                                    "--lease-ms",
                                    std::to_string(lease_ms_),
                                    "--tick-ms",
                                    "50",
                                    "--leader-retry-ms",
                                    "100",
                                    "--pool-size",
                                    "4",
                                    "--log-level",
                                    "info"};
  if (Insecure()) {
    flags.push_back("--insecure");
  } else {
    for (const std::string& f : TestTlsFlags()) flags.push_back(f);
  }
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

std::unique_ptr<CoordinatorProcess> ServerTest::StartCoordinator(
    const std::vector<std::string>& extra) {
  absl::StatusOr<std::unique_ptr<CoordinatorProcess>> p = CoordinatorProcess::Start(Flags(extra));
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return nullptr;
  return *std::move(p);
}

void ServerTest::StartAgents(const std::vector<std::string>& ids, const std::string& address) {
  for (const std::string& id : ids) {
    auto a = std::make_unique<FakeAgent>(id, 4);
    a->SetCoordinator(address);
    const absl::Status s = a->Register();
    EXPECT_TRUE(s.ok()) << id << ": " << s;
    a->Start();
    agents_.push_back(std::move(a));
  }
}

void ServerTest::PointAgentsAt(const std::string& address) {
  for (auto& a : agents_) a->SetCoordinator(address);
}

void ServerTest::StopAgents() {
  for (auto& a : agents_) a->Stop();
}

void ServerTest::HoldAgents(bool hold) {
  for (auto& a : agents_) a->SetHold(hold);
}

FakeAgent* ServerTest::agent(const std::string& id) {
  for (auto& a : agents_) {
    if (a->host_id() == id) return a.get();
  }
  return nullptr;
}

v1::Job ServerTest::Register(CoordinatorStub* stub, const v1::JobSpec& spec) {
  v1::RegisterJobRequest request;
  *request.mutable_spec() = spec;
  v1::RegisterJobResponse reply;
  const grpc::Status s = stub->RegisterJob(Ctx().get(), request, &reply);
  EXPECT_TRUE(s.ok()) << spec.name() << ": " << s.error_message();
  return reply.job();
}

void AdminServerTest::SetUp() {
  ServerTest::SetUp();
  if (HasFatalFailure()) return;
  coordinator_ = StartCoordinator();
  ASSERT_NE(coordinator_, nullptr);
  admin_ = CoordinatorClient(coordinator_->address(), kAdminIdentity);
}

}  // namespace reshard::coordinator::testing
