// PgStore's side of a checkpoint and an operation that meet (pg_meeting.cc;
// docs/coordinator.md, "Checkpoints and operations"): the parts of
// CreateOperation's transaction that the meeting rule (operation_meeting.h)
// decides.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/coordinator/store/operation_create.h"
#include "services/coordinator/store/operation_meeting.h"
#include "services/coordinator/store/pg_pool.h"
#include "services/coordinator/store/store.h"

namespace reshard::coordinator::pg {

/// Rows of kActiveOperationOfJob as the rule reads them.
std::vector<ActiveOperation> ActiveOperations(const pqxx::result& rows);

/// The answer to a checkpoint folded into `into`: that operation with
/// checkpoint_folded set. Writes the call's audit row; nothing else.
absl::StatusOr<v1::Operation> FoldedCheckpoint(PgTx& tx, const NewOperation& op,
                                               const std::string& into);

/// A recovery replaces the in-flight checkpoint: ABORTED with the plan's
/// reason, its pending generation DISCARDED.
void AbortCheckpointForRecovery(PgTx& tx, const std::string& job_id, const CheckpointAbort& abort);

/// After a boundary checkpoint's row is inserted: names the checkpoint in
/// the operation it is for, which is queued behind it. FailedPrecondition
/// when that operation stopped waiting meanwhile (its deadline passed:
/// EndStepBoundaryWait does not take the job's row lock).
absl::Status NameBoundaryCheckpoint(PgTx& tx, const BoundaryCheckpointWrite& w);

}  // namespace reshard::coordinator::pg
