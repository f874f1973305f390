// The audit trail's SQL (migrations/0005_audit.sql; pg_auth.cc). Listed in
// AllStatements (pg_statements.cc) like every other statement.
#pragma once

#include "services/coordinator/store/pg_pool.h"

namespace reshard::coordinator::pg {

// $1 identity, $2 role, $3 tenant, $4 method, $5 job id, $6 operation id,
// $7 target, $8 idempotency key, $9 code, $10 message. An empty job id is
// taken from the operation, an empty tenant from the job (so DeleteJob
// writes its row before deleting). Time: the database's clock, like
// retention's ages.
inline constexpr Statement kInsertAudit{
    "insert_audit",
    "INSERT INTO audit_log (at_unix_ms, identity, role, tenant, method, job_id, operation_id, "
    "target, idempotency_key, code, message) SELECT reshard_unix_ms(now()), $1, $2, "
    "COALESCE(NULLIF($3::text, ''), j.tenant, ''), $4, COALESCE(NULLIF($5::text, ''), o.job_id, "
    "''), $6, $7, $8, $9, $10 FROM (SELECT 1) one LEFT JOIN operations o ON $6::text <> '' AND "
    "o.id = $6::text LEFT JOIN jobs j ON j.id = COALESCE(NULLIF($5::text, ''), o.job_id) "
    "RETURNING id, at_unix_ms"};

// $1 tenants (text[]; empty: all), $2 job id ("" : all), $3 since unix ms,
// $4 before id (0: from the newest), $5 rows. Newest first.
inline constexpr Statement kListAudit{
    "list_audit",
    "SELECT id, at_unix_ms, identity, role, tenant, method, job_id, operation_id, target, "
    "idempotency_key, code, message FROM audit_log WHERE (cardinality($1::text[]) = 0 OR "
    "tenant = ANY($1::text[])) AND ($2::text = '' OR job_id = $2::text) AND at_unix_ms >= "
    "$3::bigint AND ($4::bigint = 0 OR id < $4::bigint) ORDER BY id DESC LIMIT $5::integer"};

// $1 min age ms, $2 batch rows. Oldest first.
inline constexpr Statement kPruneAudit{
    "prune_audit",
    "DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log WHERE at_unix_ms < "
    "reshard_unix_ms(now()) - $1::bigint ORDER BY at_unix_ms LIMIT $2::integer)"};

}  // namespace reshard::coordinator::pg
