// The dataset state's SQL (migrations/0007_dataset_state.sql;
// pg_dataset_state.cc). Listed in AllStatements (pg_statements.cc) like
// every other statement.
#pragma once

#include "services/coordinator/store/operation_machine.h"
#include "services/coordinator/store/pg_pool.h"

namespace reshard::coordinator::pg {

#define RESHARD_PG_DATASET_COLUMNS                                                          \
  "dataset_id, num_samples, dataset_fingerprint, seed, shuffle, block_size, global_batch, " \
  "sample_cursor, step, layout_fingerprint, committed_generation, "                         \
  "reshard_unix_ms(committed_at) "

// $1 job, $2 generation, $3 .. $12 the columns in RESHARD_PG_DATASET_COLUMNS
// order up to layout_fingerprint; committed_generation = $2.
inline constexpr Statement kInsertDatasetState{
    "insert_dataset_state",
    "INSERT INTO dataset_states (job_id, generation, dataset_id, num_samples, "
    "dataset_fingerprint, seed, shuffle, block_size, global_batch, sample_cursor, step, "
    "layout_fingerprint, committed_generation) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, "
    "$11, $12, $2)"};

// $1 job, $2 generation; FOR UPDATE: CommitStep reads and writes under it.
inline constexpr Statement kSelectDatasetState{
    "select_dataset_state", "SELECT " RESHARD_PG_DATASET_COLUMNS
                            "FROM dataset_states WHERE job_id = $1 AND generation = $2"};
inline constexpr Statement kLockDatasetState{
    "lock_dataset_state", "SELECT " RESHARD_PG_DATASET_COLUMNS
                          "FROM dataset_states WHERE job_id = $1 AND generation = $2 FOR UPDATE"};

// $1 job, $2 generation, $3 cursor, $4 step.
inline constexpr Statement kCommitDatasetStep{
    "commit_dataset_step",
    "UPDATE dataset_states SET sample_cursor = $3, step = $4, committed_generation = $2, "
    "committed_at = now() WHERE job_id = $1 AND generation = $2 "
    "RETURNING " RESHARD_PG_DATASET_COLUMNS};

// Copies generation $2's row to generation $3 of job $1 (an operation's
// commit); nothing when the job has no dataset state.
inline constexpr Statement kCarryDatasetState{
    "carry_dataset_state",
    "INSERT INTO dataset_states (job_id, generation, dataset_id, num_samples, "
    "dataset_fingerprint, seed, shuffle, block_size, global_batch, sample_cursor, step, "
    "layout_fingerprint, committed_generation, committed_at) SELECT job_id, $3, dataset_id, "
    "num_samples, dataset_fingerprint, seed, shuffle, block_size, global_batch, sample_cursor, "
    "step, layout_fingerprint, committed_generation, committed_at FROM dataset_states WHERE "
    "job_id = $1 AND generation = $2 ON CONFLICT (job_id, generation) DO NOTHING"};

// $1 operation, $2 step, $3 cursor: a checkpoint's step boundary.
inline constexpr Statement kSetOperationStep{
    "set_operation_step", "UPDATE operations SET step = $2, step_cursor = $3 WHERE id = $1"};

// At the commit of operation $1 (after kCarryDatasetState): its step
// boundary, if it has one, becomes the new generation's dataset state,
// whatever was carried: the generation holds the model state of that step,
// so its cursor is that step's (docs/data.md, "One cursor per model state").
inline constexpr Statement kApplyOperationStep{
    "apply_operation_step",
    "UPDATE dataset_states d SET sample_cursor = o.step_cursor, step = o.step, "
    "committed_generation = o.to_generation, committed_at = now() FROM operations o "
    "WHERE o.id = $1 AND o.step IS NOT NULL AND d.job_id = o.job_id "
    "AND d.generation = o.to_generation"};

// $1 job: its checkpoint (OPERATION_KIND_CHECKPOINT = 4) that has not ended
// (PENDING, PLANNED, TRANSFERRING), with its step boundary (NULLs for a
// plain checkpoint). CommitStep refuses to move the cursor meanwhile.
inline constexpr Statement kPendingCheckpointOfJob{
    "pending_checkpoint_of_job",
    "SELECT id, state, to_generation, step, step_cursor FROM operations "
    "WHERE job_id = $1 AND kind = 4 AND " RESHARD_SQL_OP_ACTIVE("") " ORDER BY seq LIMIT 1"};

}  // namespace reshard::coordinator::pg
