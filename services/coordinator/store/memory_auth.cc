// MemoryStore: the auth aggregate (auth_store.h): bearer tokens, cluster
// secrets and the audit trail (as pg_auth.cc).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "services/coordinator/store/memory_store.h"
#include "services/coordinator/store/memory_store_internal.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {

// ---- Bearer tokens and cluster secrets -----------------------------------------

absl::Status MemoryStore::CreateToken(const TokenRecord& token, const std::string& secret_sha256) {
  if (absl::Status s = CheckNewToken(token); !s.ok()) return s;
  if (token.role != "admin" && token.role != "scheduler" && token.role != "viewer") {
    return absl::InternalError(
        absl::StrCat("token role \"", token.role, "\" violates auth_tokens_role_check"));
  }
  std::lock_guard<CallLock> l(mu_);
  for (const auto& [id, t] : tokens_) {
    if (id == token.id || t.secret_sha256 == secret_sha256) {
      return absl::AlreadyExistsError(
          absl::StrCat("token ", id == token.id ? absl::StrCat("\"", id, "\"") : "with that secret",
                       " already exists"));
    }
  }
  TokenRecord stored = token;
  stored.revoked_unix_ms.reset();
  tokens_[token.id] = Token{std::move(stored), secret_sha256};
  Tx tx;
  WriteAudit(tx, "", "", token.id);
  Commit(tx);
  return absl::OkStatus();
}

absl::StatusOr<TokenRecord> MemoryStore::FindToken(const std::string& secret_sha256) {
  std::lock_guard<CallLock> l(mu_);
  for (const auto& [id, t] : tokens_) {
    if (t.secret_sha256 == secret_sha256) return t.record;
  }
  return absl::NotFoundError("no such token");
}

absl::StatusOr<TokenRecord> MemoryStore::RevokeToken(const std::string& id, int64_t now_unix_ms) {
  std::lock_guard<CallLock> l(mu_);
  auto it = tokens_.find(id);
  if (it == tokens_.end()) return absl::NotFoundError(absl::StrCat("token \"", id, "\" not found"));
  if (!it->second.record.revoked_unix_ms.has_value()) {
    it->second.record.revoked_unix_ms = now_unix_ms;
  }
  Tx tx;
  WriteAudit(tx, "", "", id);
  Commit(tx);
  return it->second.record;
}

absl::StatusOr<std::vector<TokenRecord>> MemoryStore::ListTokens() {
  std::lock_guard<CallLock> l(mu_);
  std::vector<TokenRecord> out;
  for (const auto& [id, t] : tokens_) out.push_back(t.record);
  return out;
}

absl::StatusOr<std::string> MemoryStore::GetOrCreateClusterSecret(const std::string& name,
                                                                  const std::string& candidate) {
  std::lock_guard<CallLock> l(mu_);
  auto it = cluster_secrets_.find(name);
  if (it != cluster_secrets_.end()) return it->second;
  if (candidate.size() != 32) {
    return absl::InternalError(absl::StrCat("cluster secret \"", name, "\": ", candidate.size(),
                                            " bytes violates length(secret) = 32"));
  }
  cluster_secrets_[name] = candidate;
  return candidate;
}

// ---- Audit ----------------------------------------------------------------------

absl::Status MemoryStore::AppendAudit(const AuditRecord& record) {
  std::lock_guard<CallLock> l(mu_);
  AuditRecord r = record;
  InsertAudit(r);
  return absl::OkStatus();
}

absl::StatusOr<AuditPage> MemoryStore::ListAudit(const AuditQuery& query) {
  if (absl::Status s = CheckAuditQuery(query); !s.ok()) return s;
  std::lock_guard<CallLock> l(mu_);
  AuditPage page;
  for (auto it = audit_.rbegin(); it != audit_.rend(); ++it) {
    const AuditRecord& r = it->second;
    if (query.before_id != 0 && r.id >= query.before_id) continue;
    if (!query.tenants.empty() &&
        std::find(query.tenants.begin(), query.tenants.end(), r.tenant) == query.tenants.end()) {
      continue;
    }
    if (!query.job_id.empty() && r.job_id != query.job_id) continue;
    if (r.at_unix_ms < query.since_unix_ms) continue;
    if (static_cast<int>(page.records.size()) == query.page_size) {
      page.next_before_id = page.records.back().id;
      break;
    }
    page.records.push_back(r);
  }
  return page;
}

}  // namespace reshard::coordinator
