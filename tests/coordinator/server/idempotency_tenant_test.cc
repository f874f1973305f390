// Idempotency keys are scoped to the caller's tenants (issue 19, defect 7),
// against the real reshard-coordinator over mutual TLS with schedulers of
// two tenants: a key tenant A used is simply free for tenant B (its call
// runs and its reply names only its own resources), while within tenant A,
// whichever of its schedulers calls, a retry gets the first result and
// another request with the key is INVALID_ARGUMENT naming the key and the
// method; CancelOperation keeps its key like every mutating call.
#include "grpcpp/grpcpp.h"
#include "tests/coordinator/server/server_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::GptJobSpec;
using test_support::MakeLayout;

constexpr char kAlice[] = "scheduler:alice@team-a";
constexpr char kCarol[] = "scheduler:carol@team-a";  // the same tenant, another scheduler
constexpr char kBob[] = "scheduler:bob@team-b";

using IdempotencyTenantTest = AdminServerTest;

grpc::Status RegisterKeyed(CoordinatorStub* stub, const v1::JobSpec& spec, const std::string& key,
                           v1::Job* job) {
  v1::RegisterJobRequest r;
  *r.mutable_spec() = spec;
  r.set_idempotency_key(key);
  v1::RegisterJobResponse reply;
  const grpc::Status s = stub->RegisterJob(Ctx().get(), r, &reply);
  *job = reply.job();
  return s;
}

grpc::Status ResizeKeyed(CoordinatorStub* stub, const std::string& job_id, const std::string& key,
                         v1::Operation* op) {
  v1::ResizeRequest r;
  r.set_job_id(job_id);
  r.set_expected_generation(1);
  const v1::Layout target = MakeLayout(2, 2, 1, {"h0"}, 4);
  *r.mutable_placement() = target.placement();
  *r.mutable_config() = target.config();
  r.set_idempotency_key(key);
  return stub->Resize(Ctx().get(), r, op);
}

grpc::Status CancelKeyed(CoordinatorStub* stub, const std::string& operation_id,
                         const std::string& key, v1::Operation* op) {
  v1::CancelOperationRequest r;
  r.set_operation_id(operation_id);
  r.set_idempotency_key(key);
  return stub->CancelOperation(Ctx().get(), r, op);
}

v1::OperationState StateOf(CoordinatorStub* stub, const std::string& operation_id) {
  v1::GetOperationRequest r;
  r.set_operation_id(operation_id);
  v1::Operation op;
  const grpc::Status s = stub->GetOperation(Ctx().get(), r, &op);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return op.state();
}

// INVALID_ARGUMENT naming the key and the method it was first used with.
void ExpectKeyRefused(const grpc::Status& s, const std::string& key, const std::string& method) {
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("idempotency key \"" + key + "\""), std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find(method), std::string::npos) << s.error_message();
}

TEST_F(IdempotencyTenantTest, KeysAreScopedToTheCallersTenant) {
  const std::string address = coordinator_->address();
  StartAgents({"h0", "h1"}, address);
  HoldAgents(true);  // operations stay active until cancelled
  auto alice = CoordinatorClient(address, kAlice);
  auto carol = CoordinatorClient(address, kCarol);
  auto bob = CoordinatorClient(address, kBob);

  // RegisterJob: tenant B's call with tenant A's key registers B's job.
  v1::Job job_a;
  grpc::Status s = RegisterKeyed(alice.get(), GptJobSpec("train-a", "team-a"), "nightly", &job_a);
  ASSERT_TRUE(s.ok()) << s.error_message();
  v1::Job job_b;
  s = RegisterKeyed(bob.get(), GptJobSpec("train-b", "team-b"), "nightly", &job_b);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_NE(job_b.id(), job_a.id());
  EXPECT_EQ(job_b.tenant(), "team-b");
  EXPECT_EQ(job_b.name(), "train-b");
  // An admin has a scope of its own.
  v1::Job job_admin;
  s = RegisterKeyed(admin_.get(), GptJobSpec("train-admin", "team-b"), "nightly", &job_admin);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_NE(job_admin.id(), job_b.id());
  // Tenant A: a retry (by another of its schedulers) gets the first job;
  // another request with the key is refused.
  v1::Job again;
  s = RegisterKeyed(carol.get(), GptJobSpec("train-a", "team-a"), "nightly", &again);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(again.id(), job_a.id());
  v1::Job refused;
  ExpectKeyRefused(
      RegisterKeyed(carol.get(), GptJobSpec("train-a2", "team-a"), "nightly", &refused), "nightly",
      "RegisterJob");

  // Resize: the same key in both tenants, each its own operation.
  v1::Operation op_a;
  s = ResizeKeyed(alice.get(), job_a.id(), "resize-1", &op_a);
  ASSERT_TRUE(s.ok()) << s.error_message();
  v1::Operation op_b;
  s = ResizeKeyed(bob.get(), job_b.id(), "resize-1", &op_b);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_NE(op_b.id(), op_a.id());
  EXPECT_EQ(op_b.job_id(), job_b.id());
  v1::Operation op_retry;
  s = ResizeKeyed(bob.get(), job_b.id(), "resize-1", &op_retry);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(op_retry.id(), op_b.id());
  // Tenant A's Resize key used for a cancel in tenant A cancels nothing.
  v1::Operation unused;
  ExpectKeyRefused(CancelKeyed(carol.get(), op_a.id(), "resize-1", &unused), "resize-1", "Resize");
  EXPECT_FALSE(IsFinal(StateOf(alice.get(), op_a.id())));

  // CancelOperation: a retry returns the first result...
  v1::Operation cancelled;
  s = CancelKeyed(alice.get(), op_a.id(), "cancel-1", &cancelled);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(cancelled.id(), op_a.id());
  EXPECT_EQ(cancelled.state(), v1::OPERATION_STATE_ABORTED);
  v1::Operation cancelled_again;
  s = CancelKeyed(carol.get(), op_a.id(), "cancel-1", &cancelled_again);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(cancelled_again.id(), op_a.id());
  EXPECT_EQ(cancelled_again.state(), v1::OPERATION_STATE_ABORTED);
  // ... the key on another operation of the tenant is refused, which
  // stays active...
  v1::Job job_a2;
  s = RegisterKeyed(alice.get(), GptJobSpec("train-a2", "team-a"), "", &job_a2);
  ASSERT_TRUE(s.ok()) << s.error_message();
  v1::Operation op_a2;
  s = ResizeKeyed(alice.get(), job_a2.id(), "", &op_a2);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ExpectKeyRefused(CancelKeyed(alice.get(), op_a2.id(), "cancel-1", &unused), "cancel-1",
                   "CancelOperation");
  EXPECT_FALSE(IsFinal(StateOf(alice.get(), op_a2.id())));
  ExpectKeyRefused(ResizeKeyed(alice.get(), job_a.id(), "cancel-1", &unused), "cancel-1",
                   "CancelOperation");
  // ... and is free in tenant B.
  s = CancelKeyed(bob.get(), op_b.id(), "cancel-1", &cancelled);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(cancelled.id(), op_b.id());
  EXPECT_EQ(cancelled.state(), v1::OPERATION_STATE_ABORTED);

  // Nothing tenant B did moved tenant A's operation.
  EXPECT_FALSE(IsFinal(StateOf(alice.get(), op_a2.id())));
  HoldAgents(false);
}

}  // namespace
}  // namespace reshard::coordinator::testing
