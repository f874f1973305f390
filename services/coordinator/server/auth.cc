#include "services/coordinator/server/auth.h"

#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/tls.h"
#include "grpcpp/server_context.h"
#include "services/coordinator/logic/cluster_secrets.h"
#include "services/coordinator/logic/tokens.h"

namespace reshard::coordinator {
namespace {

// The role × method table, and which calls the audit trail records. A
// method absent here is refused to everyone but admin and not audited.
struct MethodRule {
  const char* method;
  std::vector<Role> roles;  // besides admin, which may call every scheduler method
  bool agent_service;       // AgentService: only agents, each for its own host
  AuditLevel audit;
};

const std::vector<MethodRule>& Rules() {
  constexpr AuditLevel kNo = AuditLevel::kNone;
  constexpr AuditLevel kAll = AuditLevel::kEveryCall;
  // Agents' heartbeats, task polls and progress reports come several times
  // a second per host: only their refusals are recorded.
  constexpr AuditLevel kRefused = AuditLevel::kRefusals;
  static const auto* const kRules = new std::vector<MethodRule>{
      // CoordinatorService: reads.
      // Role kWorker (a job's worker token) is scoped to that one job: the
      // handlers check the job a request names, or its operation's job
      // (CoordinatorServiceImpl::InJobTenant, InOperationTenant).
      {"GetJob", {Role::kScheduler, Role::kViewer, Role::kAgent, Role::kWorker}, false, kNo},
      {"ListJobs", {Role::kScheduler, Role::kViewer}, false, kNo},
      {"PreviewPlan", {Role::kScheduler, Role::kViewer}, false, kNo},
      {"GetOperation", {Role::kScheduler, Role::kViewer, Role::kWorker}, false, kNo},
      {"WatchOperation", {Role::kScheduler, Role::kViewer, Role::kWorker}, false, kNo},
      {"WatchJob", {Role::kScheduler, Role::kViewer, Role::kWorker}, false, kNo},
      {"ListHosts", {Role::kScheduler, Role::kViewer}, false, kNo},
      {"ListAudit", {Role::kScheduler, Role::kViewer}, false, kNo},
      {"Advise", {Role::kScheduler, Role::kViewer}, false, kNo},
      // CoordinatorService: changes.
      {"RegisterJob", {Role::kScheduler}, false, kAll},
      {"DeleteJob", {Role::kScheduler}, false, kAll},
      {"Resize", {Role::kScheduler}, false, kAll},
      {"Migrate", {Role::kScheduler}, false, kAll},
      {"RecoverFromFailure", {Role::kScheduler}, false, kAll},
      {"SetPolicy", {Role::kScheduler}, false, kAll},
      // A training process's own calls on its job (the loop API,
      // docs/pytorch.md): the job's worker token suffices.
      {"Checkpoint", {Role::kScheduler, Role::kWorker}, false, kAll},
      {"MarkPrepared", {Role::kScheduler, Role::kWorker}, false, kAll},
      {"ReportRankFailure", {Role::kScheduler, Role::kWorker}, false, kAll},
      {"CancelOperation", {Role::kScheduler}, false, kAll},
      // The training loop's step commits (docs/data.md).
      {"CommitStep", {Role::kScheduler, Role::kWorker}, false, kAll},
      // Hands out a secret: every call recorded.
      {"GetWorkerToken", {Role::kScheduler}, false, kAll},
      // Moves the jobs of every tenant on a host: admin only, recorded.
      {"NoticeHost", {}, false, kAll},
      // AgentService.
      {"RegisterAgent", {Role::kAgent}, true, kAll},
      {"Heartbeat", {Role::kAgent}, true, kRefused},
      {"GetTask", {Role::kAgent}, true, kRefused},
      {"ReportProgress", {Role::kAgent}, true, kRefused},
      {"WaitForTasks", {Role::kAgent}, true, kRefused},
      // AuthService: admin only.
      {"CreateToken", {}, false, kAll},
      {"RevokeToken", {}, false, kAll},
      {"ListTokens", {}, false, kNo},
  };
  return *kRules;
}

const MethodRule* FindRule(const char* method) {
  for (const MethodRule& r : Rules()) {
    if (std::strcmp(r.method, method) == 0) return &r;
  }
  return nullptr;
}

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kAdmin:
      return "admin";
    case Role::kScheduler:
      return "scheduler";
    case Role::kViewer:
      return "viewer";
    case Role::kAgent:
      return "agent";
    case Role::kWorker:
      return "worker";
  }
  return "unknown";
}

bool ParseRole(const std::string& text, Role* role) {
  for (Role r : {Role::kAdmin, Role::kScheduler, Role::kViewer, Role::kAgent, Role::kWorker}) {
    if (text == RoleName(r)) {
      *role = r;
      return true;
    }
  }
  return false;
}

absl::StatusOr<Principal> PrincipalFromCertificateName(const std::string& cn) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "certificate common name \"", cn, "\": ", why,
        " (expected agent:HOST, admin:NAME, scheduler:NAME@TENANTS or viewer:NAME@TENANTS)"));
  };
  const size_t colon = cn.find(':');
  if (colon == std::string::npos) return bad("no role");
  Principal p;
  p.name = cn;
  if (!ParseRole(cn.substr(0, colon), &p.role) || p.role == Role::kWorker) {
    return bad("unknown role");
  }
  std::string rest = cn.substr(colon + 1);
  const size_t at = rest.find('@');
  if (at != std::string::npos) {
    for (absl::string_view t : absl::StrSplit(rest.substr(at + 1), ',', absl::SkipEmpty())) {
      p.tenants.emplace_back(t);
    }
    rest.resize(at);
  }
  if (rest.empty()) return bad("empty name");
  switch (p.role) {
    case Role::kAgent:
      if (at != std::string::npos) return bad("an agent has no tenants");
      p.host_id = rest;
      break;
    case Role::kScheduler:
    case Role::kViewer:
      if (p.tenants.empty()) return bad("a scheduler or viewer needs @TENANT[,TENANT...]");
      break;
    default:
      break;
  }
  return p;
}

absl::StatusOr<Principal> Authorizer::Authenticate(const grpc::ServerContextBase& context,
                                                   const char* method) const {
  if (insecure_) {
    Principal p;
    p.name = "insecure";
    p.role = Role::kAdmin;
    p.any_host = true;
    return p;
  }
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  const std::string cn = auth == nullptr ? "" : PeerCertificateName(*auth);
  if (cn.empty()) {
    const auto& metadata = context.client_metadata();
    const auto header = metadata.find("authorization");
    if (header == metadata.end()) {
      return absl::UnauthenticatedError(absl::StrCat(
          method, ": neither a client certificate (mutual TLS) nor a bearer token was presented"));
    }
    const std::string value(header->second.data(), header->second.size());
    if (!absl::StartsWith(value, "Bearer ") || tokens_ == nullptr) {
      return absl::UnauthenticatedError(
          absl::StrCat(method, ": the authorization header is not `Bearer <token>`"));
    }
    if (ClusterSecrets::IsWorkerToken(value.substr(7))) {
      if (secrets_ == nullptr) {
        return absl::UnauthenticatedError(
            absl::StrCat(method, ": worker tokens are not accepted here"));
      }
      absl::StatusOr<std::string> job = secrets_->VerifyWorkerToken(value.substr(7));
      if (!job.ok()) {
        return absl::Status(job.status().code(),
                            absl::StrCat(method, ": ", job.status().message()));
      }
      Principal p;
      p.name = absl::StrCat("worker:", *job);
      p.role = Role::kWorker;
      p.job_id = *job;
      return p;
    }
    absl::StatusOr<TokenRecord> token = tokens_->Verify(value.substr(7));
    if (!token.ok()) {
      return absl::Status(token.status().code(),
                          absl::StrCat(method, ": ", token.status().message()));
    }
    Principal p;
    p.name = absl::StrCat("token:", token->id, " (", token->name, ")");
    if (!ParseRole(token->role, &p.role)) {
      return absl::UnauthenticatedError(
          absl::StrCat(method, ": bearer token \"", token->id, "\" has an unknown role"));
    }
    p.tenants = token->tenants;
    return p;
  }
  absl::StatusOr<Principal> p = PrincipalFromCertificateName(cn);
  if (!p.ok()) return absl::UnauthenticatedError(absl::StrCat(method, ": ", p.status().message()));
  return p;
}

absl::Status Authorizer::Authorize(const Principal& principal, const char* method,
                                   const std::string& host_id) const {
  auto refuse = [&](const std::string& why) {
    return absl::PermissionDeniedError(absl::StrCat(method, " refused to \"", principal.name,
                                                    "\" (role ", RoleName(principal.role),
                                                    "): ", why));
  };
  const MethodRule* rule = FindRule(method);
  if (rule == nullptr) {
    if (principal.role == Role::kAdmin) return absl::OkStatus();
    return refuse("only an admin may call it");
  }
  if (rule->agent_service) {
    if (principal.any_host) return absl::OkStatus();
    if (principal.role != Role::kAgent) return refuse("only agents call AgentService");
    if (host_id != principal.host_id) {
      return refuse(absl::StrCat("the request speaks for host \"", host_id,
                                 "\" but the certificate is bound to host \"", principal.host_id,
                                 "\""));
    }
    return absl::OkStatus();
  }
  if (principal.role == Role::kAdmin) return absl::OkStatus();
  for (Role r : rule->roles) {
    if (r == principal.role) return absl::OkStatus();
  }
  return refuse(rule->roles.empty() ? "only an admin may call it" : "the role may not call it");
}

absl::Status Authorizer::AuthorizeTenant(const Principal& principal, const char* method,
                                         const std::string& tenant) const {
  if (!ScopedToTenants(principal)) return absl::OkStatus();
  for (const std::string& t : principal.tenants) {
    if (t == tenant) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      method, " in tenant \"", tenant, "\" refused to \"", principal.name, "\" (role ",
      RoleName(principal.role), "): its tenants are ", absl::StrJoin(principal.tenants, ",")));
}

absl::Status Authorizer::AuthorizeJob(const Principal& principal, const char* method,
                                      const std::string& job_id, const std::string& tenant,
                                      const std::vector<std::string>& hosts) const {
  // No refusal names the job's tenant or tells whether the job exists: a
  // scheduler, viewer or worker outside it gets the answer of a job that
  // does not exist, word for word; an agent (infrastructure, told the job
  // is not on its host) PERMISSION_DENIED without the tenant.
  auto refuse = [&](const std::string& why) {
    return absl::PermissionDeniedError(absl::StrCat(method, " of job \"", job_id,
                                                    "\" refused to \"", principal.name, "\" (role ",
                                                    RoleName(principal.role), "): ", why));
  };
  // The refusal itself rides along for the audit (kHiddenRefusalPayload).
  auto hidden = [&](const std::string& why) {
    absl::Status s = absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found"));
    s.SetPayload(
        kHiddenRefusalPayload,
        absl::Cord(refuse(absl::StrCat(why, "; the job's tenant is \"", tenant, "\"")).message()));
    return s;
  };
  switch (principal.role) {
    case Role::kAdmin:
      return absl::OkStatus();
    case Role::kScheduler:
    case Role::kViewer:
      for (const std::string& t : principal.tenants) {
        if (t == tenant) return absl::OkStatus();
      }
      return hidden(absl::StrCat("its tenants are ", absl::StrJoin(principal.tenants, ",")));
    case Role::kWorker:
      if (principal.job_id == job_id) return absl::OkStatus();
      return hidden(absl::StrCat("its worker token is for job \"", principal.job_id, "\""));
    case Role::kAgent:
      if (principal.any_host) return absl::OkStatus();
      for (const std::string& h : hosts) {
        if (h == principal.host_id) return absl::OkStatus();
      }
      return refuse(absl::StrCat("the job is not placed on host \"", principal.host_id, "\""));
  }
  return refuse("unknown role");
}

AuditLevel Authorizer::AuditOf(const char* method) {
  const MethodRule* rule = FindRule(method);
  return rule == nullptr ? AuditLevel::kNone : rule->audit;
}

}  // namespace reshard::coordinator
