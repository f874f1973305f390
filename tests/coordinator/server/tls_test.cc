// Transport security and agent identity against the real reshard-coordinator
// (issue 11): mutual TLS with a throwaway CA, who may call what, an agent
// bound to the host of its certificate, the forged-report attack refused,
// certificates from another CA refused, and certificates rotated without a
// restart.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "grpcpp/grpcpp.h"
#include "tests/coordinator/harness/test_pki.h"
#include "tests/coordinator/server/server_fixture.h"
#include "tests/support/job_builders.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::GptJobSpec;
using test_support::MakeLayout;

class TlsTest : public ServerTest {};

grpc::Status ListJobs(CoordinatorStub* stub) {
  v1::ListJobsResponse reply;
  auto context = Ctx();
  // Fail fast rather than wait for a channel that will never come up.
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return stub->ListJobs(context.get(), v1::ListJobsRequest(), &reply);
}

// A channel that presents `cert`/`key` and trusts `ca`.
std::shared_ptr<grpc::Channel> ChannelWith(const std::string& address, const std::string& ca,
                                           const CertFiles& cert) {
  grpc::SslCredentialsOptions o;
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  o.pem_root_certs = read(ca);
  o.pem_cert_chain = cert.cert.empty() ? "" : read(cert.cert);
  o.pem_private_key = cert.key.empty() ? "" : read(cert.key);
  return grpc::CreateChannel(address, grpc::SslCredentials(o));
}

v1::RegisterAgentRequest AgentRegistration(const std::string& host) {
  v1::RegisterAgentRequest r;
  *r.mutable_host() = test_support::MakeHost(host, {.address = host + ":7171",
                                                    .devices = 1,
                                                    .device_name = "",
                                                    .transports = {},
                                                    .ucx_address = "",
                                                    .memory_limit_bytes = 0});
  return r;
}

TEST_F(TlsTest, IdentitiesAndRefusals) {
  std::unique_ptr<CoordinatorProcess> c = StartCoordinator();
  ASSERT_NE(c, nullptr);
  // An admin certificate: every scheduler call.
  EXPECT_TRUE(ListJobs(CoordinatorClient(c->address(), kAdminIdentity).get()).ok());
  // TLS without a client certificate: the channel is up, the call is not
  // authenticated (a bearer token would be needed).
  const grpc::Status anonymous =
      ListJobs(CoordinatorClient(c->address(), kAnonymousIdentity).get());
  EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAUTHENTICATED) << anonymous.error_message();
  EXPECT_NE(anonymous.error_message().find("ListJobs"), std::string::npos);
  // Plaintext to a TLS port: no channel at all.
  const grpc::Status plain = ListJobs(CoordinatorClient(c->address(), kInsecureIdentity).get());
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE) << plain.error_message();
  // A certificate of another CA (the server's certificate trusted, so only
  // the client side is wrong): the handshake is refused.
  absl::StatusOr<std::unique_ptr<TestPki>> other = TestPki::Create("other");
  ASSERT_TRUE(other.ok()) << other.status();
  absl::StatusOr<CertFiles> foreign = (*other)->Issue("admin:intruder");
  ASSERT_TRUE(foreign.ok()) << foreign.status();
  auto foreign_stub =
      v1::CoordinatorService::NewStub(ChannelWith(c->address(), SharedTestPki().ca(), *foreign));
  const grpc::Status refused = ListJobs(foreign_stub.get());
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  // An agent certificate calls AgentService only.
  const grpc::Status agent_lists = ListJobs(CoordinatorClient(c->address(), "agent:h0").get());
  EXPECT_EQ(agent_lists.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(agent_lists.error_message().find("agent:h0"), std::string::npos);
  // ... and an admin does not speak for hosts.
  v1::RegisterAgentResponse reply;
  const grpc::Status admin_registers =
      AgentClient(c->address(), kAdminIdentity)
          ->RegisterAgent(Ctx().get(), AgentRegistration("h0"), &reply);
  EXPECT_EQ(admin_registers.error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

// Who may read a job: its tenant's scheduler or viewer, the agents of the
// hosts it is placed on (their worker service reads its PTC), an admin.
TEST_F(TlsTest, JobsAreReadWithinTenantsAndPlacements) {
  std::unique_ptr<CoordinatorProcess> c = StartCoordinator();
  ASSERT_NE(c, nullptr);
  StartAgents({"h0", "h1"}, c->address());
  const v1::Job job = Register(CoordinatorClient(c->address()).get(), GptJobSpec("mine", "team-a"));
  auto get = [&](const std::string& identity) {
    v1::GetJobRequest r;
    r.set_job_id(job.id());
    v1::Job reply;
    grpc::Status s = CoordinatorClient(c->address(), identity)->GetJob(Ctx().get(), r, &reply);
    if (s.ok()) {
      EXPECT_EQ(reply.id(), job.id());
    }
    return s;
  };
  EXPECT_TRUE(get("viewer:alice@team-a").ok());
  EXPECT_TRUE(get("scheduler:sched@team-b,team-a").ok());
  EXPECT_TRUE(get("agent:h1").ok());
  // Outside the job's tenant the job does not exist, word for word what a
  // job that really does not exist answers: a refusal tells neither whose
  // the job is nor that it exists. Before, it was PERMISSION_DENIED naming
  // the job's tenant ("team-a").
  auto get_missing = [&](const std::string& identity) {
    v1::GetJobRequest r;
    r.set_job_id("no-such-job");
    v1::Job reply;
    return CoordinatorClient(c->address(), identity)->GetJob(Ctx().get(), r, &reply);
  };
  for (const char* identity : {"viewer:bob@team-b", "scheduler:other@team-b"}) {
    const grpc::Status s = get(identity);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << identity;
    EXPECT_EQ(s.error_message(), "job \"" + job.id() + "\" not found") << identity;
    const grpc::Status missing = get_missing(identity);
    EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND) << identity;
    EXPECT_EQ(missing.error_message(), "job \"no-such-job\" not found") << identity;
  }
  // An agent is told the job is not on its host, not whose it is.
  const grpc::Status agent = get("agent:h7");
  EXPECT_EQ(agent.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(agent.error_message().find("agent:h7"), std::string::npos) << agent.error_message();
  EXPECT_EQ(agent.error_message().find("team-a"), std::string::npos) << agent.error_message();
  // A certificate whose name is no identity is not authenticated.
  EXPECT_EQ(get("bogus").error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(TlsTest, AnAgentSpeaksOnlyForTheHostOfItsCertificate) {
  std::unique_ptr<CoordinatorProcess> c = StartCoordinator();
  ASSERT_NE(c, nullptr);
  v1::RegisterAgentResponse first;
  ASSERT_TRUE(AgentClient(c->address(), "agent:h0")
                  ->RegisterAgent(Ctx().get(), AgentRegistration("h0"), &first)
                  .ok());
  // Another host's certificate cannot take h0: not by registering, not by
  // heartbeating with h0's epoch.
  auto h1 = AgentClient(c->address(), "agent:h1");
  v1::RegisterAgentResponse taken;
  const grpc::Status take = h1->RegisterAgent(Ctx().get(), AgentRegistration("h0"), &taken);
  EXPECT_EQ(take.error_code(), grpc::StatusCode::PERMISSION_DENIED) << take.error_message();
  EXPECT_NE(take.error_message().find("\"h0\""), std::string::npos) << take.error_message();
  v1::HeartbeatRequest hb;
  hb.set_host_id("h0");
  hb.set_epoch(first.epoch());
  v1::HeartbeatResponse hb_reply;
  EXPECT_EQ(h1->Heartbeat(Ctx().get(), hb, &hb_reply).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::GetTaskRequest task;
  task.set_host_id("h0");
  task.set_operation_id("0123456789abcdef0123456789abcdef");
  v1::HostTask task_reply;
  EXPECT_EQ(h1->GetTask(Ctx().get(), task, &task_reply).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // h0 is still the first registration (same epoch, heartbeats accepted).
  EXPECT_TRUE(AgentClient(c->address(), "agent:h0")->Heartbeat(Ctx().get(), hb, &hb_reply).ok());
}

// The issue's attack: while an operation transfers, a client reports DONE
// with invented checksums for every destination host. Refused whoever it
// is (no certificate, a host outside the operation, another host of the
// operation); the operation goes on and commits only with the real agents'
// reports.
TEST_F(TlsTest, ForgedProgressReportsAreRefused) {
  std::unique_ptr<CoordinatorProcess> c = StartCoordinator();
  ASSERT_NE(c, nullptr);
  auto stub = CoordinatorClient(c->address());
  StartAgents({"h0", "h1", "h2"}, c->address());
  HoldAgents(true);
  const v1::Job job = Register(stub.get(), GptJobSpec("forged", "t"));
  const v1::Operation op = Resize(stub.get(), job.id(), 1, MakeLayout(2, 2, 1, {"h1"}, 4));
  ASSERT_TRUE(WaitState(stub.get(), op.id(), v1::OPERATION_STATE_TRANSFERRING).ok());

  auto forge = [&](const std::string& identity, const std::string& host) {
    v1::ReportProgressRequest r;
    r.set_host_id(host);
    r.set_operation_id(op.id());
    r.set_state(v1::HOST_TASK_STATE_DONE);
    v1::ShardChecksum* sum = r.add_checksums();
    sum->set_item(0);
    sum->set_rank(0);
    sum->set_checksum(0xdeadbeef);
    sum->set_bytes(1);
    v1::ReportProgressResponse reply;
    return AgentClient(c->address(), identity)->ReportProgress(Ctx().get(), r, &reply);
  };
  for (const std::string host : {"h0", "h1"}) {
    EXPECT_EQ(forge(kAnonymousIdentity, host).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(forge("agent:h2", host).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  EXPECT_EQ(forge("agent:h0", "h1").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // A host outside the operation, speaking for itself: it has no task.
  EXPECT_EQ(forge("agent:h2", "h2").error_code(), grpc::StatusCode::NOT_FOUND);

  v1::GetOperationRequest get;
  get.set_operation_id(op.id());
  v1::Operation now;
  ASSERT_TRUE(stub->GetOperation(Ctx().get(), get, &now).ok());
  EXPECT_EQ(now.state(), v1::OPERATION_STATE_TRANSFERRING);
  EXPECT_EQ(GetJob(stub.get(), job.id()).generation(), 1);

  HoldAgents(false);
  absl::StatusOr<v1::Operation> final_op = WaitFinal(stub.get(), op.id());
  ASSERT_TRUE(final_op.ok()) << final_op.status();
  EXPECT_EQ(final_op->state(), v1::OPERATION_STATE_COMMITTED) << final_op->error();
  EXPECT_EQ(GetJob(stub.get(), job.id()).generation(), 2);
}

// The coordinator's certificate, key and CA are replaced on disk (a new CA):
// without a restart, new connections use them; clients of the old CA are
// then refused.
TEST_F(TlsTest, CertificatesRotateWithoutRestart) {
  const std::string dir = SharedTestPki().dir() + "/rotation";
  std::filesystem::create_directories(dir);
  auto install = [&](TestPki& pki) {
    absl::StatusOr<CertFiles> server = pki.Issue("coordinator");
    ASSERT_TRUE(server.ok()) << server.status();
    // Copy, then rename over: each file changes atomically.
    for (const auto& [from, to] :
         {std::pair{server->key, dir + "/key.pem"}, std::pair{server->cert, dir + "/cert.pem"},
          std::pair{pki.ca(), dir + "/ca.pem"}}) {
      std::filesystem::copy_file(from, to + ".new",
                                 std::filesystem::copy_options::overwrite_existing);
      std::filesystem::rename(to + ".new", to);
    }
  };
  ASSERT_NO_FATAL_FAILURE(install(SharedTestPki()));
  std::unique_ptr<CoordinatorProcess> c =
      CoordinatorProcess::Start({"--dsn", dsn_, "--listen", "127.0.0.1:0", "--metrics-listen",
                                 "127.0.0.1:0", "--tls-cert", dir + "/cert.pem", "--tls-key",
                                 dir + "/key.pem", "--tls-ca", dir + "/ca.pem", "--tls-reload-s",
                                 "1"})
          .value();
  absl::StatusOr<CertFiles> old_admin = SharedTestPki().Issue(kAdminIdentity);
  ASSERT_TRUE(old_admin.ok());
  auto old_client = [&] {
    return v1::CoordinatorService::NewStub(
        ChannelWith(c->address(), SharedTestPki().ca(), *old_admin));
  };
  ASSERT_TRUE(ListJobs(old_client().get()).ok());

  absl::StatusOr<std::unique_ptr<TestPki>> next = TestPki::Create("next");
  ASSERT_TRUE(next.ok()) << next.status();
  absl::StatusOr<CertFiles> new_admin = (*next)->Issue(kAdminIdentity);
  ASSERT_TRUE(new_admin.ok());
  ASSERT_NO_FATAL_FAILURE(install(**next));
  // A fresh channel each try: a handshake sees the files of that moment.
  EXPECT_TRUE(Eventually(
      [&] {
        auto s =
            v1::CoordinatorService::NewStub(ChannelWith(c->address(), (*next)->ca(), *new_admin));
        return ListJobs(s.get()).ok();
      },
      absl::Seconds(30)));
  EXPECT_EQ(ListJobs(old_client().get()).error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace reshard::coordinator::testing
