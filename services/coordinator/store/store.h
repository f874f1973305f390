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
//
// The interface is cut by aggregate, each a header with its record types and
// a PgStore / MemoryStore pair of files: JobStore (job_store.h), OperationStore
// (operation_store.h), HostStore (host_store.h) and AuthStore
// (auth_store.h). Store is their composition plus the calls that cross
// aggregates (a batch of heartbeats, retention). A caller that needs one
// aggregate takes that interface.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "reshard/v1/agent.pb.h"
#include "reshard/v1/coordinator.pb.h"
#include "services/coordinator/store/auth_store.h"
#include "services/coordinator/store/host_store.h"
#include "services/coordinator/store/job_store.h"
#include "services/coordinator/store/operation_store.h"

namespace reshard::coordinator {

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

class Store : public JobStore, public OperationStore, public HostStore, public AuthStore {
 public:
  ~Store() override = default;

  // ---- Across aggregates -----------------------------------------------------
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

  // ---- Retention (issue 9, defect 10) --------------------------------------
  /// One bounded batch of pruning under `policy`: at most batch_rows RETIRED
  /// or DISCARDED generations, at most batch_rows finished operations and
  /// at most batch_rows old audit rows, each in its own short statement. Never touches CURRENT or
  /// PENDING generations or active operations. Call again while it returns full batches.
  [[nodiscard]] virtual absl::StatusOr<PrunedRows> PruneRetention(
      const RetentionPolicy& policy) = 0;
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
