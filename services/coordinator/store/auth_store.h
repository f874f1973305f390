// The auth aggregate of the Store (store.h): bearer tokens, the cluster's
// secrets and the audit trail (docs/security.md). PgStore (pg_auth.cc) and
// MemoryStore (memory_auth.cc) implement it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/coordinator/store/audit.h"

namespace reshard::coordinator {

/// A bearer token as stored (migrations/0004): never its secret, only the
/// secret's SHA-256 (kept by the store, not returned).
struct TokenRecord {
  std::string id;    // public part, "tok-" + 16 hex
  std::string name;  // what the admin called it
  std::string role;  // "admin", "scheduler" or "viewer"
  std::vector<std::string> tenants;
  std::string created_by;
  int64_t created_unix_ms = 0;
  int64_t expires_unix_ms = 0;
  std::optional<int64_t> revoked_unix_ms;
};

/// Which audit rows ListAudit returns: newest first.
struct AuditQuery {
  std::vector<std::string> tenants;  // empty: every tenant
  std::string job_id;                // empty: every job
  int64_t since_unix_ms = 0;         // rows at or after this time
  int64_t before_id = 0;             // page token: rows with a smaller id; 0: newest
  int page_size = 100;
};

struct AuditPage {
  std::vector<AuditRecord> records;
  int64_t next_before_id = 0;  // 0 on the last page
};

class AuthStore {
 public:
  virtual ~AuthStore() = default;

  // ---- Bearer tokens (docs/security.md) ----
  /// Stores a token with the SHA-256 of its secret (raw 32 bytes).
  /// AlreadyExists for a used id or hash.
  [[nodiscard]] virtual absl::Status CreateToken(const TokenRecord& token,
                                                 const std::string& secret_sha256) = 0;
  /// The token whose secret hashes to `secret_sha256`, revoked or expired
  /// ones included; NotFound when none.
  [[nodiscard]] virtual absl::StatusOr<TokenRecord> FindToken(const std::string& secret_sha256) = 0;
  /// Marks the token revoked at `now_unix_ms` (again: no change). NotFound.
  [[nodiscard]] virtual absl::StatusOr<TokenRecord> RevokeToken(const std::string& id,
                                                                int64_t now_unix_ms) = 0;
  /// Every token, by id.
  [[nodiscard]] virtual absl::StatusOr<std::vector<TokenRecord>> ListTokens() = 0;
  /// The cluster's secret `name` (32 bytes): `candidate` is stored if none
  /// is yet (the first replica to ask wins), then the stored one returned.
  [[nodiscard]] virtual absl::StatusOr<std::string> GetOrCreateClusterSecret(
      const std::string& name, const std::string& candidate) = 0;

  // ---- Audit (audit.h; docs/security.md) ----------------------------------
  // Mutations made on a caller's behalf (CreateJob, DeleteJob,
  // CreateOperation, TransitionOperation to ABORTED, RegisterHost,
  // CreateToken, RevokeToken) also write the thread's AuditScope record, if
  // any, in their own transaction, and mark it committed.
  /// Writes `record` in its own transaction (a refused or failed call).
  [[nodiscard]] virtual absl::Status AppendAudit(const AuditRecord& record) = 0;
  [[nodiscard]] virtual absl::StatusOr<AuditPage> ListAudit(const AuditQuery& query) = 0;
};

}  // namespace reshard::coordinator
