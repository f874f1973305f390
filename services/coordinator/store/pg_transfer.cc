// PgStore: the TRANSFERRING phase (pending generation, per-host progress,
// checksums), the commit, and the operations assigned to a host.
#include <map>

#include "absl/strings/str_cat.h"
#include "services/coordinator/store/pg_codec.h"
#include "services/coordinator/store/pg_dataset_state.h"
#include "services/coordinator/store/pg_dataset_statements.h"
#include "services/coordinator/store/pg_statements.h"
#include "services/coordinator/store/pg_stop_free_statements.h"
#include "services/coordinator/store/pg_store.h"
#include "services/coordinator/store/pg_store_internal.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {
namespace {

// The locked operation row (lock_operation).
struct LockedOperation {
  std::string job_id;
  v1::OperationState state;
  int64_t to_generation;
  pqxx::binarystring target_layout;
};

absl::StatusOr<LockedOperation> LockOperation(pg::PgTx& tx, const std::string& operation_id) {
  const pqxx::result r = tx.Exec(pg::kLockOperation, operation_id);
  if (r.empty()) return pg::OperationNotFound(operation_id);
  return LockedOperation{r[0][0].c_str(), static_cast<v1::OperationState>(r[0][1].as<int>()),
                         r[0][3].as<int64_t>(), pqxx::binarystring(r[0][4])};
}

}  // namespace

absl::Status PgStore::StartTransfer(const std::string& operation_id,
                                    const std::vector<HostProgress>& hosts) {
  std::vector<std::string> host_ids, errors;
  std::vector<int64_t> states, done, total, progress;
  if (absl::Status s = CheckHostRows(operation_id, hosts, /*check_states=*/true); !s.ok()) {
    return s;
  }
  for (const HostProgress& h : hosts) {
    host_ids.push_back(h.host_id);
    states.push_back(h.state);
    done.push_back(h.bytes_done);
    total.push_back(h.bytes_total);
    progress.push_back(h.progress_unix_ms);
    errors.push_back(pg::TruncateError(h.error));
  }

  return TasksChanged(pool_->Transact("StartTransfer", [&](pg::PgTx& tx) -> absl::Status {
    absl::StatusOr<LockedOperation> op = LockOperation(tx, operation_id);
    if (!op.ok()) return op.status();
    // PLANNED (stop-the-world) or LEGACY_CUTTING_OVER -> TRANSFERRING.
    if (absl::Status s = pg::CheckMove(tx, operation_id, OpPhase::kTransferring); !s.ok()) {
      return s;
    }
    v1::Layout target;
    if (!target.ParseFromArray(op->target_layout.data(),
                               static_cast<int>(op->target_layout.size()))) {
      return absl::InternalError(
          absl::StrCat("stored target layout of operation \"", operation_id, "\" does not parse"));
    }
    absl::StatusOr<pg::GenerationRows> rows = pg::ToGenerationRows(target, "target");
    if (!rows.ok()) return rows.status();
    pg::InsertGeneration(tx, op->job_id, op->to_generation, op->target_layout.str(), *rows,
                         GenerationState::kPending, operation_id);
    tx.Exec(pg::kInsertOperationHosts, operation_id, pg::TextArray(host_ids), pg::IntArray(states),
            pg::IntArray(done), pg::IntArray(total), pg::TextArray(errors), pg::IntArray(progress));
    tx.Exec(pg::kSetOperationTransferring, operation_id);
    NotifyTasks(tx, host_ids);
    return absl::OkStatus();
  }), host_ids);
}

absl::Status PgStore::RecordHostProgress(const std::string& operation_id,
                                         const HostProgress& progress,
                                         const std::vector<v1::ShardChecksum>& checksums) {
  if (absl::Status s = CheckTaskState(progress.host_id, progress.state); !s.ok()) return s;
  // One packed value per rank (generation_ranks.checksums).
  std::map<int, std::vector<const v1::ShardChecksum*>> by_rank;
  for (const v1::ShardChecksum& c : checksums) by_rank[c.rank()].push_back(&c);
  std::vector<int64_t> ranks;
  std::vector<std::string> packed;
  for (const auto& [rank, list] : by_rank) {
    ranks.push_back(rank);
    packed.push_back(pg::Hex(pg::PackChecksums(list)));
  }
  const std::string error = pg::TruncateError(progress.error);

  return pool_->Transact("RecordHostProgress", [&](pg::PgTx& tx) -> absl::Status {
    absl::StatusOr<LockedOperation> op = LockOperation(tx, operation_id);
    if (!op.ok()) return op.status();
    // A stop-free operation's prepare rows (PLANNED) take RUNNING and
    // FAILED reports too; PREPARED goes through RecordHostPrepared.
    absl::StatusOr<bool> of_prepare = ProgressOfPrepare(operation_id, op->state, progress.state);
    if (!of_prepare.ok()) return of_prepare.status();
    const bool preparing = *of_prepare;
    if (tx.Exec(pg::kUpdateHostProgress, operation_id, progress.host_id,
                static_cast<int>(progress.state), progress.bytes_done, progress.bytes_total, error,
                progress.progress_unix_ms, pg::TruncateError(progress.waiting_on),
                pg::TruncateError(progress.route), pg::TruncateError(progress.route_reason))
            .empty()) {
      return HostNotInOperation(operation_id, progress.host_id);
    }
    if (!ranks.empty()) {
      const pqxx::result stored = tx.Exec(pg::kStoreRankChecksums, op->job_id, op->to_generation,
                                          pg::IntArray(ranks), pg::TextArray(packed));
      if (stored.affected_rows() != ranks.size()) {
        return ChecksumRanksMissing(progress.host_id, ranks.size(), stored.affected_rows(),
                                    op->to_generation, op->job_id);
      }
    }
    // The prepare's bytes are counted in bytes_precopied, not bytes_done.
    if (!preparing) tx.Exec(pg::kUpdateOperationBytesDone, operation_id);
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<HostProgress>> PgStore::GetHostProgress(
    const std::string& operation_id) {
  using Rows = std::vector<HostProgress>;
  return pg::TransactFor<Rows>(
      *pool_, "GetHostProgress", [&](pg::PgTx& tx) -> absl::StatusOr<Rows> {
        const pqxx::result r = tx.Exec(pg::kSelectHostProgress, operation_id);
        if (r.empty() && tx.Exec(pg::kOperationState, operation_id).empty()) {
          return pg::OperationNotFound(operation_id);
        }
        Rows rows;
        for (const pqxx::row& row : r) {
          HostProgress p;
          p.host_id = row[0].c_str();
          p.state = static_cast<v1::HostTaskState>(row[1].as<int>());
          p.bytes_done = row[2].as<int64_t>();
          p.bytes_total = row[3].as<int64_t>();
          p.error = row[4].c_str();
          p.progress_unix_ms = row[5].as<int64_t>();
          p.waiting_on = row[6].c_str();
          p.route = row[7].c_str();
          p.route_reason = row[8].c_str();
          rows.push_back(std::move(p));
        }
        return rows;
      });
}

absl::Status PgStore::CommitOperation(const std::string& operation_id) {
  return pool_->Transact("CommitOperation", [&](pg::PgTx& tx) -> absl::Status {
    absl::StatusOr<LockedOperation> op = LockOperation(tx, operation_id);
    if (!op.ok()) return op.status();
    // TRANSFERRING or PREPARED_TRANSFER -> COMMITTED.
    if (absl::Status s = pg::CheckMove(tx, operation_id, OpPhase::kCommitted); !s.ok()) return s;
    const pqxx::result job = tx.Exec(pg::kLockJob, op->job_id);
    if (job.empty()) return pg::JobNotFound(op->job_id);
    tx.Exec(pg::kRetireCurrentGeneration, op->job_id);
    if (tx.Exec(pg::kPromotePendingGeneration, op->job_id, op->to_generation).empty()) {
      return absl::InternalError(absl::StrCat("operation \"", operation_id, "\": job \"",
                                              op->job_id, "\" has no pending generation ",
                                              op->to_generation));
    }
    tx.Exec(pg::kClearJobLostHosts, op->job_id);
    tx.Exec(pg::kAdvanceJob, op->job_id, op->to_generation);
    tx.Exec(pg::kBumpLayoutEpoch, op->job_id, operation_id);
    // The dataset state travels with the model state (docs/data.md).
    pg::CarryDatasetState(tx, op->job_id, job[0][0].as<int64_t>(), op->to_generation);
    tx.Exec(pg::kApplyOperationStep, operation_id);
    tx.Exec(pg::kFinishCommittedOperation, operation_id);
    // A stop-free operation whose cut-over this was goes on (pg_stop_free.cc).
    tx.Exec(pg::kKeepReconfiguring, op->job_id);
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<std::string>> PgStore::AssignedOperations(const std::string& host_id) {
  using Ids = std::vector<std::string>;
  return pg::TransactFor<Ids>(*pool_, "AssignedOperations", [&](pg::PgTx& tx) {
    Ids ids;
    for (const pqxx::row& row : tx.Exec(pg::kAssignedOperations, host_id)) {
      ids.emplace_back(row[0].c_str());
    }
    return absl::StatusOr<Ids>(std::move(ids));
  });
}

}  // namespace reshard::coordinator
