// Stop-free reconfiguration's SQL (migrations/0009_stop_free.sql;
// pg_stop_free.cc). Listed in AllStatements (pg_statements.cc).
#pragma once

#include "services/coordinator/store/operation_machine.h"
#include "services/coordinator/store/pg_pool.h"

namespace reshard::coordinator::pg {

inline constexpr Statement kSetOperationStopFree{
    "set_operation_stop_free", "UPDATE operations SET stop_free = true WHERE id = $1"};

// $1 operation, $2 deadline (unix ms), $3 abort past it (migrations/0023).
inline constexpr Statement kSetOperationDeadline{
    "set_operation_deadline",
    "UPDATE operations SET deadline_unix_ms = $2, deadline_abort = $3 WHERE id = $1"};

// $1 operation, $2 job: what a cut-over checks, locked.
inline constexpr Statement kLockStopFreeOperation{
    "lock_stop_free_operation",
    "SELECT state, stop_free, prepared_at IS NOT NULL, COALESCE(cutover_operation_id, ''), "
    "workers_prepared_at IS NOT NULL, agents_prepared_at IS NOT NULL, prepared_from_generation, "
    "to_generation FROM operations WHERE id = $1 AND job_id = $2 FOR UPDATE"};

// $1 the stop-free operation, $2 the cut-over checkpoint's generation (its
// new source), $3 its to_generation, $4 the checkpoint (CutOverWrite,
// operation_create.h).
inline constexpr Statement kCutOverOperation{
    "cut_over_operation",
    "UPDATE operations SET from_generation = $2::bigint, to_generation = $3::bigint, "
    "cutover_at = now(), cutover_operation_id = $4, updated_at = now() WHERE id = $1"};

// The workers' half of prepared (kSettlePrepared sets prepared_at). A
// repeat keeps the first time.
inline constexpr Statement kMarkPrepared{
    "mark_prepared",
    "UPDATE operations SET workers_prepared_at = COALESCE(workers_prepared_at, now()), "
    "updated_at = now() WHERE id = $1 AND " RESHARD_SQL_OP_STOP_FREE_PLANNED("")
    " RETURNING job_id"};

// After a commit: a job whose stop-free operation is still active (the
// cut-over checkpoint committed, the transfer is to come) stays
// RECONFIGURING.
inline constexpr Statement kKeepReconfiguring{
    "keep_reconfiguring",
    "UPDATE jobs SET state = 2, updated_at = now() WHERE id = $1 AND state = 1 AND EXISTS "
    "(SELECT 1 FROM operations o WHERE o.job_id = $1 AND " RESHARD_SQL_OP_ACTIVE("o.") ")"};

}  // namespace reshard::coordinator::pg
