// Who is calling, and may they: the coordinator's one authenticator and
// authorizer (docs/security.md). Every handler of both gRPC services goes
// through Authorizer::Admit with its method name and what the request
// names (a host id for AgentService); the rules live only here.
//
// Identities:
//  - a client certificate that chains to --tls-ca (checked by TLS) whose
//    common name is `<role>:<name>`: `agent:<host id>` (bound to that host),
//    `admin:<name>`, `scheduler:<name>@<tenant>[,<tenant>...]`,
//    `viewer:<name>@<tenants>`;
//  - a bearer token (`authorization: Bearer tok-ID.SECRET`, TokenApi) when
//    no certificate was presented: its role and tenants;
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
class ServerContext;
}

namespace reshard::coordinator {

enum class Role { kAdmin, kScheduler, kViewer, kAgent, kWorker };

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
};

/// Parses a certificate common name `<role>:<name>[@tenant,...]` into a
/// principal. InvalidArgument (naming the text) for any other form.
[[nodiscard]] absl::StatusOr<Principal> PrincipalFromCertificateName(const std::string& cn);

class TokenApi;

class Authorizer {
 public:
  /// `insecure`: plaintext mode (see above). `tokens` (may be null: no
  /// bearer tokens) must outlive this.
  Authorizer(bool insecure, const TokenApi* tokens) : insecure_(insecure), tokens_(tokens) {}

  /// Who calls: from the verified client certificate, else the bearer
  /// token. UNAUTHENTICATED naming the method (and the token's id, never
  /// its secret) when neither identifies the caller.
  [[nodiscard]] absl::StatusOr<Principal> Authenticate(const grpc::ServerContext& context,
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
  /// service reads their PTC). PERMISSION_DENIED naming the job and tenant.
  [[nodiscard]] absl::Status AuthorizeJob(const Principal& principal, const char* method,
                                          const std::string& job_id, const std::string& tenant,
                                          const std::vector<std::string>& hosts) const;

  /// Authenticate then Authorize.
  [[nodiscard]] absl::StatusOr<Principal> Admit(const grpc::ServerContext& context,
                                                const char* method,
                                                const std::string& host_id) const;

 private:
  const bool insecure_;
  const TokenApi* tokens_;
};

}  // namespace reshard::coordinator
