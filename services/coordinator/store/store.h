// The coordinator's storage interface: every piece of cluster state lives
// behind it. PostgreSQL (pg_store.h) is the product.
//
// Thread contract: implementations are thread-safe; every method is one short
// transaction (or none) and may be called from any thread.
//
// Errors (translated once, inside the implementation):
//   NotFound            the job / operation / host does not exist
//   AlreadyExists       unique violation (e.g. a second job with the same
//                       tenant and name)
//   FailedPrecondition  wrong state (an active operation exists, epoch stale)
//   Aborted             lost a race: serialization failure, or a compare-and-set
//                       (expected generation / expected state) that no longer holds
//   Unavailable         the database cannot be reached
//   InvalidArgument     an idempotency key reused for a different request
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "reshard/v1/agent.pb.h"
#include "reshard/v1/coordinator.pb.h"
#include "reshard/v1/plan.pb.h"
#include "reshard/v1/ptc.pb.h"
#include "services/coordinator/store/audit.h"
#include "services/coordinator/store/dataset_commit.h"

namespace reshard::coordinator {

/// Idempotency of a mutating call: the same `key` for the same `method` and
/// `request_hash` returns the first call's resource; a different request
/// with a used key is InvalidArgument. An empty key disables it.
/// Keys are scoped: a key is looked up and claimed only among the keys of
/// the same `tenants`, so a key another scope used is simply free.
struct Idempotency {
  /// The caller's tenants, sorted and unique (MakeIdempotency); empty for a
  /// caller scoped to no tenant (an admin), which has a scope of its own.
  std::vector<std::string> tenants;
  std::string key;
  std::string method;        // e.g. "Resize"
  std::string request_hash;  // hash of the request without the key
};

struct ListJobsQuery {
  std::string tenant;                              // empty: all
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;  // unspecified: all
  int page_size = 100;
  std::string after_job_id;  // page token: list job ids greater than this
};

struct JobPage {
  std::vector<v1::Job> jobs;
  std::string next_after_job_id;  // empty on the last page
};

/// A bearer token as stored (migrations/0004): never its secret, only the
/// secret's SHA-256 (kept by the store, not returned).
struct TokenRecord {
  std::string id;    // public part, "tok-" + 16 hex
  std::string name;  // what the admin called it
  std::string role;  // "admin", "scheduler" or "viewer"
  std::vector<std::string> tenants;
  std::string created_by;
  int64_t created_unix_ms = 0;
  int64_t expires_unix_ms = 0;
  std::optional<int64_t> revoked_unix_ms;
};

enum class GenerationState : int16_t {
  kCurrent = 1,    // the job's committed generation
  kPending = 2,    // being built by an operation
  kRetired = 3,    // superseded; agents may free its buffers
  kDiscarded = 4,  // its operation aborted; agents drop its buffers
};

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

// ---- Retention (issue 9, defect 10) ------------------------------------------
/// Which finished rows the leader prunes (docs/coordinator.md, "Retention").
/// Ages are measured with the database's clock.
struct RetentionPolicy {
  /// Per job, the newest RETIRED generations kept whatever their age.
  int keep_retired_generations = 2;
  /// Older RETIRED generations are pruned once retired (= a newer generation
  /// committed) this long ago; must cover several leases so that every live
  /// agent has seen them in Heartbeat's `release` list.
  int64_t retired_min_age_ms = 60 * 60 * 1000;
  /// DISCARDED generations are pruned once their operation ended this long ago.
  int64_t discarded_min_age_ms = 10 * 60 * 1000;
  /// Per job, the newest operations kept whatever their state and age.
  int keep_operations = 100;
  /// Older COMMITTED / ABORTED / FAILED operations are pruned once finished
  /// this long ago (their idempotency keys go with them).
  int64_t operation_min_age_ms = 7LL * 24 * 60 * 60 * 1000;
  /// Audit rows (migrations/0005) are pruned once this old.
  int64_t audit_min_age_ms = 90LL * 24 * 60 * 60 * 1000;
  /// Rows deleted by one statement.
  int batch_rows = 500;
};

/// Rows one PruneRetention call deleted, by table.
struct PrunedRows {
  int64_t generations = 0;  // RETIRED and DISCARDED (their rank rows cascade)
  int64_t operations = 0;   // (their progress rows and idempotency keys go too)
  int64_t audit = 0;        // audit_log rows
};

/// Which audit rows ListAudit returns: newest first.
struct AuditQuery {
  std::vector<std::string> tenants;  // empty: every tenant
  std::string job_id;                // empty: every job
  int64_t since_unix_ms = 0;         // rows at or after this time
  int64_t before_id = 0;             // page token: rows with a smaller id; 0: newest
  int page_size = 100;
};

struct AuditPage {
  std::vector<AuditRecord> records;
  int64_t next_before_id = 0;  // 0 on the last page
};

/// One host's heartbeat in a batch (Store::HeartbeatHosts).
struct HostHeartbeat {
  std::string host_id;
  int64_t epoch = 0;
  int64_t now_unix_ms = 0;
  int64_t lease_expires_unix_ms = 0;
  std::vector<std::string> held_jobs;  // job ids the agent holds buffers of
};

/// What a heartbeat tells its host (Store::HeartbeatHosts): `status` is
/// Heartbeat's for that host; the lists are filled only when it is OK.
struct HostHeartbeatResult {
  absl::Status status;
  std::vector<std::string> assigned_operations;  // AssignedOperations
  std::vector<v1::GenerationRef> release;        // GenerationsToRelease
  std::vector<v1::GenerationRef> discard;        // GenerationsToDiscard
  std::vector<std::string> deleted_jobs;         // DeletedJobs(held_jobs)
};

/// A rank reported dead (Store::RecordRankFailure).
struct RankFailureReport {
  std::string job_id;
  int64_t generation = 0;
  int rank = 0;
  std::string reason;
  std::string reported_by;  // the caller's identity
};

class Store {
 public:
  virtual ~Store() = default;

  // ---- Jobs ----------------------------------------------------------------
  /// Creates job `job_id` with generation 1 = spec.layout (state ACTIVE) and
  /// its PTC. With a key seen before for the same request: returns that job.
  /// AlreadyExists when (tenant, name) is taken.
  /// With `dataset_state` (may be null): generation 1's dataset state, in
  /// the same transaction (docs/data.md).
  [[nodiscard]] virtual absl::StatusOr<v1::Job> CreateJob(
      const std::string& job_id, const v1::JobSpec& spec, const Idempotency& idem,
      const v1::DatasetState* dataset_state = nullptr) = 0;
  /// The job with its current layout, lost hosts (hosts of the current
  /// generation whose state is LOST) and active operation; the PTC only when
  /// `include_ptc`.
  [[nodiscard]] virtual absl::StatusOr<v1::Job> GetJob(const std::string& job_id,
                                                       bool include_ptc) = 0;
  [[nodiscard]] virtual absl::StatusOr<v1::Ptc> GetPtc(const std::string& job_id) = 0;
  /// The change feed's safety poll (logic/change_feed.h): the version
  /// (Job.version) of each of `job_ids` that exists; a missing job is
  /// absent from the map. Every change to what GetJob shows takes a larger
  /// version. The default reads each job; a store answers in one query.
  [[nodiscard]] virtual absl::StatusOr<std::map<std::string, int64_t>> JobVersions(
      const std::vector<std::string>& job_ids) {
    std::map<std::string, int64_t> versions;
    for (const std::string& id : job_ids) {
      absl::StatusOr<v1::Job> job = GetJob(id, /*include_ptc=*/false);
      if (absl::IsNotFound(job.status())) continue;
      if (!job.ok()) return job.status();
      versions.emplace(id, job->version());
    }
    return versions;
  }
  [[nodiscard]] virtual absl::StatusOr<JobPage> ListJobs(const ListJobsQuery& query) = 0;
  /// Deletes the job and everything under it. FailedPrecondition while an
  /// operation is active. With a key: the key is recorded in the same
  /// transaction (without a job, so it outlives the job); a retry with the
  /// same key and request returns OK again; a key used for another request
  /// (or method) is InvalidArgument, before the job is looked at.
  [[nodiscard]] virtual absl::Status DeleteJob(const std::string& job_id,
                                               const Idempotency& idem = {}) = 0;
  /// Sets a job's state (e.g. DEGRADED when its hosts are lost).
  [[nodiscard]] virtual absl::Status SetJobState(const std::string& job_id, v1::JobState state) = 0;
  /// Commits a step boundary's cursor with the job's current generation
  /// (CheckStepCommit's rules, dataset_commit.h, under the job's row lock)
  /// and returns the dataset state. NotFound for a missing job;
  /// FailedPrecondition when the job has no dataset state or a rule refuses.
  [[nodiscard]] virtual absl::StatusOr<v1::DatasetState> CommitStep(const StepCommit& commit) = 0;
  /// Records that rank `report.rank` of the job's generation
  /// `report.generation` died (a repeated report of the rank replaces its
  /// reason and time), with the caller's audit row, and returns the record;
  /// GetJob lists the current generation's in Job.failed_ranks. NotFound
  /// for a missing job; Aborted when the job's current generation is not
  /// `report.generation` (re-read it and retry).
  [[nodiscard]] virtual absl::StatusOr<v1::RankFailure> RecordRankFailure(
      const RankFailureReport& report) = 0;
  /// Counts of jobs by state, for metrics.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::pair<v1::JobState, int64_t>>>
  CountJobsByState() = 0;

  // ---- Operations ----------------------------------------------------------
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
  [[nodiscard]] virtual absl::StatusOr<bool> ReleaseQueuedOperation(
      const std::string& operation_id, int64_t now_unix_ms) = 0;
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
  /// Generations an agent on `host_id` may free (RETIRED) or must drop
  /// (DISCARDED), among jobs whose generations placed ranks on that host.
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::GenerationRef>> GenerationsToRelease(
      const std::string& host_id) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::GenerationRef>> GenerationsToDiscard(
      const std::string& host_id) = 0;
  /// Every operation of a job, newest first (for tests and tooling).
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::Operation>> ListOperationsForJob(
      const std::string& job_id) = 0;

  // ---- Hosts ---------------------------------------------------------------
  /// Inserts or replaces a host (state ALIVE, lease until
  /// `lease_expires_unix_ms`); returns its new epoch (1, 2, ...).
  [[nodiscard]] virtual absl::StatusOr<int64_t> RegisterHost(const v1::Host& host,
                                                             int64_t now_unix_ms,
                                                             int64_t lease_expires_unix_ms) = 0;
  /// Extends the lease. NotFound for an unknown host; FailedPrecondition when
  /// `epoch` is not the latest (an older agent process) or the host was
  /// marked LOST (the agent must register again).
  [[nodiscard]] virtual absl::Status Heartbeat(const std::string& host_id, int64_t epoch,
                                               int64_t now_unix_ms,
                                               int64_t lease_expires_unix_ms) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::Host>> ListHosts() = 0;
  /// Every registered host's state, by id: what the operation driver reads
  /// each tick (not the hosts' addresses). The default reads ListHosts; a
  /// store reads two columns.
  [[nodiscard]] virtual absl::StatusOr<std::map<std::string, v1::HostState>> HostStates() {
    absl::StatusOr<std::vector<v1::Host>> all = ListHosts();
    if (!all.ok()) return all.status();
    std::map<std::string, v1::HostState> states;
    for (const v1::Host& h : *all) states.emplace(h.host_id(), h.state());
    return states;
  }
  /// The registered hosts among `host_ids`, ordered by id (an unknown id is
  /// absent): what a task names as its peers, without reading every host.
  /// The default filters ListHosts; a store answers from its index.
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::Host>> GetHosts(
      const std::vector<std::string>& host_ids) {
    absl::StatusOr<std::vector<v1::Host>> all = ListHosts();
    if (!all.ok()) return all.status();
    const std::set<std::string> wanted(host_ids.begin(), host_ids.end());
    std::vector<v1::Host> hosts;
    for (v1::Host& h : *all) {
      if (wanted.count(h.host_id()) > 0) hosts.push_back(std::move(h));
    }
    return hosts;
  }
  /// Heartbeat, then AssignedOperations, GenerationsToRelease,
  /// GenerationsToDiscard and DeletedJobs(held_jobs), for many hosts at once
  /// (heartbeats in batches, logic/heartbeat_batcher.h): one result per
  /// beat, in order; a host's own refusal (NotFound, FailedPrecondition) is
  /// its result's status and leaves the others alone; a status of the whole
  /// call (the database) means no beat is known to have been recorded. The
  /// default runs the per-host methods one by one (heartbeat_hosts.cc);
  /// PostgreSQL does it in one transaction of a few statements.
  [[nodiscard]] virtual absl::StatusOr<std::vector<HostHeartbeatResult>> HeartbeatHosts(
      const std::vector<HostHeartbeat>& beats);

  // ---- Bearer tokens (docs/security.md) ----
  /// Stores a token with the SHA-256 of its secret (raw 32 bytes).
  /// AlreadyExists for a used id or hash.
  [[nodiscard]] virtual absl::Status CreateToken(const TokenRecord& token,
                                                 const std::string& secret_sha256) = 0;
  /// The token whose secret hashes to `secret_sha256`, revoked or expired
  /// ones included; NotFound when none.
  [[nodiscard]] virtual absl::StatusOr<TokenRecord> FindToken(const std::string& secret_sha256) = 0;
  /// Marks the token revoked at `now_unix_ms` (again: no change). NotFound.
  [[nodiscard]] virtual absl::StatusOr<TokenRecord> RevokeToken(const std::string& id,
                                                                int64_t now_unix_ms) = 0;
  /// Every token, by id.
  [[nodiscard]] virtual absl::StatusOr<std::vector<TokenRecord>> ListTokens() = 0;
  /// The cluster's secret `name` (32 bytes): `candidate` is stored if none
  /// is yet (the first replica to ask wins), then the stored one returned.
  [[nodiscard]] virtual absl::StatusOr<std::string> GetOrCreateClusterSecret(
      const std::string& name, const std::string& candidate) = 0;
  [[nodiscard]] virtual absl::StatusOr<v1::Host> GetHost(const std::string& host_id) = 0;
  /// Moves whenever a host registers (a new host, or a new epoch of one) and
  /// at no other time (heartbeats and lease expiry leave it): a cache of what
  /// hosts register (their capacity, logic/capacity.h) is current while it
  /// holds. The number of hosts and the sum of their epochs.
  struct RegistrationsMark {
    int64_t hosts = 0;
    int64_t epochs = 0;
    bool operator==(const RegistrationsMark& o) const {
      return hosts == o.hosts && epochs == o.epochs;
    }
  };
  [[nodiscard]] virtual absl::StatusOr<RegistrationsMark> HostRegistrations() = 0;
  /// ALIVE hosts whose lease ended before `now_unix_ms`, by id; changes
  /// nothing (the leader judges them first: logic/lease_judge.h).
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> ExpiredLeases(
      int64_t now_unix_ms) = 0;
  /// Marks ALIVE hosts whose lease ended before `now_unix_ms` LOST and
  /// returns their ids.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> ExpireLeases(
      int64_t now_unix_ms) = 0;
  /// Active operations that involve any of `host_ids` (as a progress row).
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> OperationsOnHosts(
      const std::vector<std::string>& host_ids) = 0;
  /// Jobs whose current generation places a rank on any of `host_ids`.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> JobsOnHosts(
      const std::vector<std::string>& host_ids) = 0;

  // ---- Audit (audit.h; docs/security.md) ----------------------------------
  // Mutations made on a caller's behalf (CreateJob, DeleteJob,
  // CreateOperation, TransitionOperation to ABORTED, RegisterHost,
  // CreateToken, RevokeToken) also write the thread's AuditScope record, if
  // any, in their own transaction, and mark it committed.
  /// Writes `record` in its own transaction (a refused or failed call).
  [[nodiscard]] virtual absl::Status AppendAudit(const AuditRecord& record) = 0;
  [[nodiscard]] virtual absl::StatusOr<AuditPage> ListAudit(const AuditQuery& query) = 0;

  // ---- Retention (issue 9, defect 10) --------------------------------------
  /// One bounded batch of pruning under `policy`: at most batch_rows RETIRED
  /// or DISCARDED generations, at most batch_rows finished operations and
  /// at most batch_rows old audit rows, each in its own short statement. Never touches CURRENT or
  /// PENDING generations or active operations. Call again while it returns full batches.
  [[nodiscard]] virtual absl::StatusOr<PrunedRows> PruneRetention(
      const RetentionPolicy& policy) = 0;

  // ---- Liveness: deleted jobs, lost hosts of jobs (issue 9) -----------------
  /// Of `job_ids`, those that do not exist (job ids are never reused, so:
  /// deleted), in the order given.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> DeletedJobs(
      const std::vector<std::string>& job_ids) = 0;
  /// Jobs that count `host_id` among their lost hosts (persisted when the
  /// host's lease expired while it held a rank of the job's current
  /// generation; cleared by RestoreLostHost or a commit).
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> JobsLostOnHost(
      const std::string& host_id) = 0;
  /// `host_id` is no longer lost for `job_id` (it came back with the job's
  /// shards intact); the job returns from DEGRADED to ACTIVE when no lost
  /// host is left.
  [[nodiscard]] virtual absl::Status RestoreLostHost(const std::string& job_id,
                                                     const std::string& host_id) = 0;
  /// An ACTIVE or DEGRADED job becomes DEGRADED when it has lost hosts, else
  /// ACTIVE; other states are kept. Returns the state it has now.
  [[nodiscard]] virtual absl::StatusOr<v1::JobState> SettleJobLiveness(
      const std::string& job_id) = 0;
  /// The shard checksums recorded for a generation (by RecordHostProgress),
  /// rank ascending; empty for a generation no operation built.
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::ShardChecksum>> GetGenerationChecksums(
      const std::string& job_id, int64_t generation) = 0;
  /// Of `held` (generations an agent holds buffers of), those that are not a
  /// CURRENT or PENDING generation (RETIRED, DISCARDED, pruned, or of a
  /// deleted job), in order: the agent may drop them.
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::GenerationRef>> StaleGenerations(
      const std::vector<v1::GenerationRef>& held) = 0;
};

using StorePtr = std::shared_ptr<Store>;

/// A cluster-wide exclusive lock that picks the replica driving operations:
/// a PostgreSQL session-level advisory lock held on its own connection, so
/// it is released by the server when the holder dies or its connection
/// drops. Not thread-safe: one owner thread.
class LeaderLock {
 public:
  virtual ~LeaderLock() = default;
  /// Takes the lock if free; true when this object holds it now.
  [[nodiscard]] virtual absl::StatusOr<bool> TryAcquire() = 0;
  /// Whether the lock is still held (checks the connection is alive; false
  /// after the connection dropped, after which TryAcquire reconnects).
  [[nodiscard]] virtual bool StillHeld() = 0;
  /// Releases the lock if held. Idempotent.
  virtual void Release() = 0;
};

}  // namespace reshard::coordinator
