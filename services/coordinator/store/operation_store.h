// The operations aggregate of the Store (store.h): an operation, its moves
// through the state machine (operation_machine.h), its hosts' tasks (prepare
// and transfer progress) and the idempotency keys that name it. PgStore
// (pg_operations.cc, pg_meeting.cc, pg_stop_free.cc, pg_prepare.cc,
// pg_transfer.cc, pg_idempotency.cc) and MemoryStore (memory_operations.cc,
// memory_prepare.cc) implement it; the rules both apply are written once
// above them (operation_create.h, operation_machine.h, store_checks.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "reshard/v1/agent.pb.h"
#include "reshard/v1/coordinator.pb.h"
#include "reshard/v1/plan.pb.h"
#include "reshard/v1/ptc.pb.h"
#include "services/coordinator/store/dataset_commit.h"
#include "services/coordinator/store/idempotency.h"

namespace reshard::coordinator {

struct NewOperation {
  std::string operation_id;  // chosen by the caller
  std::string job_id;
  v1::OperationKind kind = v1::OPERATION_KIND_UNSPECIFIED;
  int64_t expected_generation = 0;  // Aborted when the job's differs
  v1::Layout target_layout;
  std::vector<std::string> lost_hosts;
  std::vector<int> lost_ranks;
  Idempotency idempotency;
  /// A checkpoint's step boundary (CheckpointRequest.with_step): checked
  /// against the current dataset state (CheckStepCommit) in the creating
  /// transaction, applied to the new generation's in the committing one.
  std::optional<StepCommit> step;
  /// Resize / migrate: two-phase (ResizeRequest.stop_free).
  bool stop_free = false;
  /// A checkpoint that cuts over this stop-free operation
  /// (CheckpointRequest.cut_over_operation_id; checked in the creating
  /// transaction, see CheckCutOver in operation_create.h).
  std::string cut_over_operation_id;
  /// Resize / migrate: stop-the-world at the job's next step boundary
  /// (ResizeRequest.at_step_boundary; docs/coordinator.md, "Checkpoints and
  /// operations"): waits until the deadline (coordinator clock) for a
  /// checkpoint naming it. The deadline counts from the release instead
  /// when the operation is queued.
  bool at_step_boundary = false;
  int64_t step_boundary_timeout_ms = 0;
  int64_t step_boundary_deadline_unix_ms = 0;
  /// Resize / migrate / recover: the request's deadline (unix_ms 0: none;
  /// docs/scheduler.md, "Deadlines"), checked before the operation is
  /// created (logic/deadlines.h); the driver acts on it past its time.
  v1::Deadline deadline;
};

/// An operation with what only the coordinator needs.
struct OperationRecord {
  v1::Operation op;  // includes stats, bytes done/total, error
  std::vector<std::string> lost_hosts;
  std::vector<int> lost_ranks;
  std::optional<v1::TransferPlan> plan;  // only when asked for and planned
  /// With the plan: the steps a prepared stop-free operation's transfer
  /// skips (plan step indexes, ascending; StartPreparedTransfer).
  std::vector<int64_t> skipped_steps;
};

/// What the transfer of a prepared stop-free operation leaves out
/// (logic/prepared_steps.h computes it).
struct SkippedSteps {
  std::vector<int64_t> step_indexes;  // ascending
  int64_t bytes = 0;                  // of the plan's bytes_total
};

/// Fields written together with a state transition; unset ones are kept.
struct OperationUpdate {
  // Borrowed: must outlive the call (the driver builds it on an arena, which
  // halves the cost of building a large plan; planner::ToProto).
  const v1::TransferPlan* plan = nullptr;
  std::optional<v1::PlanStats> stats;
  /// The cost model's prediction (docs/scheduler.md). A transition that
  /// stores a plan also stamps Operation.planned_unix_ms.
  std::optional<v1::CostPrediction> prediction;
  std::optional<std::string> error;
  std::optional<int64_t> bytes_total;
  /// A key claimed for the operation in the transition's transaction (a
  /// CancelOperation's); empty key: none. Aborted when its scope already
  /// holds the key (nothing moves).
  Idempotency idempotency;
};

/// One host's part of an operation.
struct HostProgress {
  std::string host_id;
  v1::HostTaskState state = v1::HOST_TASK_STATE_ASSIGNED;
  int64_t bytes_done = 0;
  int64_t bytes_total = 0;
  std::string error;
  /// When the task last made progress (its state or bytes_done changed),
  /// coordinator clock. Written by StartTransfer and RecordHostProgress.
  int64_t progress_unix_ms = 0;
  std::string waiting_on;  // what the agent last said the task waits on
  /// How the agent moves the task's bytes and why a fallback was taken
  /// (ReportProgressRequest.route / route_reason). RecordHostProgress with
  /// an empty route keeps the stored pair.
  std::string route;
  std::string route_reason;
};

class OperationStore {
 public:
  virtual ~OperationStore() = default;

  /// Creates a PENDING operation and marks the job RECONFIGURING, atomically
  /// checking: the job exists (NotFound), its generation equals
  /// expected_generation (Aborted), no other operation is active
  /// (FailedPrecondition naming it). With a key seen before for the same
  /// request, returns that operation (whatever its state now).
  [[nodiscard]] virtual absl::StatusOr<v1::Operation> CreateOperation(const NewOperation& op) = 0;
  // A checkpoint and an operation that meet (docs/coordinator.md,
  // "Checkpoints and operations"): CreateOperation queues a reconfiguration
  // behind an in-flight checkpoint, folds a checkpoint into a stop-free or
  // step-boundary operation (the answer is that operation with
  // checkpoint_folded), aborts a checkpoint for a recovery, and takes a
  // checkpoint naming an operation that waits for its step boundary.
  /// A queued operation whose checkpoint ended: from_generation becomes the
  /// job's generation, to_generation the next free number, a step-boundary
  /// wait starts (deadline now_unix_ms + its timeout) or ends (REACHED /
  /// CHECKPOINT_ENDED). False while the checkpoint is active; Aborted when
  /// the operation is not queued (any more).
  [[nodiscard]] virtual absl::StatusOr<bool> ReleaseQueuedOperation(const std::string& operation_id,
                                                                    int64_t now_unix_ms) = 0;
  /// A step-boundary wait whose deadline passed: WAITING -> TIMED_OUT. False
  /// when it no longer waits (a checkpoint named it first).
  [[nodiscard]] virtual absl::StatusOr<bool> EndStepBoundaryWait(
      const std::string& operation_id) = 0;
  /// A stop-free operation's new workers are warm (MarkPrepared): sets
  /// workers_prepared_at, and prepared_at when the agents are prepared too.
  /// FailedPrecondition unless it is stop-free and PLANNED; a repeat keeps
  /// the first time. NotFound when it does not exist.
  [[nodiscard]] virtual absl::StatusOr<v1::Operation> MarkPrepared(
      const std::string& operation_id) = 0;
  [[nodiscard]] virtual absl::StatusOr<OperationRecord> GetOperation(
      const std::string& operation_id, bool include_plan) = 0;
  /// As JobVersions, of operations (Operation.version).
  [[nodiscard]] virtual absl::StatusOr<std::map<std::string, int64_t>> OperationVersions(
      const std::vector<std::string>& operation_ids) {
    std::map<std::string, int64_t> versions;
    for (const std::string& id : operation_ids) {
      absl::StatusOr<OperationRecord> record = GetOperation(id, /*include_plan=*/false);
      if (absl::IsNotFound(record.status())) continue;
      if (!record.ok()) return record.status();
      versions.emplace(id, record->op.version());
    }
    return versions;
  }

  // ---- Agents prepare a stop-free operation (docs/coordinator.md) ----------
  /// Starts the prepare phase of a PLANNED stop-free operation: records
  /// `from_generation` as prepared_from_generation, inserts the pending
  /// generation to_generation (target layout) and one row per host
  /// (`hosts`, ASSIGNED), in one transaction. With no hosts the agents are
  /// prepared at once. Aborted unless PLANNED, stop-free, not cut over and
  /// not started yet.
  [[nodiscard]] virtual absl::Status StartPrepare(const std::string& operation_id,
                                                  int64_t from_generation,
                                                  const std::vector<HostProgress>& hosts) = 0;
  /// A host's prepare finished: its row becomes PREPARED (bytes_done =
  /// bytes_total, added to bytes_precopied) and `sources` (the checksums of
  /// the old shards it read) are stored; when it was the last host,
  /// agents_prepared_at is set, and prepared_at too when the workers are
  /// prepared. A repeat changes nothing. FailedPrecondition when the
  /// operation is not in its prepare phase (PLANNED with rows); NotFound
  /// when the host has no row.
  [[nodiscard]] virtual absl::Status RecordHostPrepared(
      const std::string& operation_id, const std::string& host_id, int64_t now_unix_ms,
      const std::vector<v1::ShardChecksum>& sources) = 0;
  /// The stored prepared source checksums, by (item, rank).
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::ShardChecksum>> GetPreparedSources(
      const std::string& operation_id) = 0;
  /// PLANNED -> TRANSFERRING for a prepared stop-free operation after its
  /// cut-over: the pending generation exists already; each host's row goes
  /// back to ASSIGNED with `hosts`' bytes, the skipped steps and bytes are
  /// stored and bytes_total becomes the plan's less the skipped. Aborted
  /// unless PLANNED.
  [[nodiscard]] virtual absl::Status StartPreparedTransfer(const std::string& operation_id,
                                                           const std::vector<HostProgress>& hosts,
                                                           const SkippedSteps& skipped) = 0;
  /// Ids of operations in PENDING, PLANNED or TRANSFERRING, oldest first.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> ListActiveOperations() = 0;
  /// Moves the operation from `from` to `to` with `update`, only if it is
  /// still in `from` (else Aborted). FailedPrecondition, before the row is
  /// read, for a move the state machine (operation_machine.h) does not make
  /// between stored states; InvalidArgument for TRANSFERRING / COMMITTED,
  /// which StartTransfer / CommitOperation make. Moving to ABORTED or FAILED also
  /// returns the job to ACTIVE (or DEGRADED when it has lost hosts) and marks
  /// a pending generation DISCARDED.
  [[nodiscard]] virtual absl::Status TransitionOperation(const std::string& operation_id,
                                                         v1::OperationState from,
                                                         v1::OperationState to,
                                                         const OperationUpdate& update) = 0;
  /// The resource a key names in its scope (`idem.tenants`): its id when the
  /// key was used for the same method and request, nullopt when the scope
  /// has not used it, InvalidArgument naming the key and the method it was
  /// used with otherwise. For calls whose key is claimed by another method
  /// (CancelOperation: TransitionOperation's `update.idempotency`).
  [[nodiscard]] virtual absl::StatusOr<std::optional<std::string>> LookupIdempotencyKey(
      const Idempotency& idem) = 0;
  /// PLANNED -> TRANSFERRING: records the pending generation (target layout)
  /// and one progress row per host taking part, in one transaction.
  [[nodiscard]] virtual absl::Status StartTransfer(const std::string& operation_id,
                                                   const std::vector<HostProgress>& hosts) = 0;
  /// Records a host's progress (bytes, state, error, checksums of the shards
  /// it wrote). FailedPrecondition when the operation is no longer
  /// TRANSFERRING.
  [[nodiscard]] virtual absl::Status RecordHostProgress(
      const std::string& operation_id, const HostProgress& progress,
      const std::vector<v1::ShardChecksum>& checksums) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::vector<HostProgress>> GetHostProgress(
      const std::string& operation_id) = 0;
  /// TRANSFERRING -> COMMITTED in one transaction: the pending generation
  /// becomes current (with the checksums the hosts reported), the old one
  /// RETIRED, the job's generation advances and it returns to ACTIVE.
  /// Aborted when the operation is no longer TRANSFERRING.
  [[nodiscard]] virtual absl::Status CommitOperation(const std::string& operation_id) = 0;
  /// Operations assigned to `host_id`: TRANSFERRING ones whose progress row
  /// on that host is not DONE or FAILED, and PLANNED (stop-free, preparing)
  /// ones whose row is ASSIGNED or RUNNING.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> AssignedOperations(
      const std::string& host_id) = 0;
  /// AssignedOperations of each of `host_ids` at once (a host with none may
  /// be absent). The default calls AssignedOperations per host
  /// (heartbeat_hosts.cc); PostgreSQL runs one query.
  [[nodiscard]] virtual absl::StatusOr<std::map<std::string, std::vector<std::string>>>
  AssignedOperationsOfHosts(const std::vector<std::string>& host_ids);
  /// Every operation of a job, newest first (for tests and tooling).
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::Operation>> ListOperationsForJob(
      const std::string& job_id) = 0;
};

}  // namespace reshard::coordinator
