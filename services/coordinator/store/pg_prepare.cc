// PgStore: the agents' prepare of a stop-free operation (docs/coordinator.md,
// "Agents prepare"): its start, each host's PREPARED report with the
// checksums of the sources it read, and the transfer that follows the
// cut-over without the steps whose sources did not change.
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/rpc/enum_name.h"
#include "services/coordinator/store/pg_codec.h"
#include "services/coordinator/store/pg_prepare_statements.h"
#include "services/coordinator/store/pg_statements.h"
#include "services/coordinator/store/pg_store.h"
#include "services/coordinator/store/pg_store_internal.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {
namespace {

// Why the operation is not where a prepare step expects it.
absl::Status NotPreparing(pg::PgTx& tx, const std::string& operation_id, const char* expected) {
  const pqxx::result now = tx.Exec(pg::kOperationState, operation_id);
  if (now.empty()) return pg::OperationNotFound(operation_id);
  return absl::AbortedError(
      absl::StrCat("operation \"", operation_id, "\" is ",
                   rpc::EnumShortName(static_cast<v1::OperationState>(now[0][0].as<int>())),
                   ", not ", expected));
}

}  // namespace

absl::Status PgStore::StartPrepare(const std::string& operation_id, int64_t from_generation,
                                   const std::vector<HostProgress>& hosts) {
  if (absl::Status s = CheckHostRows(operation_id, hosts, /*check_states=*/false); !s.ok()) {
    return s;
  }
  std::vector<std::string> host_ids, errors;
  std::vector<int64_t> states, done, total, progress;
  for (const HostProgress& h : hosts) {
    host_ids.push_back(h.host_id);
    states.push_back(v1::HOST_TASK_STATE_ASSIGNED);
    done.push_back(0);
    total.push_back(h.bytes_total);
    progress.push_back(h.progress_unix_ms);
    errors.emplace_back();
  }
  return TasksChanged(pool_->Transact("StartPrepare", [&](pg::PgTx& tx) -> absl::Status {
    const pqxx::result r = tx.Exec(pg::kStartPrepare, operation_id, from_generation);
    if (r.empty()) {
      return NotPreparing(tx, operation_id, "a stop-free operation in PLANNED to prepare");
    }
    const std::string job_id = r[0][0].c_str();
    const int64_t to_generation = r[0][1].as<int64_t>();
    const pqxx::binarystring layout_bytes(r[0][2]);
    v1::Layout target;
    if (!target.ParseFromArray(layout_bytes.data(), static_cast<int>(layout_bytes.size()))) {
      return absl::InternalError(
          absl::StrCat("stored target layout of operation \"", operation_id, "\" does not parse"));
    }
    absl::StatusOr<pg::GenerationRows> rows = pg::ToGenerationRows(target, "target");
    if (!rows.ok()) return rows.status();
    // Pending from now on: an abort discards it on every host of its ranks.
    pg::InsertGeneration(tx, job_id, to_generation, layout_bytes.str(), *rows,
                         GenerationState::kPending, operation_id);
    tx.Exec(pg::kInsertOperationHosts, operation_id, pg::TextArray(host_ids), pg::IntArray(states),
            pg::IntArray(done), pg::IntArray(total), pg::TextArray(errors), pg::IntArray(progress));
    tx.Exec(pg::kSetAgentsPrepared, operation_id);  // only when there is no host
    tx.Exec(pg::kSettlePrepared, operation_id);
    NotifyTasks(tx, host_ids);
    return absl::OkStatus();
  }), host_ids);
}

absl::Status PgStore::RecordHostPrepared(const std::string& operation_id,
                                         const std::string& host_id, int64_t now_unix_ms,
                                         const std::vector<v1::ShardChecksum>& sources) {
  std::vector<int64_t> items, ranks, sums, bytes;
  for (const v1::ShardChecksum& c : sources) {
    items.push_back(c.item());
    ranks.push_back(c.rank());
    sums.push_back(static_cast<int64_t>(c.checksum()));  // bit for bit
    bytes.push_back(c.bytes());
  }
  return pool_->Transact("RecordHostPrepared", [&](pg::PgTx& tx) -> absl::Status {
    const pqxx::result op = tx.Exec(pg::kLockOperation, operation_id);
    if (op.empty()) return pg::OperationNotFound(operation_id);
    const auto state = static_cast<v1::OperationState>(op[0][1].as<int>());
    if (absl::Status s = CheckPreparePhase(operation_id, state); !s.ok()) return s;
    // Matches the rows RecordsPrepared takes.
    const pqxx::result r = tx.Exec(pg::kPrepareHost, operation_id, host_id, now_unix_ms);
    if (r.empty()) {
      const pqxx::result row = tx.Exec(pg::kHostTaskState, operation_id, host_id);
      std::optional<v1::HostTaskState> was;
      if (!row.empty()) was = static_cast<v1::HostTaskState>(row[0][0].as<int>());
      return UnrecordedPrepared(operation_id, host_id, was);
    }
    if (!items.empty()) {
      tx.Exec(pg::kInsertPreparedSources, operation_id, host_id, pg::IntArray(items),
              pg::IntArray(ranks), pg::IntArray(sums), pg::IntArray(bytes));
    }
    tx.Exec(pg::kAddPrecopied, operation_id, r[0][0].as<int64_t>());
    tx.Exec(pg::kSetAgentsPrepared, operation_id);
    tx.Exec(pg::kSettlePrepared, operation_id);
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<v1::ShardChecksum>> PgStore::GetPreparedSources(
    const std::string& operation_id) {
  using Sums = std::vector<v1::ShardChecksum>;
  return pg::TransactFor<Sums>(*pool_, "GetPreparedSources", [&](pg::PgTx& tx) {
    Sums sums;
    for (const pqxx::row& row : tx.Exec(pg::kSelectPreparedSources, operation_id)) {
      v1::ShardChecksum c;
      c.set_item(row[0].as<int>());
      c.set_rank(row[1].as<int>());
      c.set_checksum(static_cast<uint64_t>(row[2].as<int64_t>()));
      c.set_bytes(row[3].as<int64_t>());
      sums.push_back(std::move(c));
    }
    return absl::StatusOr<Sums>(std::move(sums));
  });
}

absl::Status PgStore::StartPreparedTransfer(const std::string& operation_id,
                                            const std::vector<HostProgress>& hosts,
                                            const SkippedSteps& skipped) {
  if (absl::Status s = CheckHostRows(operation_id, hosts, /*check_states=*/false); !s.ok()) {
    return s;
  }
  std::vector<std::string> host_ids;
  std::vector<int64_t> total, progress;
  int64_t bytes_total = 0;
  for (const HostProgress& h : hosts) {
    host_ids.push_back(h.host_id);
    total.push_back(h.bytes_total);
    progress.push_back(h.progress_unix_ms);
    bytes_total += h.bytes_total;
  }
  return TasksChanged(pool_->Transact("StartPreparedTransfer", [&](pg::PgTx& tx) -> absl::Status {
    const pqxx::result op = tx.Exec(pg::kLockOperation, operation_id);
    if (op.empty()) return pg::OperationNotFound(operation_id);
    // CUTTING_OVER -> PREPARED_TRANSFER.
    if (absl::Status s = pg::CheckMove(tx, operation_id, OpPhase::kPreparedTransfer); !s.ok()) {
      return s;
    }
    const std::string job_id = op[0][0].c_str();
    const int64_t to_generation = op[0][3].as<int64_t>();
    if (tx.Exec(pg::kPendingGenerationExists, job_id, to_generation).empty()) {
      return MissingPendingGeneration(operation_id, job_id, to_generation);
    }
    const pqxx::result reset =
        tx.Exec(pg::kResetHostsForTransfer, operation_id, pg::TextArray(host_ids),
                pg::IntArray(total), pg::IntArray(progress));
    if (reset.affected_rows() != hosts.size()) {
      return HostsNotPrepared(operation_id, hosts.size(), reset.affected_rows());
    }
    tx.Exec(pg::kSetPreparedTransferring, operation_id, pg::IntArray(skipped.step_indexes),
            skipped.bytes, bytes_total);
    NotifyTasks(tx, host_ids);
    return absl::OkStatus();
  }), host_ids);
}

}  // namespace reshard::coordinator
