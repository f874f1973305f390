// Roles and tenants against the real reshard-coordinator (issue 11): for
// every identity (certificates of each role, bearer tokens, none, expired
// and revoked tokens) every RPC of CoordinatorService, AgentService and
// AuthService is either let through to the logic or refused with
// UNAUTHENTICATED / PERMISSION_DENIED, as the role x tenant table says; and
// tokens are created, listed, rotated and revoked with the admin's RPCs.
#include <functional>
#include <map>
#include <regex>
#include <set>

#include "grpcpp/grpcpp.h"
#include "tests/coordinator/server/server_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::GptJobSpec;
using test_support::MakeLayout;
using AuthStub = v1::AuthService::Stub;

// A caller: a certificate common name (or kAnonymousIdentity) and, maybe,
// a bearer token sent with every call.
struct Caller {
  std::string identity;
  std::string token;
};

// How the coordinator must refuse a caller's calls: nobody it knows
// (UNAUTHENTICATED), an identity whose role lacks the call
// (PERMISSION_DENIED), or one whose role has it but not the job (NOT_FOUND,
// as for a job that does not exist).
struct Refusal {
  grpc::StatusCode code = grpc::StatusCode::PERMISSION_DENIED;
};

std::unique_ptr<grpc::ClientContext> CallCtx(const Caller& caller) {
  std::unique_ptr<grpc::ClientContext> c = Ctx();
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  if (!caller.token.empty()) c->AddMetadata("authorization", "Bearer " + caller.token);
  return c;
}

bool Refused(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
         s.error_code() == grpc::StatusCode::PERMISSION_DENIED;
}

// Every job-scoped call, made by `caller` on a job id and an operation id,
// with arguments that pass authorization and are then refused by the logic
// (expected generation 99, rank 99, a committed operation, ...): only the
// authorization's answer differs between callers. A watch that is allowed
// returns OK once its first update came.
using JobCall =
    std::function<grpc::Status(const Caller&, const std::string& job_id, const std::string& op_id)>;
std::map<std::string, JobCall> JobScopedCalls(const std::string& address,
                                              const v1::Layout& layout) {
  auto stub = [address](const Caller& c) { return CoordinatorClient(address, c.identity); };
  return {
      {"GetJob",
       [=](const Caller& c, const std::string& job, const std::string&) {
         v1::GetJobRequest r;
         r.set_job_id(job);
         v1::Job reply;
         return stub(c)->GetJob(CallCtx(c).get(), r, &reply);
       }},
      {"WatchJob",
       [=](const Caller& c, const std::string& job, const std::string&) {
         v1::WatchJobRequest r;
         r.set_job_id(job);
         auto ctx = CallCtx(c);
         auto s = stub(c);
         auto reader = s->WatchJob(ctx.get(), r);
         v1::Job update;
         if (reader->Read(&update)) {
           ctx->TryCancel();
           while (reader->Read(&update)) {
           }
           (void)reader->Finish();
           return grpc::Status::OK;
         }
         return reader->Finish();
       }},
      {"DeleteJob",
       [=](const Caller& c, const std::string& job, const std::string&) {
         v1::DeleteJobRequest r;
         r.set_job_id(job);
         v1::DeleteJobResponse reply;
         return stub(c)->DeleteJob(CallCtx(c).get(), r, &reply);
       }},
      {"Resize",
       [=](const Caller& c, const std::string& job, const std::string&) {
         v1::ResizeRequest r;
         r.set_job_id(job);
         r.set_expected_generation(99);
         *r.mutable_placement() = layout.placement();
         v1::Operation reply;
         return stub(c)->Resize(CallCtx(c).get(), r, &reply);
       }},
      {"Migrate",
       [=](const Caller& c, const std::string& job, const std::string&) {
         v1::MigrateRequest r;
         r.set_job_id(job);
         r.set_expected_generation(99);
         *r.mutable_placement() = layout.placement();
         v1::Operation reply;
         return stub(c)->Migrate(CallCtx(c).get(), r, &reply);
       }},
      {"RecoverFromFailure",
       [=](const Caller& c, const std::string& job, const std::string&) {
         v1::RecoverFromFailureRequest r;
         r.set_job_id(job);
         r.set_expected_generation(99);
         r.add_lost_hosts("h1");
         v1::Operation reply;
         return stub(c)->RecoverFromFailure(CallCtx(c).get(), r, &reply);
       }},
      {"Checkpoint",
       [=](const Caller& c, const std::string& job, const std::string&) {
         v1::CheckpointRequest r;
         r.set_job_id(job);
         r.set_expected_generation(99);
         v1::Operation reply;
         return stub(c)->Checkpoint(CallCtx(c).get(), r, &reply);
       }},
      {"PreviewPlan",
       [=](const Caller& c, const std::string& job, const std::string&) {
         v1::PreviewPlanRequest r;
         r.set_job_id(job);
         *r.mutable_target() = layout;
         v1::PreviewPlanResponse reply;
         return stub(c)->PreviewPlan(CallCtx(c).get(), r, &reply);
       }},
      {"Advise",
       [=](const Caller& c, const std::string& job, const std::string&) {
         v1::AdviseRequest r;
         r.set_job_id(job);
         r.set_gpus(4);
         r.mutable_model()->set_hidden(8);
         r.mutable_model()->set_heads(2);
         r.mutable_model()->set_vocab(32);
         r.mutable_model()->set_seq_length(64);
         r.mutable_model()->set_global_batch(16);
         v1::AdviseResponse reply;
         return stub(c)->Advise(CallCtx(c).get(), r, &reply);
       }},
      {"GetWorkerToken",
       [=](const Caller& c, const std::string& job, const std::string&) {
         v1::GetWorkerTokenRequest r;
         r.set_job_id(job);
         v1::GetWorkerTokenResponse reply;
         return stub(c)->GetWorkerToken(CallCtx(c).get(), r, &reply);
       }},
      {"CommitStep",
       [=](const Caller& c, const std::string& job, const std::string&) {
         v1::CommitStepRequest r;
         r.set_job_id(job);
         r.set_generation(99);
         r.set_step(1);
         r.set_cursor(8);
         r.set_layout_fingerprint("sha256:tenants");
         v1::DatasetState reply;
         return stub(c)->CommitStep(CallCtx(c).get(), r, &reply);
       }},
      {"ReportRankFailure",
       [=](const Caller& c, const std::string& job, const std::string&) {
         v1::ReportRankFailureRequest r;
         r.set_job_id(job);
         r.set_rank(99);
         r.set_reason("tenants");
         v1::RankFailure reply;
         return stub(c)->ReportRankFailure(CallCtx(c).get(), r, &reply);
       }},
      {"GetOperation",
       [=](const Caller& c, const std::string&, const std::string& op) {
         v1::GetOperationRequest r;
         r.set_operation_id(op);
         v1::Operation reply;
         return stub(c)->GetOperation(CallCtx(c).get(), r, &reply);
       }},
      {"WatchOperation",
       [=](const Caller& c, const std::string&, const std::string& op) {
         v1::WatchOperationRequest r;
         r.set_operation_id(op);
         auto ctx = CallCtx(c);
         auto s = stub(c);
         auto reader = s->WatchOperation(ctx.get(), r);
         v1::Operation update;
         if (reader->Read(&update)) {
           ctx->TryCancel();
           while (reader->Read(&update)) {
           }
           (void)reader->Finish();
           return grpc::Status::OK;
         }
         return reader->Finish();
       }},
      {"SetPolicy",
       [=](const Caller& c, const std::string& job, const std::string&) {
         v1::SetPolicyRequest r;
         r.set_job_id(job);
         r.mutable_policy()->set_min_devices(-1);  // refused by the logic
         v1::Job reply;
         return stub(c)->SetPolicy(CallCtx(c).get(), r, &reply);
       }},
      {"CancelOperation",
       [=](const Caller& c, const std::string&, const std::string& op) {
         v1::CancelOperationRequest r;
         r.set_operation_id(op);
         v1::Operation reply;
         return stub(c)->CancelOperation(CallCtx(c).get(), r, &reply);
       }},
      {"MarkPrepared",
       [=](const Caller& c, const std::string&, const std::string& op) {
         v1::MarkPreparedRequest r;
         r.set_operation_id(op);
         v1::Operation reply;
         return stub(c)->MarkPrepared(CallCtx(c).get(), r, &reply);
       }},
  };
}

class AuthTest : public AdminServerTest {
 protected:
  void SetUp() override {
    AdminServerTest::SetUp();
    if (HasFatalFailure()) return;
    admin_auth_ = v1::AuthService::NewStub(TestChannel(coordinator_->address(), kAdminIdentity));
  }

  // An admin-made token; its bearer string.
  std::string Token(const std::string& role, const std::vector<std::string>& tenants,
                    int64_t ttl_seconds = 0, std::string* id = nullptr) {
    v1::CreateTokenRequest r;
    r.set_name(absl::StrCat(role, "-token"));
    r.set_role(role);
    for (const std::string& t : tenants) r.add_tenants(t);
    r.set_ttl_seconds(ttl_seconds);
    v1::CreateTokenResponse reply;
    const grpc::Status s = admin_auth_->CreateToken(Ctx().get(), r, &reply);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (id != nullptr) *id = reply.token().id();
    return reply.bearer_token();
  }

  std::unique_ptr<AuthStub> admin_auth_;
};

TEST_F(AuthTest, RoleTimesRpcMatrix) {
  const std::string address = coordinator_->address();
  StartAgents({"h0", "h1"}, address);
  const v1::Job job = Register(admin_.get(), GptJobSpec("matrix", "team-a"));
  const v1::Operation op = Resize(admin_.get(), job.id(), 1, MakeLayout(2, 2, 1, {"h0"}, 4));
  ASSERT_TRUE(WaitFinal(admin_.get(), op.id()).ok());

  std::string revoked_id;
  const std::string revoked = Token("scheduler", {"team-a"}, 0, &revoked_id);
  {
    v1::RevokeTokenRequest r;
    r.set_token_id(revoked_id);
    v1::Token reply;
    ASSERT_TRUE(admin_auth_->RevokeToken(Ctx().get(), r, &reply).ok());
  }
  const std::string expiring = Token("scheduler", {"team-a"}, 1);
  // Worker tokens (role worker): the job's, another job's, a forged one.
  auto worker_token = [&](const std::string& job_id) {
    v1::GetWorkerTokenRequest r;
    r.set_job_id(job_id);
    v1::GetWorkerTokenResponse reply;
    const grpc::Status s = admin_->GetWorkerToken(Ctx().get(), r, &reply);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return reply.worker_token();
  };
  const std::string job_worker = worker_token(job.id());
  const std::string other_worker =
      worker_token(Register(admin_.get(), GptJobSpec("matrix-other", "team-a")).id());
  const std::string forged_worker =
      "wt-" + job.id() + ".AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";

  // identity -> the calls it may make (every other call must be refused).
  const std::set<std::string> kReads = {"GetJob",       "ListJobs",       "PreviewPlan",
                                        "GetOperation", "WatchOperation", "ListHosts",
                                        "ListAudit",    "Advise",         "WatchJob"};
  const std::set<std::string> kWrites = {"RegisterJob",  "DeleteJob",          "Resize",
                                         "Migrate",      "RecoverFromFailure", "CancelOperation",
                                         "CommitStep",   "GetWorkerToken",     "Checkpoint",
                                         "MarkPrepared", "ReportRankFailure",  "SetPolicy"};
  // A job's worker token: what a training process does on its own job
  // (docs/security.md, "Worker tokens"), and nothing else.
  const std::set<std::string> kWorkerOwnJob = {"GetJob",         "WatchJob",         "GetOperation",
                                               "WatchOperation", "Checkpoint",       "MarkPrepared",
                                               "CommitStep",     "ReportRankFailure"};
  const std::set<std::string> kAgent = {"RegisterAgent", "Heartbeat", "GetTask", "ReportProgress",
                                        "WaitForTasks"};
  // Admin only: AuthService, and NoticeHost (it moves every tenant's jobs).
  const std::set<std::string> kAdminOnly = {"CreateToken", "ListTokens", "RevokeToken",
                                            "NoticeHost"};
  auto both = [](std::set<std::string> a, const std::set<std::string>& b) {
    a.insert(b.begin(), b.end());
    return a;
  };
  const std::vector<std::pair<Caller, std::set<std::string>>> callers = {
      {{kAdminIdentity, ""}, both(both(kReads, kWrites), kAdminOnly)},
      {{"scheduler:s@team-a", ""}, both(kReads, kWrites)},
      {{"scheduler:s@team-c,team-a", ""}, both(kReads, kWrites)},
      {{"viewer:v@team-a", ""}, kReads},
      {{"scheduler:other@team-b", ""}, {"ListHosts"}},
      {{"viewer:other@team-b", ""}, {"ListHosts"}},
      {{"agent:h0", ""}, both(kAgent, {"GetJob"})},
      {{"agent:h7", ""}, {}},  // no job of its host; speaks for h0 below
      {{kAnonymousIdentity, Token("scheduler", {"team-a"})}, both(kReads, kWrites)},
      {{kAnonymousIdentity, Token("viewer", {"team-a"})}, kReads},
      {{kAnonymousIdentity, Token("admin", {})}, both(both(kReads, kWrites), kAdminOnly)},
      {{kAnonymousIdentity, Token("viewer", {"team-b"})}, {"ListHosts"}},
      {{kAnonymousIdentity, ""}, {}},
      {{kAnonymousIdentity, revoked}, {}},
      {{kAnonymousIdentity, "tok-0123456789abcdef.not-a-secret"}, {}},
      {{kAnonymousIdentity, job_worker}, kWorkerOwnJob},
      {{kAnonymousIdentity, other_worker}, {}},
      {{kAnonymousIdentity, forged_worker}, {}},
  };

  int serial = 0;
  using Call = std::function<grpc::Status(const Caller&)>;
  std::map<std::string, Call> calls = {
      {"RegisterJob",
       [&](const Caller& c) {
         v1::RegisterJobRequest r;
         *r.mutable_spec() = GptJobSpec(absl::StrCat("m-", ++serial), "team-a");
         v1::RegisterJobResponse reply;
         return CoordinatorClient(address, c.identity)->RegisterJob(CallCtx(c).get(), r, &reply);
       }},
      {"ListJobs",
       [&](const Caller& c) {
         v1::ListJobsRequest r;
         r.set_tenant("team-a");
         v1::ListJobsResponse reply;
         return CoordinatorClient(address, c.identity)->ListJobs(CallCtx(c).get(), r, &reply);
       }},
      {"DeleteJob",
       [&](const Caller& c) {
         // A job of team-a of its own, so that an allowed delete harms no other case.
         const v1::Job victim =
             Register(admin_.get(), GptJobSpec(absl::StrCat("victim-", ++serial), "team-a"));
         v1::DeleteJobRequest r;
         r.set_job_id(victim.id());
         v1::DeleteJobResponse reply;
         return CoordinatorClient(address, c.identity)->DeleteJob(CallCtx(c).get(), r, &reply);
       }},
      {"ListHosts",
       [&](const Caller& c) {
         v1::ListHostsResponse reply;
         return CoordinatorClient(address, c.identity)
             ->ListHosts(CallCtx(c).get(), v1::ListHostsRequest(), &reply);
       }},
      {"NoticeHost",
       [&](const Caller& c) {
         // Admitted, then refused by the logic (no leaving time): no job moves.
         v1::NoticeHostRequest r;
         r.set_host_id("h0");
         v1::NoticeHostResponse reply;
         return CoordinatorClient(address, c.identity)->NoticeHost(CallCtx(c).get(), r, &reply);
       }},
      {"ListAudit",
       [&](const Caller& c) {
         v1::ListAuditRequest r;
         r.set_tenant("team-a");
         v1::ListAuditResponse reply;
         return CoordinatorClient(address, c.identity)->ListAudit(CallCtx(c).get(), r, &reply);
       }},
      {"RegisterAgent",
       [&](const Caller& c) {
         v1::RegisterAgentRequest r;
         r.mutable_host()->set_host_id("h0");
         r.mutable_host()->set_address("h0:7171");
         v1::RegisterAgentResponse reply;
         return AgentClient(address, c.identity)->RegisterAgent(CallCtx(c).get(), r, &reply);
       }},
      {"Heartbeat",
       [&](const Caller& c) {
         v1::HeartbeatRequest r;
         r.set_host_id("h0");
         r.set_epoch(1);
         v1::HeartbeatResponse reply;
         return AgentClient(address, c.identity)->Heartbeat(CallCtx(c).get(), r, &reply);
       }},
      {"GetTask",
       [&](const Caller& c) {
         v1::GetTaskRequest r;
         r.set_host_id("h0");
         r.set_operation_id(op.id());
         v1::HostTask reply;
         return AgentClient(address, c.identity)->GetTask(CallCtx(c).get(), r, &reply);
       }},
      {"ReportProgress",
       [&](const Caller& c) {
         v1::ReportProgressRequest r;
         r.set_host_id("h0");
         r.set_operation_id(op.id());
         r.set_state(v1::HOST_TASK_STATE_RUNNING);
         v1::ReportProgressResponse reply;
         return AgentClient(address, c.identity)->ReportProgress(CallCtx(c).get(), r, &reply);
       }},
      {"WaitForTasks",
       [&](const Caller& c) {
         v1::WaitForTasksRequest r;
         r.set_host_id("h0");
         r.set_wait_ms(1);  // answered at once whatever h0 is assigned
         v1::WaitForTasksResponse reply;
         return AgentClient(address, c.identity)->WaitForTasks(CallCtx(c).get(), r, &reply);
       }},
      {"CreateToken",
       [&](const Caller& c) {
         v1::CreateTokenRequest r;
         r.set_name("made-in-matrix");
         r.set_role("viewer");
         r.add_tenants("team-a");
         v1::CreateTokenResponse reply;
         return v1::AuthService::NewStub(TestChannel(address, c.identity))
             ->CreateToken(CallCtx(c).get(), r, &reply);
       }},
      {"ListTokens",
       [&](const Caller& c) {
         v1::ListTokensResponse reply;
         return v1::AuthService::NewStub(TestChannel(address, c.identity))
             ->ListTokens(CallCtx(c).get(), v1::ListTokensRequest(), &reply);
       }},
      {"RevokeToken",
       [&](const Caller& c) {
         v1::RevokeTokenRequest r;
         r.set_token_id(revoked_id);  // already revoked: revoking again changes nothing
         v1::Token reply;
         return v1::AuthService::NewStub(TestChannel(address, c.identity))
             ->RevokeToken(CallCtx(c).get(), r, &reply);
       }},
  };
  // The job-scoped calls, on team-a's job and its committed operation
  // (DeleteJob above: on a victim of its own).
  const std::map<std::string, JobCall> job_calls =
      JobScopedCalls(address, MakeLayout(2, 2, 1, {"h1"}, 4));
  for (const auto& [method, call] : job_calls) {
    calls.emplace(method,
                  [call, &job, &op](const Caller& c) { return call(c, job.id(), op.id()); });
  }

  // How each caller that is refused is refused: callers nobody knows are
  // UNAUTHENTICATED, a role that lacks the call PERMISSION_DENIED naming it.
  // A caller whose role has the call but not the job (another tenant's
  // scheduler or viewer, another job's worker token) is told the job (or
  // operation) does not exist, exactly as if it did not: it learns neither
  // whose the job is nor that it exists.
  const std::set<std::string> kJobScoped = {
      "GetJob",       "WatchJob",       "PreviewPlan",        "Advise",
      "GetOperation", "WatchOperation", "CancelOperation",    "DeleteJob",
      "Resize",       "Migrate",        "RecoverFromFailure", "GetWorkerToken",
      "Checkpoint",   "MarkPrepared",   "CommitStep",         "ReportRankFailure",
      "SetPolicy"};
  std::set<std::string> job_call_names;
  for (const auto& [method, call] : job_calls) job_call_names.insert(method);
  EXPECT_EQ(job_call_names, kJobScoped) << "JobScopedCalls makes every job-scoped call";
  const std::string team_b_viewer_token = callers[11].first.token;
  auto role_has = [&](const Caller& c) -> std::set<std::string> {
    if (c.identity == "scheduler:other@team-b") return both(kReads, kWrites);
    if (c.identity == "viewer:other@team-b" || c.token == team_b_viewer_token) return kReads;
    if (c.token == other_worker) return kWorkerOwnJob;
    return {};
  };
  auto refusal_of = [&](const Caller& c, const std::string& method) {
    Refusal r;
    if ((c.identity == kAnonymousIdentity && c.token.empty()) || c.token == revoked ||
        c.token == forged_worker || c.token == "tok-0123456789abcdef.not-a-secret") {
      r.code = grpc::StatusCode::UNAUTHENTICATED;
    } else if (kJobScoped.count(method) > 0 && role_has(c).count(method) > 0) {
      r.code = grpc::StatusCode::NOT_FOUND;
    }
    return r;
  };

  for (const auto& [caller, allowed] : callers) {
    for (const auto& [method, call] : calls) {
      const Refusal refusal = refusal_of(caller, method);
      const grpc::Status s = call(caller);
      const std::string who = caller.identity + (caller.token.empty() ? "" : " + token");
      if (allowed.count(method) > 0) {
        EXPECT_FALSE(Refused(s)) << who << " " << method << ": " << s.error_code() << " "
                                 << s.error_message();
      } else {
        EXPECT_EQ(s.error_code(), refusal.code)
            << who << " " << method << " was not refused as expected: " << s.error_code() << " "
            << s.error_message();
        if (refusal.code == grpc::StatusCode::NOT_FOUND) {
          EXPECT_TRUE(std::regex_match(s.error_message(),
                                       std::regex("(job|operation) \"[0-9a-f]+\" not found")))
              << who << " " << method << ": " << s.error_message();
          EXPECT_EQ(s.error_message().find("team-a"), std::string::npos)
              << who << " " << method << ": " << s.error_message();
        } else {
          EXPECT_NE(s.error_message().find(method), std::string::npos) << s.error_message();
        }
        if (!caller.token.empty()) {
          // A refusal never repeats the secret.
          EXPECT_EQ(s.error_message().find(caller.token.substr(caller.token.find('.') + 1)),
                    std::string::npos)
              << s.error_message();
        }
      }
    }
  }

  // The 1 s token expires: refused from then on (polled, not slept).
  const Caller late{kAnonymousIdentity, expiring};
  grpc::Status last;
  EXPECT_TRUE(Eventually([&] {
    last = calls.at("ListHosts")(late);
    return last.error_code() == grpc::StatusCode::UNAUTHENTICATED;
  }));
  EXPECT_NE(last.error_message().find("expired"), std::string::npos) << last.error_message();
}

// A scheduler rotates its token: the new one works at once, the old one
// works until revoked, and not a call later.
TEST_F(AuthTest, TokenRotation) {
  std::string old_id;
  const std::string old_token = Token("scheduler", {"team-a"}, 3600, &old_id);
  const std::string new_token = Token("scheduler", {"team-a"}, 3600);
  auto list = [&](const std::string& token) {
    v1::ListJobsRequest r;
    v1::ListJobsResponse reply;
    return CoordinatorClient(coordinator_->address(), kAnonymousIdentity)
        ->ListJobs(CallCtx({kAnonymousIdentity, token}).get(), r, &reply);
  };
  EXPECT_TRUE(list(old_token).ok());
  EXPECT_TRUE(list(new_token).ok());
  v1::RevokeTokenRequest revoke;
  revoke.set_token_id(old_id);
  v1::Token revoked;
  ASSERT_TRUE(admin_auth_->RevokeToken(Ctx().get(), revoke, &revoked).ok());
  EXPECT_NE(revoked.revoked_unix_ms(), 0);
  const grpc::Status s = list(old_token);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(s.error_message().find(old_id), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("revoked"), std::string::npos) << s.error_message();
  EXPECT_TRUE(list(new_token).ok());
  // Listed without secrets.
  v1::ListTokensResponse tokens;
  ASSERT_TRUE(admin_auth_->ListTokens(Ctx().get(), v1::ListTokensRequest(), &tokens).ok());
  ASSERT_EQ(tokens.tokens_size(), 2);
  for (const v1::Token& t : tokens.tokens()) {
    EXPECT_EQ(new_token.find(t.id()) == 0 || t.id() == old_id, true);
  }
  EXPECT_EQ(tokens.DebugString().find(new_token.substr(new_token.find('.') + 1)),
            std::string::npos);
  // Bad requests name the field.
  v1::CreateTokenRequest bad;
  bad.set_name("x");
  bad.set_role("scheduler");
  v1::CreateTokenResponse reply;
  const grpc::Status no_tenant = admin_auth_->CreateToken(Ctx().get(), bad, &reply);
  EXPECT_EQ(no_tenant.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(no_tenant.error_message().find("tenants"), std::string::npos);
  bad.set_role("root");
  const grpc::Status bad_role = admin_auth_->CreateToken(Ctx().get(), bad, &reply);
  EXPECT_EQ(bad_role.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bad_role.error_message().find("\"root\""), std::string::npos);
}

// Issue 31, defect 7: a viewer and a scheduler of team-a, and the worker
// token of a team-a job, calling every job-scoped RPC on team-b's job get,
// code and message, exactly what the same call gets on a job (operation)
// that does not exist; neither names team-b. Before, GetJob's refusal was
// PERMISSION_DENIED naming the job's tenant, and an existing job was told
// apart from a missing one.
TEST_F(AuthTest, AnotherTenantsJobAnswersAsAMissingOne) {
  const std::string address = coordinator_->address();
  const v1::Job mine = Register(admin_.get(), GptJobSpec("mine", "team-a"));
  const v1::Job theirs = Register(admin_.get(), GptJobSpec("theirs", "team-b"));
  // An operation of team-b's job (no agents: it never gets far; it exists).
  const v1::Operation their_op =
      Resize(admin_.get(), theirs.id(), 1, MakeLayout(2, 2, 1, {"h0"}, 4));
  const std::string missing_job(theirs.id().size(), '0');
  const std::string missing_op(their_op.id().size(), '1');
  v1::GetWorkerTokenRequest wt;
  wt.set_job_id(mine.id());
  v1::GetWorkerTokenResponse wt_reply;
  ASSERT_TRUE(admin_->GetWorkerToken(Ctx().get(), wt, &wt_reply).ok());

  std::map<std::string, JobCall> calls = JobScopedCalls(address, MakeLayout(2, 2, 1, {"h1"}, 4));
  // The watches resumed from a version: the job (operation) is read before
  // the tenant is checked, and the answer must still be a missing one's.
  calls["WatchJob from_version 1"] = [&](const Caller& c, const std::string& job,
                                         const std::string&) {
    v1::WatchJobRequest r;
    r.set_job_id(job);
    r.set_from_version(1);
    auto ctx = CallCtx(c);
    auto reader = CoordinatorClient(address, c.identity)->WatchJob(ctx.get(), r);
    v1::Job update;
    EXPECT_FALSE(reader->Read(&update)) << c.identity << " read job " << job;
    return reader->Finish();
  };
  calls["WatchOperation from_version 1"] = [&](const Caller& c, const std::string&,
                                               const std::string& op) {
    v1::WatchOperationRequest r;
    r.set_operation_id(op);
    r.set_from_version(1);
    auto ctx = CallCtx(c);
    auto reader = CoordinatorClient(address, c.identity)->WatchOperation(ctx.get(), r);
    v1::Operation update;
    EXPECT_FALSE(reader->Read(&update)) << c.identity << " read operation " << op;
    return reader->Finish();
  };

  const std::vector<Caller> callers = {{"viewer:v@team-a", ""},
                                       {"scheduler:s@team-a", ""},
                                       {kAnonymousIdentity, wt_reply.worker_token()}};
  for (const Caller& c : callers) {
    const std::string who = c.token.empty() ? c.identity : "the worker token of a team-a job";
    for (const auto& [method, call] : calls) {
      const grpc::Status existing = call(c, theirs.id(), their_op.id());
      const grpc::Status missing = call(c, missing_job, missing_op);
      EXPECT_NE(existing.error_code(), grpc::StatusCode::OK) << who << " " << method;
      EXPECT_EQ(existing.error_code(), missing.error_code())
          << who << " " << method << ": " << existing.error_message() << " | "
          << missing.error_message();
      // The message of the missing one, with the ids of team-b's.
      std::string expected = missing.error_message();
      for (const auto& [from, to] :
           {std::pair(missing_job, theirs.id()), std::pair(missing_op, their_op.id())}) {
        for (size_t at = expected.find(from); at != std::string::npos;
             at = expected.find(from, at + to.size())) {
          expected.replace(at, from.size(), to);
        }
      }
      EXPECT_EQ(existing.error_message(), expected) << who << " " << method;
      EXPECT_EQ(existing.error_message().find("team-b"), std::string::npos)
          << who << " " << method << ": " << existing.error_message();
    }
  }
  GetJob(admin_.get(), theirs.id());  // still there: every call was refused
}

}  // namespace
}  // namespace reshard::coordinator::testing
