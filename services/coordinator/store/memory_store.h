// An in-memory Store (store.h): every piece of cluster state in maps behind
// one mutex, with the observable semantics of PgStore (the same status codes
// and messages, compare-and-set moves through operation_machine.h, list
// orders, idempotency scopes, generations, leases and audit rows). For the
// logic tests, which then need no database; one contract suite
// (tests/coordinator/store, Store/*) runs against both stores
// (docs/coordinator.md, "The in-memory store and the contract suite").
//
// Thread contract: thread-safe; every method holds the one mutex for its whole
// body, so each call is one transaction. Nothing persists past the object.
//
// Times the database stamps in PgStore (created_at, updated_at, committed_at,
// audit rows, retention ages) come from `now_unix_ms` here.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "services/coordinator/store/operation_create.h"
#include "services/coordinator/store/operation_machine.h"
#include "services/coordinator/store/store.h"

namespace reshard::coordinator {

struct MemoryStoreOptions {
  /// The store's clock (PgStore's now()); the system clock when unset.
  std::function<int64_t()> now_unix_ms;
  /// As PgStoreOptions::on_tasks_changed: hosts whose assigned work changed,
  /// called after the change, outside the store's lock.
  std::function<void(const std::vector<std::string>& host_ids)> on_tasks_changed;
};

class MemoryStore : public Store {
 public:
  using Options = MemoryStoreOptions;

  explicit MemoryStore(MemoryStoreOptions options = {});
  ~MemoryStore() override;

  // ---- Jobs (job_store.h: memory_jobs.cc) -----------------------------------
  [[nodiscard]] absl::StatusOr<v1::Job> CreateJob(
      const std::string& job_id, const v1::JobSpec& spec, const Idempotency& idem,
      const v1::DatasetState* dataset_state = nullptr) override;
  [[nodiscard]] absl::StatusOr<v1::Job> GetJob(const std::string& job_id,
                                               bool include_ptc) override;
  [[nodiscard]] absl::StatusOr<v1::Ptc> GetPtc(const std::string& job_id) override;
  [[nodiscard]] absl::StatusOr<JobPage> ListJobs(const ListJobsQuery& query) override;
  [[nodiscard]] absl::Status DeleteJob(const std::string& job_id,
                                       const Idempotency& idem = {}) override;
  [[nodiscard]] absl::Status SetJobState(const std::string& job_id, v1::JobState state) override;
  [[nodiscard]] absl::StatusOr<v1::Job> SetJobPolicy(const std::string& job_id,
                                                     const v1::ElasticPolicy* policy) override;
  [[nodiscard]] absl::Status SetPolicyStatus(const std::string& job_id,
                                             const std::string& status) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> JobsWithPolicy() override;
  [[nodiscard]] absl::StatusOr<v1::DatasetState> CommitStep(const StepCommit& commit) override;
  [[nodiscard]] absl::StatusOr<v1::RankFailure> RecordRankFailure(
      const RankFailureReport& report) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::pair<v1::JobState, int64_t>>> CountJobsByState()
      override;
  [[nodiscard]] absl::StatusOr<std::vector<v1::ShardChecksum>> GetGenerationChecksums(
      const std::string& job_id, int64_t generation) override;

  // ---- Operations (operation_store.h: memory_operations.cc, memory_prepare.cc) ---
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

  // ---- Hosts (host_store.h: memory_hosts.cc) --------------------------------
  [[nodiscard]] absl::StatusOr<std::vector<v1::GenerationRef>> GenerationsToRelease(
      const std::string& host_id) override;
  [[nodiscard]] absl::StatusOr<std::vector<v1::GenerationRef>> GenerationsToDiscard(
      const std::string& host_id) override;
  [[nodiscard]] absl::StatusOr<int64_t> RegisterHost(const v1::Host& host, int64_t now_unix_ms,
                                                     int64_t lease_expires_unix_ms) override;
  [[nodiscard]] absl::Status Heartbeat(const std::string& host_id, int64_t epoch,
                                       int64_t now_unix_ms, int64_t lease_expires_unix_ms) override;
  [[nodiscard]] absl::StatusOr<std::vector<v1::Host>> ListHosts() override;
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

  // ---- Auth (auth_store.h: memory_auth.cc) ----------------------------------
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

  // ---- Across aggregates (store.h: memory_retention.cc) ---------------------
  [[nodiscard]] absl::StatusOr<PrunedRows> PruneRetention(const RetentionPolicy& policy) override;

 private:
  /// The store's lock. One hold is one call, the memory store's
  /// transaction: a row's version advances once per hold that changes it,
  /// as PgStore's once per transaction (migration 0020).
  class CallLock {
   public:
    void lock() {
      mu_.lock();
      ++holds_;
    }
    void unlock() { mu_.unlock(); }
    /// The current hold (call with the lock held).
    int64_t hold() const { return holds_; }

   private:
    std::mutex mu_;
    int64_t holds_ = 0;
  };
  struct Generation {
    v1::Layout layout;
    GenerationState state = GenerationState::kCurrent;
    std::string operation_id;             // the operation that built it ("" : none)
    std::vector<std::string> rank_hosts;  // rank order
    std::map<int, std::vector<v1::ShardChecksum>> checksums;  // by rank
    int64_t created_unix_ms = 0;
    std::optional<int64_t> committed_unix_ms;
  };
  struct Job {
    v1::Job row;  // id, tenant, name, state, generation, counts, times, layout_epoch, version
    v1::Ptc ptc;  // as PgStore returns it
    std::map<int64_t, Generation> generations;
    std::map<int64_t, v1::DatasetState> dataset_states;  // by generation
    std::set<std::string> lost_hosts;                     // job_lost_hosts
    std::map<std::pair<int64_t, int>, v1::RankFailure> rank_failures;  // (generation, rank)

    // The CallLock hold that last advanced row.version.
    int64_t version_hold = 0;
  };
  struct HostRow {
    HostProgress progress;
    int64_t bytes_precopied = 0;
  };
  struct Operation {
    v1::Operation row;  // the stored columns; derived fields are set on read
    int64_t seq = 0;
    std::vector<std::string> lost_hosts;
    std::vector<int> lost_ranks;
    std::optional<v1::TransferPlan> plan;
    std::vector<int64_t> skipped_steps;
    int64_t step_boundary_timeout_ms = 0;
    std::optional<int64_t> step, step_cursor;  // a checkpoint's step boundary
    std::optional<int64_t> finished_unix_ms;
    std::map<std::string, HostRow> hosts;                                  // by host id
    std::map<std::pair<int, int>, std::pair<std::string, v1::ShardChecksum>> prepared_sources;

    // The CallLock hold that last advanced row.version.
    int64_t version_hold = 0;
  };
  struct KeyRow {
    std::string method, request_hash, resource_id, job_id;  // job_id "": outlives the job
  };
  struct HostRecord {
    v1::Host info;  // without state, heartbeat and lease
    v1::HostState state = v1::HOST_STATE_ALIVE;
    int64_t epoch = 0;
    int64_t last_heartbeat_unix_ms = 0;
    int64_t lease_expires_unix_ms = 0;
  };
  struct Token {
    TokenRecord record;
    std::string secret_sha256;
  };
  /// What one call does besides its effect: audit rows written when it
  /// succeeds (PgStore writes them in the call's transaction).
  struct Tx {
    std::vector<AuditRecord> audit;
    std::vector<std::string> tasks_changed;
  };

  int64_t Now() const;
  /// Versions are per job and per operation (migration 0020): the row's
  /// version advances by 1, once per call that changes it.
  template <typename Row>
  void AdvanceVersion(Row& row) {
    if (row.version_hold == mu_.hold()) return;
    row.version_hold = mu_.hold();
    row.row.set_version(row.row.version() + 1);
  }
  void TouchJob(Job& job);
  void TouchOperation(Operation& op);
  /// A change to what the operation's job shows (its active operation's
  /// state, a step boundary): a new version of the job (migration 0016).
  void TouchJobOf(const Operation& op);
  /// Applies a successful call's audit rows (under the lock) and returns
  /// `status`; the hosts to tell are told by the caller after unlocking.
  void Commit(Tx& tx);
  void TellTasks(const std::vector<std::string>& host_ids) const;

  Job* FindJob(const std::string& job_id);
  Operation* FindOperation(const std::string& operation_id);
  // The operation a call with host rows names, after checking the rows
  // (CheckHostRows, states unchecked); NotFound if unknown. mu_ held.
  absl::StatusOr<Operation*> OperationWithRows(const std::string& operation_id,
                                               const std::vector<HostProgress>& hosts);
  v1::Job JobView(const Job& job) const;
  OperationRecord OperationView(const Operation& op, bool include_plan) const;
  std::vector<const Operation*> OperationsOfJob(const std::string& job_id) const;  // by seq
  std::vector<const Operation*> ActiveOperationsOfJob(const std::string& job_id) const;
  bool JobHasLostHosts(const Job& job) const;
  bool HostLost(const std::string& host_id) const;
  /// kSettleJobState: DEGRADED with lost hosts, else ACTIVE.
  void SettleJobState(Job& job);
  /// kKeepReconfiguring: an ACTIVE job with an active operation stays RECONFIGURING.
  void KeepReconfiguring(Job& job);
  void TouchJobsOnHost(const std::string& host_id);
  int64_t MaxGeneration(const Job& job) const;
  /// The primary key and unique indexes of generations: one CURRENT per job,
  /// one PENDING per operation (migration 0011).
  absl::Status CheckNewGeneration(const Job& job, int64_t generation, const v1::Layout& layout,
                                  GenerationState state, const std::string& operation_id,
                                  const std::string& what) const;
  void InsertGeneration(Job& job, int64_t generation, const v1::Layout& layout,
                        GenerationState state, const std::string& operation_id);
  /// The operation's to_generation as a PENDING generation of its job (its
  /// target layout); nothing changes on an error.
  absl::Status InsertPendingGeneration(const Operation& op);
  void DiscardPendingGeneration(Job& job, int64_t generation);
  /// Generations in `state` that place a rank on `host_id`, by job and number.
  std::vector<v1::GenerationRef> GenerationsIn(GenerationState state,
                                               const std::string& host_id) const;
  /// pg::WriteAudit: the thread's AuditScope record, if any, for this call.
  void WriteAudit(Tx& tx, const std::string& job_id, const std::string& operation_id,
                  const std::string& target = "");
  /// pg InsertAudit: fills tenant / job id from the job / operation, bounds the text.
  void InsertAudit(AuditRecord& r);

  absl::StatusOr<std::optional<std::string>> FindKey(const Idempotency& idem) const;
  /// False when the scope holds the key already.
  bool ClaimKey(const Idempotency& idem, const std::string& resource_id,
                const std::string& job_id);

  absl::Status CheckMove(const Operation& op, OpPhase to) const;
  /// CreateOperation's reads and writes around PlanCreation
  /// (operation_create.h): what the rules need of `job`, and the plan written.
  absl::StatusOr<CreationSnapshot> ReadCreation(const NewOperation& op, const Job& job) const;
  Operation& WriteCreation(const NewOperation& op, const CreationPlan& plan, Job& job);
  std::optional<PendingCheckpoint> PendingCheckpointOf(const std::string& job_id) const;
  void SetAgentsPrepared(Operation& op);
  void SettlePrepared(Operation& op);
  void EndOperation(Operation& op, v1::OperationState to, const OperationUpdate& update);
  void DeleteOperation(const std::string& operation_id);

  MemoryStoreOptions options_;
  mutable CallLock mu_;
  int64_t next_seq_ = 0;
  int64_t next_audit_id_ = 0;
  std::map<std::string, Job> jobs_;              // by id
  std::map<std::string, Operation> operations_;  // by id
  std::map<int64_t, std::string> operation_seq_;  // creation order
  std::map<std::pair<std::vector<std::string>, std::string>, KeyRow> keys_;  // (tenants, key)
  std::map<std::string, HostRecord> hosts_;
  std::map<std::string, Token> tokens_;  // by id
  std::map<std::string, std::string> cluster_secrets_;
  std::map<int64_t, AuditRecord> audit_;  // by id
};

}  // namespace reshard::coordinator
