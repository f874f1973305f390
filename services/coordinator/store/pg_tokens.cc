// PgStore: bearer tokens (migrations/0004_auth_tokens.sql). Only the SHA-256
// of a token's secret is stored.
#include "absl/strings/str_cat.h"
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

}  // namespace reshard::coordinator
