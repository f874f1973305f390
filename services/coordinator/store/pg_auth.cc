// PgStore: the auth aggregate (auth_store.h): bearer tokens
// (migrations/0004_auth_tokens.sql; only the SHA-256 of a token's secret is
// stored), the cluster's secrets, and the audit trail
// (migrations/0005_audit.sql; audit.h).
#include "absl/strings/str_cat.h"
#include "services/coordinator/store/pg_audit_statements.h"
#include "services/coordinator/store/pg_codec.h"
#include "services/coordinator/store/pg_statements.h"
#include "services/coordinator/store/pg_store.h"
#include "services/coordinator/store/pg_store_internal.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {
namespace {

// The columns of RESHARD_PG_TOKEN_COLUMNS.
TokenRecord TokenFromRow(const pqxx::row& row) {
  TokenRecord t;
  t.id = row[0].c_str();
  t.name = row[1].c_str();
  t.role = row[2].c_str();
  t.tenants = pg::ParseTextArray(row[3]);
  t.created_by = row[4].c_str();
  t.created_unix_ms = row[5].as<int64_t>();
  t.expires_unix_ms = row[6].as<int64_t>();
  if (!row[7].is_null()) t.revoked_unix_ms = row[7].as<int64_t>();
  return t;
}

// Inserts `r` with its result; fills its id, time, tenant and job id.
void InsertAudit(pg::PgTx& tx, AuditRecord& r) {
  auto field = [](const std::string& s) { return Storable(s, kMaxAuditFieldBytes); };
  const pqxx::result row =
      tx.Exec(pg::kInsertAudit, field(r.identity), field(r.role), field(r.tenant), field(r.method),
              field(r.job_id), field(r.operation_id), field(r.target), field(r.idempotency_key),
              field(r.code), Storable(r.message, kMaxAuditMessageBytes));
  r.id = row[0][0].as<int64_t>();
  r.at_unix_ms = row[0][1].as<int64_t>();
}

AuditRecord AuditFromRow(const pqxx::row& row) {
  AuditRecord r;
  r.id = row[0].as<int64_t>();
  r.at_unix_ms = row[1].as<int64_t>();
  r.identity = row[2].c_str();
  r.role = row[3].c_str();
  r.tenant = row[4].c_str();
  r.method = row[5].c_str();
  r.job_id = row[6].c_str();
  r.operation_id = row[7].c_str();
  r.target = row[8].c_str();
  r.idempotency_key = row[9].c_str();
  r.code = row[10].c_str();
  r.message = row[11].c_str();
  r.committed = true;
  return r;
}

}  // namespace

absl::Status PgStore::CreateToken(const TokenRecord& token, const std::string& secret_sha256) {
  if (absl::Status s = CheckNewToken(token); !s.ok()) return s;
  return pool_->Transact("CreateToken", [&](pg::PgTx& tx) -> absl::Status {
    tx.Exec(pg::kInsertToken, token.id, pg::Bytea(secret_sha256), token.name, token.role,
            pg::TextArray(token.tenants), token.created_by, token.created_unix_ms,
            token.expires_unix_ms);
    pg::WriteAudit(tx, "", "", token.id);
    return absl::OkStatus();
  });
}

absl::StatusOr<TokenRecord> PgStore::FindToken(const std::string& secret_sha256) {
  return pg::TransactFor<TokenRecord>(
      *pool_, "FindToken", [&](pg::PgTx& tx) -> absl::StatusOr<TokenRecord> {
        const pqxx::result r = tx.Exec(pg::kSelectTokenByHash, pg::Bytea(secret_sha256));
        if (r.empty()) return absl::NotFoundError("no such token");
        return TokenFromRow(r[0]);
      });
}

absl::StatusOr<TokenRecord> PgStore::RevokeToken(const std::string& id, int64_t now_unix_ms) {
  return pg::TransactFor<TokenRecord>(
      *pool_, "RevokeToken", [&](pg::PgTx& tx) -> absl::StatusOr<TokenRecord> {
        const pqxx::result r = tx.Exec(pg::kRevokeToken, id, now_unix_ms);
        if (r.empty()) return absl::NotFoundError(absl::StrCat("token \"", id, "\" not found"));
        pg::WriteAudit(tx, "", "", id);
        return TokenFromRow(r[0]);
      });
}

absl::StatusOr<std::vector<TokenRecord>> PgStore::ListTokens() {
  using Tokens = std::vector<TokenRecord>;
  return pg::TransactFor<Tokens>(*pool_, "ListTokens", [&](pg::PgTx& tx) {
    Tokens out;
    for (const pqxx::row& row : tx.Exec(pg::kListTokens)) out.push_back(TokenFromRow(row));
    return absl::StatusOr<Tokens>(std::move(out));
  });
}

absl::StatusOr<std::string> PgStore::GetOrCreateClusterSecret(const std::string& name,
                                                              const std::string& candidate) {
  return pg::TransactFor<std::string>(
      *pool_, "GetOrCreateClusterSecret", [&](pg::PgTx& tx) -> absl::StatusOr<std::string> {
        tx.Exec(pg::kInsertClusterSecret, name, pg::Bytea(candidate));
        const pqxx::result r = tx.Exec(pg::kSelectClusterSecret, name);
        if (r.empty())
          return absl::InternalError(absl::StrCat("cluster secret \"", name, "\" missing"));
        const pqxx::binarystring bytes(r[0][0]);
        return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      });
}

// ---- Audit ----------------------------------------------------------------

namespace pg {

void WriteAudit(PgTx& tx, const std::string& job_id, const std::string& operation_id,
                const std::string& target) {
  AuditRecord* current = AuditScope::Current();
  if (current == nullptr) return;
  // The body may run again (PgPool::Transact): work on a copy each time.
  AuditRecord r = SucceededAudit(*current, job_id, operation_id, target);
  InsertAudit(tx, r);
  tx.OnCommit([current, r] {
    *current = r;
    current->committed = true;
  });
}

}  // namespace pg

absl::Status PgStore::AppendAudit(const AuditRecord& record) {
  return pool_->Transact("AppendAudit", [&](pg::PgTx& tx) -> absl::Status {
    AuditRecord r = record;
    InsertAudit(tx, r);
    return absl::OkStatus();
  });
}

absl::StatusOr<AuditPage> PgStore::ListAudit(const AuditQuery& query) {
  if (absl::Status s = CheckAuditQuery(query); !s.ok()) return s;
  return pg::TransactFor<AuditPage>(
      *pool_, "ListAudit", [&](pg::PgTx& tx) -> absl::StatusOr<AuditPage> {
        // One row more than the page tells whether another page follows.
        const pqxx::result rows =
            tx.Exec(pg::kListAudit, pg::TextArray(query.tenants), query.job_id, query.since_unix_ms,
                    query.before_id, query.page_size + 1);
        AuditPage page;
        for (const pqxx::row& row : rows) {
          if (static_cast<int>(page.records.size()) == query.page_size) {
            page.next_before_id = page.records.back().id;
            break;
          }
          page.records.push_back(AuditFromRow(row));
        }
        return page;
      });
}

}  // namespace reshard::coordinator
