// SQL of a checkpoint and an operation that meet (migrations/0013;
// pg_meeting.cc, pg_operations.cc; docs/coordinator.md, "Checkpoints and
// operations"). Listed in AllStatements (pg_statements.cc).
#pragma once

#include "services/coordinator/store/operation_machine.h"
#include "services/coordinator/store/pg_pool.h"

namespace reshard::coordinator::pg {

// $1 the operation waiting for its step boundary, $2 the checkpoint naming
// it, $3 its step boundary (CHECKPOINTING), $4 its to_generation, $5 its
// deadline (BoundaryCheckpointWrite, operation_create.h): queued behind that
// checkpoint, which is its cut-over (cutover_operation_id, cutover_at: its
// pause_seconds run from it), if it still waits (the meeting rule checked
// that it is not queued behind an active checkpoint, under the job's row
// lock; its deadline may have ended the wait since).
inline constexpr Statement kNameStepBoundaryCheckpoint{
    "name_step_boundary_checkpoint",
    "UPDATE operations SET step_boundary = $3::smallint, step_boundary_checkpoint_id = $2, "
    "queued_behind_operation_id = $2, to_generation = $4::bigint, "
    "step_boundary_deadline_unix_ms = $5::bigint, cutover_operation_id = $2, cutover_at = now(), "
    "updated_at = now() "
    "WHERE id = $1 AND " RESHARD_SQL_OP_IS_PENDING("") " AND step_boundary = 1 RETURNING id"};

inline constexpr Statement kOperationJob{"operation_job",
                                         "SELECT job_id FROM operations WHERE id = $1"};

// A queued PENDING operation, locked (after its job's row).
inline constexpr Statement kLockQueuedOperation{
    "lock_queued_operation",
    "SELECT stop_free, step_boundary, queued_behind_operation_id, "
    "COALESCE(step_boundary_checkpoint_id, ''), step_boundary_timeout_ms FROM operations "
    "WHERE id = $1 AND " RESHARD_SQL_OP_QUEUED("") " FOR UPDATE"};

// $1 operation, $2 from_generation, $3 to_generation, $4 step_boundary, $5
// its deadline.
inline constexpr Statement kReleaseQueuedOperation{
    "release_queued_operation",
    "UPDATE operations SET queued_behind_operation_id = NULL, from_generation = $2, "
    "to_generation = $3, step_boundary = $4, step_boundary_deadline_unix_ms = $5, "
    "updated_at = now() WHERE id = $1"};

// WAITING (1) -> TIMED_OUT (4), unless a checkpoint named it first.
inline constexpr Statement kStepBoundaryTimedOut{
    "step_boundary_timed_out",
    "UPDATE operations SET step_boundary = 4, updated_at = now() WHERE id = $1 AND "
    RESHARD_SQL_OP_AT_STEP_BOUNDARY("") " RETURNING id"};

}  // namespace reshard::coordinator::pg
