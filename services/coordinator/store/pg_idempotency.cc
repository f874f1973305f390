// Idempotency keys in PostgreSQL (migrations/0001, 0012): one row per
// (tenants, key), the scope being the caller's tenants (idempotency.h,
// whose rules judge a reused key); CreateJob, DeleteJob, CreateOperation
// and TransitionOperation call the helpers below in their own transactions.
#include "absl/strings/str_cat.h"
#include "services/coordinator/store/pg_codec.h"
#include "services/coordinator/store/pg_pool.h"
#include "services/coordinator/store/pg_statements.h"
#include "services/coordinator/store/pg_store.h"
#include "services/coordinator/store/pg_store_internal.h"

namespace reshard::coordinator {
namespace pg {

absl::StatusOr<std::optional<std::string>> FindIdempotentResource(PgTx& tx,
                                                                  const Idempotency& idem) {
  if (absl::Status s = CheckKeyScope(idem); !s.ok()) return s;
  // Only the caller's own scope is read: a key another scope used is free
  // here, and nothing about it (not even that it exists) reaches the caller.
  const pqxx::result r = tx.Exec(kSelectIdempotencyKey, TextArray(idem.tenants), idem.key);
  std::optional<KeyUse> first;
  if (!r.empty()) {
    first = KeyUse{r[0][0].c_str(), pqxx::binarystring(r[0][1]).str(), r[0][2].c_str()};
  }
  return ReplayOf(idem, first);
}

absl::Status ClaimIdempotencyKey(PgTx& tx, const Idempotency& idem, const std::string& resource_id,
                                 const std::string& job_id) {
  const pqxx::result r = tx.Exec(kClaimIdempotencyKey, TextArray(idem.tenants), idem.key,
                                 idem.method, Bytea(idem.request_hash), resource_id, job_id);
  if (r.empty()) return KeyTakenConcurrently(idem);
  return absl::OkStatus();
}

}  // namespace pg

absl::StatusOr<std::optional<std::string>> PgStore::LookupIdempotencyKey(const Idempotency& idem) {
  using Found = std::optional<std::string>;
  if (idem.key.empty()) return Found();
  if (absl::Status s = pg::CheckText("idempotency key", idem.key); !s.ok()) return s;
  return pg::TransactFor<Found>(*pool_, "LookupIdempotencyKey",
                                [&](pg::PgTx& tx) { return pg::FindIdempotentResource(tx, idem); });
}

}  // namespace reshard::coordinator
