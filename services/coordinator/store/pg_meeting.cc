// PgStore: a checkpoint and an operation that meet (docs/coordinator.md,
// "Checkpoints and operations"; migrations/0013): what CreateOperation does
// for the meeting rule's verdicts, and the driver's release of a queued
// operation and end of a step-boundary wait.
#include "services/coordinator/store/pg_meeting.h"

#include "absl/strings/str_cat.h"
#include "services/coordinator/store/pg_codec.h"
#include "services/coordinator/store/pg_meeting_statements.h"
#include "services/coordinator/store/pg_statements.h"
#include "services/coordinator/store/pg_store.h"
#include "services/coordinator/store/pg_store_internal.h"

namespace reshard::coordinator {
namespace pg {
std::vector<ActiveOperation> ActiveOperations(const pqxx::result& rows) {
  std::vector<ActiveOperation> active;
  active.reserve(rows.size());
  for (const pqxx::row& row : rows) {
    ActiveOperation op;
    op.id = row[0].c_str();
    op.state = static_cast<v1::OperationState>(row[1].as<int>());
    op.kind = static_cast<v1::OperationKind>(row[2].as<int>());
    op.stop_free = row[3].as<bool>();
    op.step_boundary = static_cast<v1::StepBoundary>(row[4].as<int>());
    op.queued_behind = row[5].c_str();
    op.step_boundary_checkpoint_id = row[6].c_str();
    op.to_generation = row[7].as<int64_t>();
    active.push_back(std::move(op));
  }
  return active;
}

absl::StatusOr<v1::Operation> FoldedCheckpoint(PgTx& tx, const NewOperation& op,
                                               const std::string& into) {
  absl::StatusOr<OperationRecord> record = ReadOperation(tx, into, /*include_plan=*/false);
  if (!record.ok()) return record.status();
  WriteAudit(tx, op.job_id, into);
  record->op.set_checkpoint_folded(true);
  return record->op;
}

void AbortCheckpointForRecovery(PgTx& tx, const std::string& job_id, const CheckpointAbort& abort) {
  tx.Exec(kTransitionOperation, abort.operation_id, static_cast<int>(abort.from),
          static_cast<int>(v1::OPERATION_STATE_ABORTED), false, Bytea(absl::string_view()), false,
          Bytea(absl::string_view()), true, abort.error, false, int64_t{0}, false,
          Bytea(absl::string_view()));
  tx.Exec(kDiscardPendingGeneration, job_id, abort.to_generation);
}

absl::Status NameBoundaryCheckpoint(PgTx& tx, const BoundaryCheckpointWrite& w) {
  if (tx.Exec(kNameStepBoundaryCheckpoint, w.operation_id, w.checkpoint_id,
              static_cast<int>(w.step_boundary), w.to_generation, w.step_boundary_deadline_unix_ms)
          .empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cut_over_operation_id \"", w.operation_id,
                     "\": it no longer waits for a step boundary (its deadline passed)"));
  }
  return absl::OkStatus();
}

}  // namespace pg

absl::StatusOr<bool> PgStore::ReleaseQueuedOperation(const std::string& operation_id,
                                                     int64_t now_unix_ms) {
  return pg::TransactFor<bool>(
      *pool_, "ReleaseQueuedOperation", [&](pg::PgTx& tx) -> absl::StatusOr<bool> {
        const pqxx::result owner = tx.Exec(pg::kOperationJob, operation_id);
        if (owner.empty()) return pg::OperationNotFound(operation_id);
        const std::string job_id = owner[0][0].c_str();
        // The job's row first, as CreateOperation takes them.
        const pqxx::result job = tx.Exec(pg::kLockJob, job_id);
        if (job.empty()) return pg::JobNotFound(job_id);
        const pqxx::result r = tx.Exec(pg::kLockQueuedOperation, operation_id);
        if (r.empty()) {
          return absl::AbortedError(
              absl::StrCat("operation \"", operation_id, "\" is not a queued PENDING operation"));
        }
        const bool stop_free = r[0][0].as<bool>();
        auto boundary = static_cast<v1::StepBoundary>(r[0][1].as<int>());
        const std::string behind = r[0][2].c_str();
        const std::string boundary_checkpoint = r[0][3].c_str();
        const int64_t timeout_ms = r[0][4].as<int64_t>();
        // A checkpoint pruned since counts as ended, not committed.
        const pqxx::result checkpoint = tx.Exec(pg::kOperationState, behind);
        const auto state = checkpoint.empty()
                               ? v1::OPERATION_STATE_UNSPECIFIED
                               : static_cast<v1::OperationState>(checkpoint[0][0].as<int>());
        if (IsActiveState(state)) return false;
        // From the generation current now (the checkpoint's when it
        // committed) to the next number never handed out.
        const int64_t generation = job[0][0].as<int64_t>();
        const int64_t next = tx.Exec(pg::kMaxGeneration, job_id)[0][0].as<int64_t>() + 1;
        int64_t deadline = 0;
        if (boundary == v1::STEP_BOUNDARY_WAITING) {
          deadline = now_unix_ms + timeout_ms;  // it may wait for its boundary from now on
        } else if (boundary == v1::STEP_BOUNDARY_CHECKPOINTING && behind == boundary_checkpoint) {
          boundary = state == v1::OPERATION_STATE_COMMITTED ? v1::STEP_BOUNDARY_REACHED
                                                            : v1::STEP_BOUNDARY_CHECKPOINT_ENDED;
        }
        tx.Exec(pg::kReleaseQueuedOperation, operation_id, generation,
                stop_free ? next + 1 : next, static_cast<int>(boundary), deadline);
        return true;
      });
}

absl::StatusOr<bool> PgStore::EndStepBoundaryWait(const std::string& operation_id) {
  return pg::TransactFor<bool>(*pool_, "EndStepBoundaryWait",
                               [&](pg::PgTx& tx) -> absl::StatusOr<bool> {
                                 return !tx.Exec(pg::kStepBoundaryTimedOut, operation_id).empty();
                               });
}

}  // namespace reshard::coordinator
