// PgStore's rank failures (migrations/0014_rank_failures.sql;
// Store::RecordRankFailure): the SQL, and how a job read fills
// Job.failed_ranks. Internal to the store.
#pragma once

#include <string>

#include "reshard/v1/coordinator.pb.h"
#include "services/coordinator/store/pg_pool.h"

namespace reshard::coordinator::pg {

// $1 job, $2 generation, $3 rank, $4 reason, $5 reported_by: inserts or
// replaces the rank's report.
inline constexpr Statement kUpsertRankFailure{
    "upsert_rank_failure",
    "INSERT INTO rank_failures (job_id, generation, rank, reason, reported_by) "
    "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (job_id, generation, rank) DO UPDATE SET "
    "reason = EXCLUDED.reason, reported_by = EXCLUDED.reported_by, reported_at = now() "
    "RETURNING rank, reason, generation, reshard_unix_ms(reported_at), reported_by"};

// $1 job, $2 generation: its failed ranks, by rank.
inline constexpr Statement kSelectRankFailures{
    "select_rank_failures",
    "SELECT rank, reason, generation, reshard_unix_ms(reported_at), reported_by "
    "FROM rank_failures WHERE job_id = $1 AND generation = $2 ORDER BY rank"};

/// Appends generation `generation`'s failed ranks of job `job_id` to
/// `job->failed_ranks` (ReadJob).
void ReadRankFailures(PgTx& tx, const std::string& job_id, int64_t generation, v1::Job* job);

}  // namespace reshard::coordinator::pg
