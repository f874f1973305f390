// CreateOperation's domain rules, written once above the two Stores
// (docs/coordinator.md, "The in-memory store and the contract suite"): what a
// request for a new operation does, given what the store read of its job
// under the job's lock. Each Store reads a CreationSnapshot and persists the
// CreationPlan; the checks, the meeting verdict (operation_meeting.h), the
// cut-over reservation, the new row's fields and the rows it rewrites are
// decided here, so both refuse and write the same. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "reshard/v1/coordinator.pb.h"
#include "services/coordinator/store/operation_meeting.h"
#include "services/coordinator/store/operation_store.h"

namespace reshard::coordinator {

/// The operation a checkpoint's cut_over_operation_id names, as the cut-over
/// check reads it (docs/coordinator.md, "Stop-free reconfiguration").
struct CutOverTarget {
  v1::OperationState state = v1::OPERATION_STATE_UNSPECIFIED;
  bool stop_free = false;
  bool prepared = false;                 // prepared_at: workers and agents prepared
  std::string cutover_operation_id;      // empty: not cut over
  bool workers_prepared = false;         // MarkPrepared called
  bool agents_prepared = false;          // every host PREPARED
  int64_t prepared_from_generation = 0;  // 0: its agents have not started preparing
  int64_t to_generation = 0;
  /// Its hosts whose task is not PREPARED, by host id.
  std::vector<std::string> hosts_not_prepared;
};

/// What CreateOperation reads of the job, under the job's lock.
struct CreationSnapshot {
  /// The first call's operation when the request's idempotency key was used
  /// already; then nothing below is needed.
  std::optional<std::string> replayed;
  int64_t generation = 0;  // the job's current generation
  /// The job's active operations, in creation order.
  std::vector<ActiveOperation> active;
  /// The largest generation number the job has handed out (never reused).
  int64_t max_generation = 0;
  /// Read when the request has a cut_over_operation_id: that operation of
  /// the job, unset when it has none by that id.
  std::optional<CutOverTarget> cut_over;
  /// Read when the request has a step: the dataset state of `generation`,
  /// unset when the job has none.
  std::optional<v1::DatasetState> committed;
};

/// The derived fields of the new PENDING operation's row (the rest are the
/// request's own: ids, kind, target layout, lost hosts and ranks, key,
/// stop_free, step).
struct NewOperationRow {
  int64_t from_generation = 0;
  int64_t to_generation = 0;  // 0 while queued: fixed when released
  std::string queued_behind;  // the checkpoint it waits behind (empty: none)
  v1::StepBoundary step_boundary = v1::STEP_BOUNDARY_UNSPECIFIED;
  int64_t step_boundary_timeout_ms = 0;
  int64_t step_boundary_deadline_unix_ms = 0;  // 0 while queued: counts from the release
};

/// A recovery replaces the in-flight checkpoint: ABORTED (from `from`) with
/// `error`, its pending generation `to_generation` DISCARDED.
struct CheckpointAbort {
  std::string operation_id;
  v1::OperationState from = v1::OPERATION_STATE_UNSPECIFIED;
  int64_t to_generation = 0;
  std::string error;  // as stored (TruncateError)
};

/// The stop-free operation a checkpoint cuts over: the checkpoint's
/// generation becomes its source; cutover time set to now.
struct CutOverWrite {
  std::string operation_id;
  int64_t from_generation = 0;
  int64_t to_generation = 0;
  std::string checkpoint_id;  // its cutover_operation_id
};

/// The operation a step-boundary checkpoint is taken for: CHECKPOINTING,
/// queued behind the checkpoint, its numbers fixed again when released;
/// cutover time set to now. Applies only while it still waits (WAITING and
/// PENDING): a Store where the wait can end meanwhile refuses otherwise.
struct BoundaryCheckpointWrite {
  std::string operation_id;
  std::string checkpoint_id;  // step_boundary_checkpoint_id, queued_behind, cutover_operation_id
  v1::StepBoundary step_boundary = v1::STEP_BOUNDARY_CHECKPOINTING;
  int64_t to_generation = 0;
  int64_t step_boundary_deadline_unix_ms = 0;
};

struct CreationPlan {
  enum class Action {
    kReplay,  // the key's first call: answer `existing` (audit names it)
    kFold,    // a checkpoint folded: answer `existing` with checkpoint_folded
    kCreate,  // write what follows, in this order
  };
  Action action = Action::kCreate;
  std::string existing;  // kReplay, kFold
  std::optional<CheckpointAbort> abort_checkpoint;
  NewOperationRow row;
  std::optional<CutOverWrite> cut_over;
  std::optional<BoundaryCheckpointWrite> boundary_checkpoint;
  v1::JobState job_state = v1::JOB_STATE_RECONFIGURING;
};

/// The rules, in the order a refusal is chosen: a replay answers first;
/// InvalidArgument for expected_generation <= 0; Aborted when it is not the
/// job's; the meeting rule's refusals (Meet); a cut-over's (CheckCutOver);
/// a checkpoint step's (CheckCheckpointStep). `op` passed CheckNewOperation.
[[nodiscard]] absl::StatusOr<CreationPlan> PlanCreation(const NewOperation& op,
                                                        const CreationSnapshot& snapshot);

/// A checkpoint naming a stop-free operation: FailedPrecondition unless that
/// one is the job's only active operation, stop-free, PLANNED, prepared
/// (workers and agents; the message names what is missing) and not cut over
/// yet. Returns the generation the checkpoint takes: the one the operation
/// reserved below its to_generation, or 0 when it reserved none (created
/// before migration 0011: the next number).
[[nodiscard]] absl::StatusOr<int64_t> CheckCutOver(const NewOperation& op,
                                                   const CreationSnapshot& snapshot);

/// The text a checkpoint aborted for recovery `recovery` keeps as its error.
std::string AbortedForRecoveryError(const NewOperation& recovery);

}  // namespace reshard::coordinator
