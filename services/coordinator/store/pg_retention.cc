// PgStore: the retention policy's pruning (docs/coordinator.md, "Retention").
#include "absl/strings/str_cat.h"
#include "services/coordinator/store/pg_audit_statements.h"
#include "services/coordinator/store/pg_statements.h"
#include "services/coordinator/store/pg_store.h"
#include "services/coordinator/store/pg_store_internal.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {

absl::StatusOr<PrunedRows> PgStore::PruneRetention(const RetentionPolicy& policy) {
  if (absl::Status s = CheckRetentionPolicy(policy); !s.ok()) return s;
  PrunedRows pruned;
  // One short transaction per statement: pruning never holds locks long
  // and a failure loses at most one batch of work.
  absl::StatusOr<int64_t> retired = pg::TransactFor<int64_t>(
      *pool_, "PruneRetiredGenerations", [&](pg::PgTx& tx) -> absl::StatusOr<int64_t> {
        return tx
            .Exec(pg::kPruneRetiredGenerations, policy.keep_retired_generations,
                  policy.retired_min_age_ms, policy.batch_rows)
            .affected_rows();
      });
  if (!retired.ok()) return retired.status();
  absl::StatusOr<int64_t> discarded = pg::TransactFor<int64_t>(
      *pool_, "PruneDiscardedGenerations", [&](pg::PgTx& tx) -> absl::StatusOr<int64_t> {
        return tx
            .Exec(pg::kPruneDiscardedGenerations, policy.discarded_min_age_ms, policy.batch_rows)
            .affected_rows();
      });
  if (!discarded.ok()) return discarded.status();
  absl::StatusOr<int64_t> operations = pg::TransactFor<int64_t>(
      *pool_, "PruneOperations", [&](pg::PgTx& tx) -> absl::StatusOr<int64_t> {
        return tx
            .Exec(pg::kPruneOperations, policy.keep_operations, policy.operation_min_age_ms,
                  policy.batch_rows)
            .affected_rows();
      });
  if (!operations.ok()) return operations.status();
  absl::StatusOr<int64_t> audit =
      pg::TransactFor<int64_t>(*pool_, "PruneAudit", [&](pg::PgTx& tx) -> absl::StatusOr<int64_t> {
        return tx.Exec(pg::kPruneAudit, policy.audit_min_age_ms, policy.batch_rows).affected_rows();
      });
  if (!audit.ok()) return audit.status();
  pruned.generations = *retired + *discarded;
  pruned.operations = *operations;
  pruned.audit = *audit;
  return pruned;
}

}  // namespace reshard::coordinator
