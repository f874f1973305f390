// The audit trail against the real reshard-coordinator on mutual TLS and a
// real PostgreSQL (issue 11 item 6; docs/security.md, "Audit"): a
// successful mutation leaves exactly one row naming who, tenant, method,
// job and result; a refused call leaves one with its refusal; a mutation
// whose transaction fails on a real conflict leaves no success row;
// ListAudit is scoped to the caller's tenants and pages; no row ever holds
// a token's secret.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "tests/coordinator/server/server_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::GptJobSpec;
using test_support::MakeLayout;

class AuditTest : public AdminServerTest {
 protected:
  std::unique_ptr<CoordinatorStub> As(const std::string& identity) {
    return CoordinatorClient(coordinator_->address(), identity);
  }

  // Every entry `stub` may list under `request` (all pages), newest first.
  std::vector<v1::AuditEntry> ListAll(CoordinatorStub* stub, v1::ListAuditRequest request,
                                      grpc::Status* status = nullptr) {
    std::vector<v1::AuditEntry> out;
    request.set_page_size(2);  // several pages
    for (;;) {
      v1::ListAuditResponse reply;
      const grpc::Status s = stub->ListAudit(Ctx().get(), request, &reply);
      if (status != nullptr) *status = s;
      if (!s.ok()) {
        EXPECT_NE(status, nullptr) << "ListAudit: " << s.error_message();
        return out;
      }
      out.insert(out.end(), reply.entries().begin(), reply.entries().end());
      if (reply.next_page_token().empty()) return out;
      request.set_page_token(reply.next_page_token());
    }
  }

  // The admin's view of `job_id`'s entries for `method`.
  std::vector<v1::AuditEntry> Entries(const std::string& job_id, const std::string& method) {
    v1::ListAuditRequest r;
    r.set_job_id(job_id);
    std::vector<v1::AuditEntry> out;
    for (const v1::AuditEntry& e : ListAll(admin_.get(), r)) {
      if (e.method() == method) out.push_back(e);
    }
    return out;
  }
};

TEST_F(AuditTest, SuccessfulMutationsWriteOneRowEach) {
  StartAgents({"h0", "h1"}, coordinator_->address());
  const std::string scheduler = "scheduler:s@team-a";
  const v1::Job job = Register(As(scheduler).get(), GptJobSpec("audited", "team-a"));

  std::vector<v1::AuditEntry> rows = Entries(job.id(), "RegisterJob");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].identity(), scheduler);
  EXPECT_EQ(rows[0].role(), "scheduler");
  EXPECT_EQ(rows[0].tenant(), "team-a");
  EXPECT_EQ(rows[0].target(), "audited");
  EXPECT_EQ(rows[0].code(), "OK");
  EXPECT_GT(rows[0].unix_ms(), 0);

  v1::ResizeRequest resize;
  resize.set_job_id(job.id());
  resize.set_expected_generation(1);
  *resize.mutable_placement() = MakeLayout(2, 2, 1, {"h0"}, 4).placement();
  *resize.mutable_config() = MakeLayout(2, 2, 1, {"h0"}, 4).config();
  resize.set_idempotency_key("resize-once");
  v1::Operation op;
  ASSERT_TRUE(As(scheduler)->Resize(Ctx().get(), resize, &op).ok());
  // The retry with the same key returns the same operation: a second row,
  // OK, naming the same operation (the call happened twice).
  v1::Operation again;
  ASSERT_TRUE(As(scheduler)->Resize(Ctx().get(), resize, &again).ok());
  ASSERT_EQ(again.id(), op.id());
  ASSERT_TRUE(WaitFinal(admin_.get(), op.id()).ok());

  rows = Entries(job.id(), "Resize");
  ASSERT_EQ(rows.size(), 2u);
  for (const v1::AuditEntry& e : rows) {
    EXPECT_EQ(e.identity(), scheduler);
    EXPECT_EQ(e.tenant(), "team-a");
    EXPECT_EQ(e.operation_id(), op.id());
    EXPECT_EQ(e.idempotency_key(), "resize-once");
    EXPECT_EQ(e.code(), "OK");
  }
  EXPECT_GT(rows[0].id(), rows[1].id());  // newest first

  // The agents registered once each; their heartbeats are not audited.
  v1::ListAuditRequest all;
  std::map<std::string, int> by_method;
  for (const v1::AuditEntry& e : ListAll(admin_.get(), all)) ++by_method[e.method()];
  EXPECT_EQ(by_method["RegisterAgent"], 2);
  EXPECT_EQ(by_method.count("Heartbeat"), 0u);
  EXPECT_EQ(by_method.count("GetTask"), 0u);
  EXPECT_EQ(by_method.count("ReportProgress"), 0u);

  v1::DeleteJobRequest del;
  del.set_job_id(job.id());
  v1::DeleteJobResponse deleted;
  ASSERT_TRUE(As(scheduler)->DeleteJob(Ctx().get(), del, &deleted).ok());
  rows = Entries(job.id(), "DeleteJob");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].tenant(), "team-a");  // read before the job went
  EXPECT_EQ(rows[0].code(), "OK");
}

TEST_F(AuditTest, RefusedCallsWriteTheirRefusal) {
  const v1::Job job = Register(admin_.get(), GptJobSpec("guarded", "team-a"));

  v1::DeleteJobRequest del;
  del.set_job_id(job.id());
  v1::DeleteJobResponse reply;
  grpc::Status s = As("viewer:v@team-a")->DeleteJob(Ctx().get(), del, &reply);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // Another tenant's scheduler hears NOT_FOUND (it must not learn the job
  // exists); the audit keeps the refusal as what it is, for the admin.
  s = As("scheduler:s@team-b")->DeleteJob(Ctx().get(), del, &reply);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_EQ(s.error_message(), "job \"" + job.id() + "\" not found");
  GetJob(admin_.get(), job.id());  // still there

  std::vector<v1::AuditEntry> rows = Entries(job.id(), "DeleteJob");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].identity(), "scheduler:s@team-b");
  EXPECT_EQ(rows[1].identity(), "viewer:v@team-a");
  for (const v1::AuditEntry& e : rows) {
    EXPECT_EQ(e.code(), "PERMISSION_DENIED");
    EXPECT_EQ(e.tenant(), "team-a");  // the job's, whoever asked
    EXPECT_NE(e.message().find("DeleteJob"), std::string::npos) << e.message();
  }

  // Refused by the logic: the same, with the logic's code and message.
  v1::ResizeRequest resize;
  resize.set_job_id(job.id());
  resize.set_expected_generation(1);  // no placement
  v1::Operation op;
  s = admin_->Resize(Ctx().get(), resize, &op);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  rows = Entries(job.id(), "Resize");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].identity(), kAdminIdentity);
  EXPECT_EQ(rows[0].code(), "INVALID_ARGUMENT");
  EXPECT_NE(rows[0].message().find("placement"), std::string::npos) << rows[0].message();

  // Without any identity: UNAUTHENTICATED, with no caller named.
  v1::RegisterJobRequest reg;
  *reg.mutable_spec() = GptJobSpec("anonymous", "team-a");
  v1::RegisterJobResponse registered;
  s = As(kAnonymousIdentity)->RegisterJob(Ctx().get(), reg, &registered);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  v1::ListAuditRequest r;
  r.set_tenant("team-a");
  bool found = false;
  for (const v1::AuditEntry& e : ListAll(admin_.get(), r)) {
    if (e.method() != "RegisterJob" || e.code() != "UNAUTHENTICATED") continue;
    found = true;
    EXPECT_EQ(e.identity(), "");
    EXPECT_EQ(e.target(), "anonymous");
  }
  EXPECT_TRUE(found);

  // A forged agent call is refused and recorded, though agents' routine
  // calls are not.
  v1::HeartbeatRequest hb;
  hb.set_host_id("h0");
  v1::HeartbeatResponse beat;
  s = AgentClient(coordinator_->address(), "agent:h9")->Heartbeat(Ctx().get(), hb, &beat);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  found = false;
  for (const v1::AuditEntry& e : ListAll(admin_.get(), v1::ListAuditRequest())) {
    if (e.method() == "Heartbeat") {
      found = true;
      EXPECT_EQ(e.identity(), "agent:h9");
      EXPECT_EQ(e.target(), "h0");
      EXPECT_EQ(e.code(), "PERMISSION_DENIED");
    }
  }
  EXPECT_TRUE(found);
}

// DeleteJob writes its row inside its transaction before it finds the
// active operation; the refusal rolls the row back with the delete, and
// the call is then recorded once, as refused.
TEST_F(AuditTest, FailedTransactionLeavesNoSuccessRow) {
  StartAgents({"h0", "h1"}, coordinator_->address());
  HoldAgents(true);  // the operation stays TRANSFERRING
  const v1::Job job = Register(admin_.get(), GptJobSpec("busy", "team-a"));
  const v1::Operation op = Resize(admin_.get(), job.id(), 1, MakeLayout(2, 2, 1, {"h0"}, 4));
  ASSERT_TRUE(WaitState(admin_.get(), op.id(), v1::OPERATION_STATE_TRANSFERRING).ok());

  const std::unique_ptr<CoordinatorStub> scheduler = As("scheduler:s@team-a");
  v1::DeleteJobRequest del;
  del.set_job_id(job.id());
  v1::DeleteJobResponse deleted;
  grpc::Status s = scheduler->DeleteJob(Ctx().get(), del, &deleted);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  // A second Resize conflicts with the active one (the store's transaction).
  v1::ResizeRequest resize;
  resize.set_job_id(job.id());
  resize.set_expected_generation(1);
  *resize.mutable_placement() = MakeLayout(2, 2, 1, {"h1"}, 4).placement();
  *resize.mutable_config() = MakeLayout(2, 2, 1, {"h1"}, 4).config();
  v1::Operation second;
  s = scheduler->Resize(Ctx().get(), resize, &second);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();

  HoldAgents(false);
  ASSERT_TRUE(WaitFinal(admin_.get(), op.id()).ok());

  for (const std::string method : {"DeleteJob", "Resize"}) {
    std::vector<v1::AuditEntry> rows;
    for (const v1::AuditEntry& e : Entries(job.id(), method)) {
      if (e.identity() == "scheduler:s@team-a") rows.push_back(e);
    }
    ASSERT_EQ(rows.size(), 1u) << method;
    EXPECT_EQ(rows[0].code(), "FAILED_PRECONDITION") << method;
    EXPECT_NE(rows[0].message().find(op.id()), std::string::npos) << rows[0].message();
  }
}

TEST_F(AuditTest, ListAuditIsScopedToTheCallersTenants) {
  const v1::Job a = Register(admin_.get(), GptJobSpec("ja", "team-a"));
  const v1::Job b = Register(admin_.get(), GptJobSpec("jb", "team-b"));
  const v1::Job c = Register(admin_.get(), GptJobSpec("jc", "team-c"));

  auto jobs_seen = [&](CoordinatorStub* stub, const std::string& tenant, grpc::Status* s) {
    v1::ListAuditRequest r;
    r.set_tenant(tenant);
    std::set<std::string> seen;
    for (const v1::AuditEntry& e : ListAll(stub, r, s)) seen.insert(e.job_id());
    return seen;
  };
  grpc::Status s;
  EXPECT_EQ(jobs_seen(admin_.get(), "", &s), (std::set<std::string>{a.id(), b.id(), c.id()}));
  EXPECT_EQ(jobs_seen(As("viewer:v@team-a").get(), "", &s), (std::set<std::string>{a.id()}));
  EXPECT_EQ(jobs_seen(As("scheduler:s@team-a,team-c").get(), "", &s),
            (std::set<std::string>{a.id(), c.id()}));
  EXPECT_EQ(jobs_seen(As("scheduler:s@team-a,team-c").get(), "team-c", &s),
            (std::set<std::string>{c.id()}));
  EXPECT_TRUE(jobs_seen(As("viewer:v@team-a").get(), "team-b", &s).empty());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(s.error_message().find("team-b"), std::string::npos) << s.error_message();

  // A job filter outside the caller's tenants finds nothing.
  v1::ListAuditRequest r;
  r.set_job_id(b.id());
  EXPECT_TRUE(ListAll(As("viewer:v@team-a").get(), r).empty());

  v1::ListAuditRequest bad;
  bad.set_page_token("not-a-token");
  v1::ListAuditResponse reply;
  s = admin_->ListAudit(Ctx().get(), bad, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("page_token"), std::string::npos) << s.error_message();
}

TEST_F(AuditTest, NoRowHoldsATokensSecret) {
  auto auth = v1::AuthService::NewStub(TestChannel(coordinator_->address(), kAdminIdentity));
  v1::CreateTokenRequest create;
  create.set_name("ci");
  create.set_role("scheduler");
  create.add_tenants("team-a");
  v1::CreateTokenResponse created;
  ASSERT_TRUE(auth->CreateToken(Ctx().get(), create, &created).ok());
  const std::string token = created.bearer_token();
  const std::string secret = token.substr(token.find('.') + 1);
  ASSERT_GE(secret.size(), 32u);

  // Used for a success, a refusal, and (tampered) an authentication failure.
  const std::unique_ptr<CoordinatorStub> anonymous = As(kAnonymousIdentity);
  auto call = [&](const std::string& bearer, const std::string& tenant) {
    auto ctx = Ctx();
    ctx->AddMetadata("authorization", "Bearer " + bearer);
    v1::RegisterJobRequest r;
    *r.mutable_spec() = GptJobSpec("by-token-" + tenant, tenant);
    v1::RegisterJobResponse reply;
    return anonymous->RegisterJob(ctx.get(), r, &reply);
  };
  EXPECT_TRUE(call(token, "team-a").ok());
  EXPECT_EQ(call(token, "team-b").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  std::string tampered = token;
  tampered.back() = tampered.back() == '0' ? '1' : '0';
  EXPECT_EQ(call(tampered, "team-a").error_code(), grpc::StatusCode::UNAUTHENTICATED);

  v1::RevokeTokenRequest revoke;
  revoke.set_token_id(created.token().id());
  v1::Token revoked;
  ASSERT_TRUE(auth->RevokeToken(Ctx().get(), revoke, &revoked).ok());

  std::map<std::string, int> by_method;
  for (const v1::AuditEntry& e : ListAll(admin_.get(), v1::ListAuditRequest())) {
    ++by_method[e.method() + " " + e.code()];
    const std::string row = e.DebugString();
    EXPECT_EQ(row.find(secret), std::string::npos) << row;
    EXPECT_EQ(row.find(secret.substr(0, 16)), std::string::npos) << row;
    if (e.method() == "CreateToken" || e.method() == "RevokeToken") {
      EXPECT_EQ(e.target(), created.token().id());
    }
    if (e.method() == "RegisterJob" && e.code() == "OK") {
      EXPECT_EQ(e.identity(), absl::StrCat("token:", created.token().id(), " (ci)"));
      EXPECT_EQ(e.role(), "scheduler");
    }
  }
  EXPECT_EQ(by_method["CreateToken OK"], 1);
  EXPECT_EQ(by_method["RevokeToken OK"], 1);
  EXPECT_EQ(by_method["RegisterJob OK"], 1);
  EXPECT_EQ(by_method["RegisterJob PERMISSION_DENIED"], 1);
  EXPECT_EQ(by_method["RegisterJob UNAUTHENTICATED"], 1);
}

}  // namespace
}  // namespace reshard::coordinator::testing
