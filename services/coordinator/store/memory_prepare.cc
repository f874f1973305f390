// MemoryStore: a stop-free operation's prepare (MarkPrepared, the agents'
// prepare, the transfer after the cut-over), as pg_stop_free.cc and
// pg_prepare.cc.
#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/rpc/enum_name.h"
#include "services/coordinator/store/memory_store.h"
#include "services/coordinator/store/memory_store_internal.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {

void MemoryStore::SetAgentsPrepared(Operation& op) {
  if (op.row.agents_prepared_unix_ms() > 0) return;
  for (const auto& [host, row] : op.hosts) {
    if (row.progress.state != v1::HOST_TASK_STATE_PREPARED) return;
  }
  op.row.set_agents_prepared_unix_ms(Now());
  TouchOperation(op);
}

void MemoryStore::SettlePrepared(Operation& op) {
  v1::Operation& o = op.row;
  if (o.prepared_unix_ms() > 0 || o.workers_prepared_unix_ms() == 0 ||
      o.agents_prepared_unix_ms() == 0) {
    return;
  }
  o.set_prepared_unix_ms(std::max(o.workers_prepared_unix_ms(), o.agents_prepared_unix_ms()));
  TouchOperation(op);
}

absl::StatusOr<v1::Operation> MemoryStore::MarkPrepared(const std::string& operation_id) {
  std::lock_guard<CallLock> l(mu_);
  Operation* op = FindOperation(operation_id);
  if (op == nullptr) return mem::OperationNotFound(operation_id);
  // RESHARD_SQL_OP_STOP_FREE_PLANNED, as the table spells it.
  if (!Matches(Where(v1::OPERATION_STATE_PLANNED).StopFree(Tri::kYes), FactsOf(op->row))) {
    return absl::FailedPreconditionError(
        absl::StrCat("operation \"", operation_id, "\" is ", rpc::EnumShortName(op->row.state()),
                     op->row.stop_free() ? "" : " and not stop-free",
                     ": only a stop-free operation in PLANNED can be marked prepared"));
  }
  if (op->row.workers_prepared_unix_ms() == 0) op->row.set_workers_prepared_unix_ms(Now());
  TouchOperation(*op);
  SettlePrepared(*op);
  Tx tx;
  WriteAudit(tx, op->row.job_id(), operation_id);
  Commit(tx);
  return OperationView(*op, false).op;
}

absl::Status MemoryStore::StartPrepare(const std::string& operation_id, int64_t from_generation,
                                       const std::vector<HostProgress>& hosts) {
  {
    std::lock_guard<CallLock> l(mu_);
    absl::StatusOr<Operation*> found = OperationWithRows(operation_id, hosts);
    if (!found.ok()) return found.status();
    Operation* op = *found;
    if (PhaseOf(op->row) != OpPhase::kToPrepare) {
      return absl::AbortedError(absl::StrCat("operation \"", operation_id, "\" is ",
                                             rpc::EnumShortName(op->row.state()),
                                             ", not a stop-free operation in PLANNED to prepare"));
    }
    // Pending from now on: an abort discards it on every host of its ranks.
    if (absl::Status s = InsertPendingGeneration(*op); !s.ok()) return s;
    for (const HostProgress& h : hosts) {
      HostRow& row = op->hosts[h.host_id];
      row.progress.host_id = h.host_id;
      row.progress.state = v1::HOST_TASK_STATE_ASSIGNED;
      row.progress.bytes_total = h.bytes_total;
      row.progress.progress_unix_ms = h.progress_unix_ms;
    }
    op->row.set_prepared_from_generation(from_generation);
    TouchOperation(*op);
    SetAgentsPrepared(*op);  // only when there is no host
    SettlePrepared(*op);
  }
  TellTasks(mem::HostIds(hosts));
  return absl::OkStatus();
}

absl::Status MemoryStore::RecordHostPrepared(const std::string& operation_id,
                                             const std::string& host_id, int64_t now_unix_ms,
                                             const std::vector<v1::ShardChecksum>& sources) {
  std::lock_guard<CallLock> l(mu_);
  Operation* op = FindOperation(operation_id);
  if (op == nullptr) return mem::OperationNotFound(operation_id);
  if (absl::Status s = CheckPreparePhase(operation_id, op->row.state()); !s.ok()) return s;
  auto row = op->hosts.find(host_id);
  if (row == op->hosts.end()) return UnrecordedPrepared(operation_id, host_id, std::nullopt);
  HostProgress& p = row->second.progress;
  if (!RecordsPrepared(p.state)) return UnrecordedPrepared(operation_id, host_id, p.state);
  p.state = v1::HOST_TASK_STATE_PREPARED;
  p.bytes_done = p.bytes_total;
  p.error.clear();
  p.waiting_on.clear();
  p.progress_unix_ms = now_unix_ms;
  row->second.bytes_precopied = p.bytes_total;
  for (const v1::ShardChecksum& c : sources) {
    op->prepared_sources[{c.item(), c.rank()}] = {host_id, c};
  }
  op->row.set_bytes_precopied(op->row.bytes_precopied() + p.bytes_total);
  TouchOperation(*op);
  SetAgentsPrepared(*op);
  SettlePrepared(*op);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::ShardChecksum>> MemoryStore::GetPreparedSources(
    const std::string& operation_id) {
  std::lock_guard<CallLock> l(mu_);
  std::vector<v1::ShardChecksum> sums;
  const Operation* op = FindOperation(operation_id);
  if (op == nullptr) return sums;
  for (const auto& [key, source] : op->prepared_sources) sums.push_back(source.second);
  return sums;
}

absl::Status MemoryStore::StartPreparedTransfer(const std::string& operation_id,
                                                const std::vector<HostProgress>& hosts,
                                                const SkippedSteps& skipped) {
  {
    std::lock_guard<CallLock> l(mu_);
    absl::StatusOr<Operation*> found = OperationWithRows(operation_id, hosts);
    if (!found.ok()) return found.status();
    Operation* op = *found;
    // CUTTING_OVER -> PREPARED_TRANSFER.
    if (absl::Status s = CheckMove(*op, OpPhase::kPreparedTransfer); !s.ok()) return s;
    const std::string& job_id = op->row.job_id();
    const int64_t to_generation = op->row.to_generation();
    Job* job = FindJob(job_id);
    const Generation* pending = nullptr;
    if (job != nullptr) {
      auto g = job->generations.find(to_generation);
      if (g != job->generations.end() && g->second.state == GenerationState::kPending) {
        pending = &g->second;
      }
    }
    if (pending == nullptr) {
      return MissingPendingGeneration(operation_id, job_id, to_generation);
    }
    size_t prepared = 0;
    for (const HostProgress& h : hosts) prepared += op->hosts.count(h.host_id);
    if (prepared != hosts.size()) {
      return HostsNotPrepared(operation_id, hosts.size(), prepared);
    }
    int64_t bytes_total = 0;
    for (const HostProgress& h : hosts) {
      HostProgress& p = op->hosts.at(h.host_id).progress;
      p.state = v1::HOST_TASK_STATE_ASSIGNED;
      p.bytes_done = 0;
      p.bytes_total = h.bytes_total;
      p.error.clear();
      p.waiting_on.clear();
      p.progress_unix_ms = h.progress_unix_ms;
      bytes_total += h.bytes_total;
    }
    op->row.set_state(v1::OPERATION_STATE_TRANSFERRING);
    op->skipped_steps = skipped.step_indexes;
    op->row.set_bytes_skipped_unchanged(skipped.bytes);
    op->row.set_bytes_total(bytes_total);
    op->row.set_bytes_done(0);
    TouchOperation(*op);
    TouchJobOf(*op);
  }
  TellTasks(mem::HostIds(hosts));
  return absl::OkStatus();
}

}  // namespace reshard::coordinator
