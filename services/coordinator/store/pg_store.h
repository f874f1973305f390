// PostgreSQL implementations of the coordinator's Store and LeaderLock
// (libpqxx). The schema is migrations/*.sql, applied by the migrator
// (migrator.h); PgStore::Connect refuses a database at another version.
//
// Thread contract: PgStore is thread-safe (a pool of connections, one
// transaction per call). PgLeaderLock is not: one owner thread.
//
// Behaviour beyond store.h:
//   * Connection drops: a call whose pooled connection turns out to be dead
//     before it committed (server restart, pg_terminate_backend) reconnects
//     and runs its transaction once more, transparently; it fails with
//     Unavailable only when the server cannot be reached again, or when the
//     connection broke during the commit itself (outcome unknown).
//   * A server that does not answer (stopped, frozen disk): a call fails with
//     Unavailable once it waited acquire_timeout_ms for a connection,
//     connect_timeout_s for a new one, or statement_timeout_ms for the answer
//     to one statement; it is not retried (docs/coordinator.md, "When
//     PostgreSQL does not answer"). Health() says how the server has been
//     answering, for the leader's lease sweep.
//   * Agent-class calls (call_class.h) may use `agent_reserve` connections
//     that client calls never take.
//   * Generation numbers are never reused within a job: an operation's
//     to_generation is one above the highest generation ever recorded for
//     the job (its current one, unless an aborted operation left a DISCARDED
//     one), so a (job, generation) pair names one set of agent buffers.
//   * TransitionOperation makes only PENDING -> PLANNED and active ->
//     ABORTED / FAILED; TRANSFERRING and COMMITTED are reached through
//     StartTransfer and CommitOperation. Anything else is InvalidArgument.
//   * Operation.updated_unix_ms moves on every transition and every progress
//     report.
//   * Times the database sets (job and operation created / updated) come from
//     PostgreSQL's clock, not the coordinator's injected Clock.
//   * Job.total_bytes: logical bytes of the PTC (tensor elements x element
//     size, plus each blob once).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/coordinator/store/store.h"
#include "services/coordinator/store/store_health.h"

namespace reshard::coordinator {

namespace pg {
class PgPool;
class PgTx;
}  // namespace pg

struct PgStoreOptions {
  /// libpq connection string or URI, e.g. "host=db port=5432 dbname=reshard
  /// user=reshard connect_timeout=5".
  std::string dsn;
  /// Connections kept at most; they open on demand.
  int pool_size = 8;
  /// Connections only agent-class calls (call_class.h) may take; less than
  /// pool_size.
  int agent_reserve = 0;
  /// How long a call waits for a free connection before Unavailable.
  int acquire_timeout_ms = 5000;
  /// How long a statement (BEGIN and COMMIT included) or a new connection's
  /// set-up waits for the server's answer before the connection is dropped
  /// and the call is Unavailable; also the server-side statement_timeout
  /// (idle_in_transaction_session_timeout: twice it). 0: no deadline.
  int statement_timeout_ms = 5000;
  /// libpq connect_timeout of new connections, seconds (libpq: at least 2);
  /// a connect_timeout in `dsn` wins. 0: none.
  int connect_timeout_s = 5;
  /// The server leaving every call unanswered this long is an outage
  /// (Health()).
  int outage_after_ms = 1000;
  /// Connect() fails with FailedPrecondition unless the database schema is
  /// at the version this binary knows (migrator.h CheckSchema).
  bool check_schema = true;
  /// Called after each statement with its name (pg_statements.h; "commit"
  /// for commits) and wall time in seconds, from the calling thread. For
  /// metrics; may be empty.
  std::function<void(const std::string& statement, double seconds)> observer;
  /// Called with the hosts whose tasks a call created or restarted
  /// (StartTransfer, StartPrepare, StartPreparedTransfer), after its commit,
  /// from the calling thread: this replica's waiters learn at once. Must be
  /// quick and thread-safe; may be empty.
  std::function<void(const std::vector<std::string>& host_ids)> on_tasks_changed;
  /// Those calls also NOTIFY kTasksChannel with each host id in their
  /// transaction (other replicas' PgListener). false: a lost
  /// notification, for tests of the safety re-read.
  bool notify_tasks = true;
};

/// The PostgreSQL channel a task-creating transaction notifies, payload the
/// host id (docs/coordinator.md, "Agents are told").
inline constexpr char kTasksChannel[] = "reshard_tasks";
/// The channel every committed change to a job or an operation notifies
/// (migrations/0016: triggers), payload `j:<job id>` or `o:<operation id>`
/// (docs/coordinator.md, "Change feed").
inline constexpr char kChangesChannel[] = "reshard_changes";

class PgStore : public Store {
 public:
  using Options = PgStoreOptions;

  /// Opens the pool (one connection now). Unavailable when PostgreSQL cannot
  /// be reached; FailedPrecondition when the schema does not match.
  [[nodiscard]] static absl::StatusOr<std::shared_ptr<PgStore>> Connect(
      const PgStoreOptions& options);
  ~PgStore() override;

  /// Names of every statement PgStore runs (metric labels), plus "commit".
  static std::vector<std::string> StatementNames();

  /// How PostgreSQL has been answering this store's calls; thread-safe.
  StoreHealth Health() const;
  /// A trivial query (SELECT 1) under the store's deadlines: OK once
  /// PostgreSQL answers; what the leader asks while it waits out an outage.
  [[nodiscard]] absl::Status Probe();

  // ---- Jobs (job_store.h: pg_jobs.cc, pg_dataset_state.cc, pg_rank_failures.cc) ---
  [[nodiscard]] absl::StatusOr<v1::Job> CreateJob(
      const std::string& job_id, const v1::JobSpec& spec, const Idempotency& idem,
      const v1::DatasetState* dataset_state = nullptr) override;
  [[nodiscard]] absl::StatusOr<v1::DatasetState> CommitStep(const StepCommit& commit) override;
  [[nodiscard]] absl::StatusOr<v1::RankFailure> RecordRankFailure(
      const RankFailureReport& report) override;
  [[nodiscard]] absl::StatusOr<v1::Job> GetJob(const std::string& job_id,
                                               bool include_ptc) override;
  [[nodiscard]] absl::StatusOr<v1::Ptc> GetPtc(const std::string& job_id) override;
  [[nodiscard]] absl::StatusOr<std::map<std::string, int64_t>> JobVersions(
      const std::vector<std::string>& job_ids) override;
  [[nodiscard]] absl::StatusOr<JobPage> ListJobs(const ListJobsQuery& query) override;
  [[nodiscard]] absl::Status DeleteJob(const std::string& job_id,
                                       const Idempotency& idem = {}) override;
  [[nodiscard]] absl::Status SetJobState(const std::string& job_id, v1::JobState state) override;
  [[nodiscard]] absl::StatusOr<v1::Job> SetJobPolicy(const std::string& job_id,
                                                     const v1::ElasticPolicy* policy) override;
  [[nodiscard]] absl::Status SetPolicyStatus(const std::string& job_id,
                                             const std::string& status) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> JobsWithPolicy() override;
  [[nodiscard]] absl::StatusOr<std::vector<std::pair<v1::JobState, int64_t>>> CountJobsByState()
      override;
  [[nodiscard]] absl::StatusOr<std::vector<v1::ShardChecksum>> GetGenerationChecksums(
      const std::string& job_id, int64_t generation) override;

  // ---- Operations (operation_store.h) -----------------------------------------
  // pg_operations.cc, pg_meeting.cc, pg_stop_free.cc, pg_prepare.cc,
  // pg_transfer.cc, pg_idempotency.cc; OperationVersions beside JobVersions
  // (pg_jobs.cc), AssignedOperationsOfHosts beside HeartbeatHosts
  // (pg_heartbeat.cc).
  [[nodiscard]] absl::StatusOr<std::map<std::string, int64_t>> OperationVersions(
      const std::vector<std::string>& operation_ids) override;
  [[nodiscard]] absl::StatusOr<v1::Operation> CreateOperation(const NewOperation& op) override;
  [[nodiscard]] absl::StatusOr<bool> ReleaseQueuedOperation(const std::string& operation_id,
                                                            int64_t now_unix_ms) override;
  [[nodiscard]] absl::StatusOr<bool> EndStepBoundaryWait(const std::string& operation_id) override;
  [[nodiscard]] absl::StatusOr<v1::Operation> MarkPrepared(
      const std::string& operation_id) override;
  [[nodiscard]] absl::StatusOr<OperationRecord> GetOperation(const std::string& operation_id,
                                                             bool include_plan) override;
  [[nodiscard]] absl::Status StartPrepare(const std::string& operation_id, int64_t from_generation,
                                          const std::vector<HostProgress>& hosts) override;
  [[nodiscard]] absl::Status RecordHostPrepared(
      const std::string& operation_id, const std::string& host_id, int64_t now_unix_ms,
      const std::vector<v1::ShardChecksum>& sources) override;
  [[nodiscard]] absl::StatusOr<std::vector<v1::ShardChecksum>> GetPreparedSources(
      const std::string& operation_id) override;
  [[nodiscard]] absl::Status StartPreparedTransfer(const std::string& operation_id,
                                                   const std::vector<HostProgress>& hosts,
                                                   const SkippedSteps& skipped) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> ListActiveOperations() override;
  [[nodiscard]] absl::Status TransitionOperation(const std::string& operation_id,
                                                 v1::OperationState from, v1::OperationState to,
                                                 const OperationUpdate& update) override;
  [[nodiscard]] absl::StatusOr<std::optional<std::string>> LookupIdempotencyKey(
      const Idempotency& idem) override;
  [[nodiscard]] absl::Status StartTransfer(const std::string& operation_id,
                                           const std::vector<HostProgress>& hosts) override;
  [[nodiscard]] absl::Status RecordHostProgress(
      const std::string& operation_id, const HostProgress& progress,
      const std::vector<v1::ShardChecksum>& checksums) override;
  [[nodiscard]] absl::StatusOr<std::vector<HostProgress>> GetHostProgress(
      const std::string& operation_id) override;
  [[nodiscard]] absl::Status CommitOperation(const std::string& operation_id) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> AssignedOperations(
      const std::string& host_id) override;
  [[nodiscard]] absl::StatusOr<std::vector<v1::Operation>> ListOperationsForJob(
      const std::string& job_id) override;
  [[nodiscard]] absl::StatusOr<std::map<std::string, std::vector<std::string>>>
  AssignedOperationsOfHosts(const std::vector<std::string>& host_ids) override;

  // ---- Hosts (host_store.h: pg_hosts.cc, pg_heartbeat.cc) -------------------
  [[nodiscard]] absl::StatusOr<std::vector<v1::GenerationRef>> GenerationsToRelease(
      const std::string& host_id) override;
  [[nodiscard]] absl::StatusOr<std::vector<v1::GenerationRef>> GenerationsToDiscard(
      const std::string& host_id) override;
  [[nodiscard]] absl::StatusOr<int64_t> RegisterHost(const v1::Host& host, int64_t now_unix_ms,
                                                     int64_t lease_expires_unix_ms) override;
  [[nodiscard]] absl::Status Heartbeat(const std::string& host_id, int64_t epoch,
                                       int64_t now_unix_ms, int64_t lease_expires_unix_ms) override;
  [[nodiscard]] absl::StatusOr<std::vector<v1::Host>> ListHosts() override;
  [[nodiscard]] absl::StatusOr<std::vector<v1::Host>> GetHosts(
      const std::vector<std::string>& host_ids) override;
  [[nodiscard]] absl::StatusOr<std::map<std::string, v1::HostState>> HostStates() override;
  [[nodiscard]] absl::StatusOr<v1::Host> GetHost(const std::string& host_id) override;
  [[nodiscard]] absl::Status SetHostLeaves(const std::string& host_id,
                                           int64_t leaves_unix_ms) override;
  [[nodiscard]] absl::StatusOr<RegistrationsMark> HostRegistrations() override;
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> ExpiredLeases(
      int64_t now_unix_ms) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> ExpireLeases(int64_t now_unix_ms) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> OperationsOnHosts(
      const std::vector<std::string>& host_ids) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> JobsOnHosts(
      const std::vector<std::string>& host_ids) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> DeletedJobs(
      const std::vector<std::string>& job_ids) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> JobsLostOnHost(
      const std::string& host_id) override;
  [[nodiscard]] absl::Status RestoreLostHost(const std::string& job_id,
                                             const std::string& host_id) override;
  [[nodiscard]] absl::StatusOr<v1::JobState> SettleJobLiveness(const std::string& job_id) override;
  [[nodiscard]] absl::StatusOr<std::vector<v1::GenerationRef>> StaleGenerations(
      const std::vector<v1::GenerationRef>& held) override;

  // ---- Auth (auth_store.h: pg_auth.cc) --------------------------------------
  [[nodiscard]] absl::Status CreateToken(const TokenRecord& token,
                                         const std::string& secret_sha256) override;
  [[nodiscard]] absl::StatusOr<TokenRecord> FindToken(const std::string& secret_sha256) override;
  [[nodiscard]] absl::StatusOr<TokenRecord> RevokeToken(const std::string& id,
                                                        int64_t now_unix_ms) override;
  [[nodiscard]] absl::StatusOr<std::vector<TokenRecord>> ListTokens() override;
  [[nodiscard]] absl::StatusOr<std::string> GetOrCreateClusterSecret(
      const std::string& name, const std::string& candidate) override;
  [[nodiscard]] absl::Status AppendAudit(const AuditRecord& record) override;
  [[nodiscard]] absl::StatusOr<AuditPage> ListAudit(const AuditQuery& query) override;

  // ---- Across aggregates (store.h: pg_heartbeat.cc, pg_retention.cc) --------
  /// One transaction: one UPDATE of every leased host, then each list as
  /// one query over all the batch's hosts (pg_heartbeat.cc).
  [[nodiscard]] absl::StatusOr<std::vector<HostHeartbeatResult>> HeartbeatHosts(
      const std::vector<HostHeartbeat>& beats) override;
  [[nodiscard]] absl::StatusOr<PrunedRows> PruneRetention(const RetentionPolicy& policy) override;

 private:
  explicit PgStore(std::unique_ptr<pg::PgPool> pool);
  /// In a task-creating transaction: NOTIFY kTasksChannel per host.
  void NotifyTasks(pg::PgTx& tx, const std::vector<std::string>& host_ids) const;
  /// After it: `committed`, and on_tasks_changed when it is OK.
  absl::Status TasksChanged(absl::Status committed, const std::vector<std::string>& host_ids) const;

  std::unique_ptr<pg::PgPool> pool_;
  std::function<void(const std::vector<std::string>&)> on_tasks_changed_;
  bool notify_tasks_ = true;
};

/// The advisory lock key of the coordinator's leader election.
inline constexpr int64_t kLeaderLockKey = 0x7265736861726402;  // "reshard\x02"

/// Deadlines of the leader lock's connection (as PgStoreOptions').
struct PgLeaderLockOptions {
  /// A query without an answer this long: the connection is dropped, so the
  /// lock counts as lost (StillHeld false) or not taken (Unavailable).
  int statement_timeout_ms = 5000;
  int connect_timeout_s = 5;
};

/// LeaderLock on a dedicated connection holding the session-level advisory
/// lock pg_try_advisory_lock(key). The server releases it when the
/// connection closes, so a dead holder frees it. Not thread-safe.
class PgLeaderLock : public LeaderLock {
 public:
  /// Connects lazily, on the first TryAcquire.
  PgLeaderLock(std::string dsn, int64_t key, PgLeaderLockOptions options = {});
  ~PgLeaderLock() override;  // releases

  /// Unavailable when PostgreSQL cannot be reached.
  [[nodiscard]] absl::StatusOr<bool> TryAcquire() override;
  /// Runs a trivial query on the lock's connection; false (and the
  /// connection dropped) when it fails.
  [[nodiscard]] bool StillHeld() override;
  void Release() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The factory the server uses: a PgLeaderLock on `dsn`.
std::unique_ptr<LeaderLock> MakePgLeaderLock(const std::string& dsn, int64_t key = kLeaderLockKey,
                                             PgLeaderLockOptions options = {});

}  // namespace reshard::coordinator
