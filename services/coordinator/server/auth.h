// Who is calling, and may they: the coordinator's one authenticator and
// authorizer (docs/security.md). Every handler of the gRPC services goes
// through RunAdmitted (rpc_status.h: Authenticate, then Authorize) with its
// method name and what the request names (a host id for AgentService); the
// rules, and which calls the audit trail records, live only here.
//
// Identities:
//  - a client certificate that chains to --tls-ca (checked by TLS) whose
//    common name is `<role>:<name>`: `agent:<host id>` (bound to that host),
//    `admin:<name>`, `scheduler:<name>@<tenant>[,<tenant>...]`,
//    `viewer:<name>@<tenants>`;
//  - a bearer token (`authorization: Bearer tok-ID.SECRET`, TokenApi) when
//    no certificate was presented: its role and tenants;
//  - a job's worker token (`authorization: Bearer wt-JOB.MAC`,
//    ClusterSecrets): the role `worker`, a training process's credential
//    scoped to that one job: GetJob, WatchJob, GetOperation and
//    WatchOperation (of the job's operations), Checkpoint, CommitStep,
//    MarkPrepared and ReportRankFailure on that job; on any other job
//    PERMISSION_DENIED naming it, and every other method refused;
//  - with --insecure (plaintext), every caller is the admin `insecure` and an
//    agent may speak for any host: an explicit, logged choice for tests and
//    single-user machines.
//
// Thread-safe (immutable after construction).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace grpc {
class ServerContextBase;
}

namespace reshard::coordinator {

/// The payload of a refusal answered as NOT_FOUND (Authorizer::AuthorizeJob:
/// the caller must not learn that the job exists): the PERMISSION_DENIED
/// message that the audit records (CallAudit) and the caller never sees
/// (payloads do not cross gRPC).
inline constexpr char kHiddenRefusalPayload[] = "type.reshard/hidden-refusal";

enum class Role { kAdmin, kScheduler, kViewer, kAgent, kWorker };

/// Which calls of a method the audit trail records (docs/security.md).
enum class AuditLevel {
  kNone,       // reads
  kRefusals,   // only UNAUTHENTICATED / PERMISSION_DENIED (high-volume agent calls)
  kEveryCall,  // mutations: every call, whatever its result
};

/// "admin", "scheduler", ...; ParseRole is its inverse (false: unknown).
const char* RoleName(Role role);
bool ParseRole(const std::string& text, Role* role);

/// An authenticated caller.
struct Principal {
  /// What logs and refusals call it: the certificate's common name.
  std::string name;
  Role role = Role::kViewer;
  /// scheduler / viewer: the tenants it may touch; admin: ignored (all).
  std::vector<std::string> tenants;
  /// agent: the host its certificate is bound to.
  std::string host_id;
  /// --insecure: an agent principal that may speak for any host.
  bool any_host = false;
  /// worker: the one job its worker token is for.
  std::string job_id;
};

/// Parses a certificate common name `<role>:<name>[@tenant,...]` into a
/// principal. InvalidArgument (naming the text) for any other form.
[[nodiscard]] absl::StatusOr<Principal> PrincipalFromCertificateName(const std::string& cn);

class TokenApi;
class AuditApi;
class ClusterSecrets;

class Authorizer {
 public:
  /// `insecure`: plaintext mode (see above). `tokens` (may be null: no
  /// bearer tokens), `audit` (may be null: no audit trail) and `secrets`
  /// (may be null: no worker tokens) must outlive this.
  Authorizer(bool insecure, const TokenApi* tokens, AuditApi* audit = nullptr,
             ClusterSecrets* secrets = nullptr)
      : insecure_(insecure), tokens_(tokens), audit_(audit), secrets_(secrets) {}

  /// What the audit trail records of `method` (the method table).
  static AuditLevel AuditOf(const char* method);
  /// Where audit rows go; null: nowhere.
  AuditApi* audit() const { return audit_; }

  /// Who calls: from the verified client certificate, else the bearer
  /// token. UNAUTHENTICATED naming the method (and the token's id, never
  /// its secret) when neither identifies the caller.
  [[nodiscard]] absl::StatusOr<Principal> Authenticate(const grpc::ServerContextBase& context,
                                                       const char* method) const;

  /// Whether `principal` may call `method` (a CoordinatorService or
  /// AgentService method name) on `host_id` (AgentService: the host the
  /// request speaks for; empty otherwise). PERMISSION_DENIED naming the
  /// principal, its role, the method and the host.
  [[nodiscard]] absl::Status Authorize(const Principal& principal, const char* method,
                                       const std::string& host_id) const;

  /// Whether `principal` is scoped to tenants (scheduler, viewer), so that
  /// a call on a job must first look its tenant up.
  bool ScopedToTenants(const Principal& principal) const {
    return principal.role == Role::kScheduler || principal.role == Role::kViewer;
  }

  /// Whether `principal` may act in `tenant` (RegisterJob's spec, ListJobs'
  /// filter): admin always, scheduler and viewer within their tenants.
  [[nodiscard]] absl::Status AuthorizeTenant(const Principal& principal, const char* method,
                                             const std::string& tenant) const;

  /// Whether `principal` may see or act on job `job_id` of `tenant`, placed
  /// on `hosts` (its current placement): admin always; scheduler and viewer
  /// within their tenants; an agent for jobs placed on its host (its worker
  /// service reads their PTC); a worker for the job of its token. A
  /// scheduler, viewer or worker refused gets what a job that does not
  /// exist gets, word for word (NOT_FOUND `job "X" not found`): a refusal
  /// tells neither whose the job is nor whether it exists. An agent
  /// refused: PERMISSION_DENIED naming the job and its host, not the tenant.
  [[nodiscard]] absl::Status AuthorizeJob(const Principal& principal, const char* method,
                                          const std::string& job_id, const std::string& tenant,
                                          const std::vector<std::string>& hosts) const;

 private:
  const bool insecure_;
  const TokenApi* tokens_;
  AuditApi* const audit_;
  ClusterSecrets* const secrets_;
};

}  // namespace reshard::coordinator
