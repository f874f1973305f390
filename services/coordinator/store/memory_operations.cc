// MemoryStore: creating operations (reading what the rules of
// operation_create.h need and writing their plan), compare-and-set moves
// through the state machine (operation_machine.h), the transfer and the
// commit (as pg_operations.cc, pg_meeting.cc, pg_transfer.cc).
#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "services/coordinator/store/memory_store.h"
#include "services/coordinator/store/memory_store_internal.h"
#include "services/coordinator/store/operation_create.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {
namespace {

bool FinalTaskState(v1::HostTaskState s) {
  return s == v1::HOST_TASK_STATE_DONE || s == v1::HOST_TASK_STATE_FAILED ||
         s == v1::HOST_TASK_STATE_PREPARED;
}

}  // namespace

absl::Status MemoryStore::CheckMove(const Operation& op, OpPhase to) const {
  return CheckMoveFrom(op.row.id(), FactsOf(op.row), to);
}

absl::StatusOr<CreationSnapshot> MemoryStore::ReadCreation(const NewOperation& op,
                                                           const Job& job) const {
  CreationSnapshot s;
  if (!op.idempotency.key.empty()) {
    absl::StatusOr<std::optional<std::string>> first = FindKey(op.idempotency);
    if (!first.ok()) return first.status();
    s.replayed = *first;
    if (s.replayed.has_value()) return s;
  }
  s.generation = job.row.generation();
  for (const Operation* a : ActiveOperationsOfJob(op.job_id)) {
    ActiveOperation x;
    x.id = a->row.id();
    x.state = a->row.state();
    x.kind = a->row.kind();
    x.stop_free = a->row.stop_free();
    x.step_boundary = a->row.step_boundary();
    x.queued_behind = a->row.queued_behind_operation_id();
    x.step_boundary_checkpoint_id = a->row.step_boundary_checkpoint_id();
    x.to_generation = a->row.to_generation();
    s.active.push_back(std::move(x));
  }
  s.max_generation = MaxGeneration(job);
  auto target = operations_.find(op.cut_over_operation_id);
  if (!op.cut_over_operation_id.empty() && target != operations_.end() &&
      target->second.row.job_id() == op.job_id) {
    const v1::Operation& o = target->second.row;
    CutOverTarget& t = s.cut_over.emplace();
    t.state = o.state();
    t.stop_free = o.stop_free();
    t.prepared = o.prepared_unix_ms() != 0;
    t.cutover_operation_id = o.cutover_operation_id();
    t.workers_prepared = o.workers_prepared_unix_ms() != 0;
    t.agents_prepared = o.agents_prepared_unix_ms() != 0;
    t.prepared_from_generation = o.prepared_from_generation();
    t.to_generation = o.to_generation();
    for (const auto& [host, row] : target->second.hosts) {
      if (row.progress.state != v1::HOST_TASK_STATE_PREPARED) t.hosts_not_prepared.push_back(host);
    }
  }
  if (op.step.has_value()) {
    auto committed = job.dataset_states.find(s.generation);
    if (committed != job.dataset_states.end()) s.committed = committed->second;
  }
  return s;
}

MemoryStore::Operation& MemoryStore::WriteCreation(const NewOperation& op, const CreationPlan& plan,
                                                   Job& job) {
  if (plan.abort_checkpoint.has_value()) {
    Operation& checkpoint = operations_.at(plan.abort_checkpoint->operation_id);
    checkpoint.row.set_state(v1::OPERATION_STATE_ABORTED);
    checkpoint.row.set_error(plan.abort_checkpoint->error);
    checkpoint.finished_unix_ms = Now();
    TouchOperation(checkpoint);
    DiscardPendingGeneration(job, plan.abort_checkpoint->to_generation);
  }
  const int64_t now = Now();
  Operation& created = operations_[op.operation_id];
  created.seq = ++next_seq_;
  operation_seq_[created.seq] = op.operation_id;
  v1::Operation& row = created.row;
  row.set_id(op.operation_id);
  row.set_job_id(op.job_id);
  row.set_kind(op.kind);
  row.set_state(v1::OPERATION_STATE_PENDING);
  row.set_from_generation(plan.row.from_generation);
  row.set_to_generation(plan.row.to_generation);
  *row.mutable_target_layout() = op.target_layout;
  row.set_idempotency_key(op.idempotency.key);
  row.set_created_unix_ms(now);
  row.set_queued_behind_operation_id(plan.row.queued_behind);
  row.set_step_boundary(plan.row.step_boundary);
  row.set_step_boundary_deadline_unix_ms(plan.row.step_boundary_deadline_unix_ms);
  row.set_stop_free(op.stop_free);
  if (op.deadline.unix_ms() > 0) *row.mutable_deadline() = op.deadline;
  created.step_boundary_timeout_ms = plan.row.step_boundary_timeout_ms;
  created.lost_hosts = op.lost_hosts;
  created.lost_ranks = op.lost_ranks;
  if (op.step.has_value()) {
    created.step = op.step->step;
    created.step_cursor = op.step->cursor;
  }
  TouchOperation(created);
  if (!op.idempotency.key.empty()) ClaimKey(op.idempotency, op.operation_id, op.job_id);
  if (plan.cut_over.has_value()) {
    Operation& target = operations_.at(plan.cut_over->operation_id);
    target.row.set_from_generation(plan.cut_over->from_generation);
    target.row.set_to_generation(plan.cut_over->to_generation);
    target.row.set_cutover_unix_ms(now);
    target.row.set_cutover_operation_id(plan.cut_over->checkpoint_id);
    TouchOperation(target);
  }
  if (plan.boundary_checkpoint.has_value()) {
    const BoundaryCheckpointWrite& w = *plan.boundary_checkpoint;
    Operation& waiting = operations_.at(w.operation_id);
    waiting.row.set_step_boundary(w.step_boundary);
    waiting.row.set_step_boundary_checkpoint_id(w.checkpoint_id);
    waiting.row.set_queued_behind_operation_id(w.checkpoint_id);
    waiting.row.set_to_generation(w.to_generation);
    waiting.row.set_step_boundary_deadline_unix_ms(w.step_boundary_deadline_unix_ms);
    waiting.row.set_cutover_operation_id(w.checkpoint_id);
    waiting.row.set_cutover_unix_ms(now);
    TouchOperation(waiting);
  }
  job.row.set_state(plan.job_state);
  TouchJob(job);
  return created;
}

// The rules are PlanCreation's (operation_create.h); this reads the job and
// writes the plan.
absl::StatusOr<v1::Operation> MemoryStore::CreateOperation(const NewOperation& op) {
  if (absl::Status s = CheckNewOperation(op); !s.ok()) return s;
  std::lock_guard<CallLock> l(mu_);
  Tx tx;
  Job* job = FindJob(op.job_id);
  if (job == nullptr) return mem::JobNotFound(op.job_id);
  absl::StatusOr<CreationSnapshot> snapshot = ReadCreation(op, *job);
  if (!snapshot.ok()) return snapshot.status();
  absl::StatusOr<CreationPlan> plan = PlanCreation(op, *snapshot);
  if (!plan.ok()) return plan.status();
  if (plan->action != CreationPlan::Action::kCreate) {
    const Operation* existing = FindOperation(plan->existing);
    if (existing == nullptr) return mem::OperationNotFound(plan->existing);
    WriteAudit(tx, op.job_id, plan->existing);
    Commit(tx);
    v1::Operation answer = OperationView(*existing, false).op;
    if (plan->action == CreationPlan::Action::kFold) answer.set_checkpoint_folded(true);
    return answer;
  }
  // PostgreSQL's primary key.
  if (operations_.count(op.operation_id) > 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("operation \"", op.operation_id, "\" already exists"));
  }
  // Checks done: from here on the call changes things.
  const Operation& created = WriteCreation(op, *plan, *job);
  WriteAudit(tx, op.job_id, op.operation_id);
  Commit(tx);
  return OperationView(created, false).op;
}

absl::StatusOr<OperationRecord> MemoryStore::GetOperation(const std::string& operation_id,
                                                          bool include_plan) {
  std::lock_guard<CallLock> l(mu_);
  const Operation* op = FindOperation(operation_id);
  if (op == nullptr) return mem::OperationNotFound(operation_id);
  return OperationView(*op, include_plan);
}

absl::StatusOr<bool> MemoryStore::ReleaseQueuedOperation(const std::string& operation_id,
                                                         int64_t now_unix_ms) {
  std::lock_guard<CallLock> l(mu_);
  Operation* op = FindOperation(operation_id);
  if (op == nullptr) return mem::OperationNotFound(operation_id);
  Job* job = FindJob(op->row.job_id());
  if (job == nullptr) return mem::JobNotFound(op->row.job_id());
  if (PhaseOf(op->row) != OpPhase::kQueued) {
    return absl::AbortedError(
        absl::StrCat("operation \"", operation_id, "\" is not a queued PENDING operation"));
  }
  const std::string behind = op->row.queued_behind_operation_id();
  const Operation* checkpoint = FindOperation(behind);
  const v1::OperationState state =
      checkpoint == nullptr ? v1::OPERATION_STATE_UNSPECIFIED : checkpoint->row.state();
  if (IsActiveState(state)) return false;
  const int64_t next = MaxGeneration(*job) + 1;
  v1::StepBoundary boundary = op->row.step_boundary();
  int64_t deadline = 0;
  if (boundary == v1::STEP_BOUNDARY_WAITING) {
    deadline = now_unix_ms + op->step_boundary_timeout_ms;
  } else if (boundary == v1::STEP_BOUNDARY_CHECKPOINTING &&
             behind == op->row.step_boundary_checkpoint_id()) {
    boundary = state == v1::OPERATION_STATE_COMMITTED ? v1::STEP_BOUNDARY_REACHED
                                                      : v1::STEP_BOUNDARY_CHECKPOINT_ENDED;
  }
  op->row.clear_queued_behind_operation_id();
  op->row.set_from_generation(job->row.generation());
  op->row.set_to_generation(op->row.stop_free() ? next + 1 : next);
  op->row.set_step_boundary(boundary);
  op->row.set_step_boundary_deadline_unix_ms(deadline);
  TouchOperation(*op);
  TouchJobOf(*op);
  return true;
}

absl::StatusOr<bool> MemoryStore::EndStepBoundaryWait(const std::string& operation_id) {
  std::lock_guard<CallLock> l(mu_);
  Operation* op = FindOperation(operation_id);
  if (op == nullptr || PhaseOf(op->row) != OpPhase::kAtStepBoundary) return false;
  op->row.set_step_boundary(v1::STEP_BOUNDARY_TIMED_OUT);
  TouchOperation(*op);
  TouchJobOf(*op);
  return true;
}

absl::StatusOr<std::vector<std::string>> MemoryStore::ListActiveOperations() {
  std::lock_guard<CallLock> l(mu_);
  std::vector<std::string> ids;
  for (const auto& [seq, id] : operation_seq_) {
    if (IsActiveState(operations_.at(id).row.state())) ids.push_back(id);
  }
  return ids;
}

void MemoryStore::EndOperation(Operation& op, v1::OperationState to,
                               const OperationUpdate& update) {
  op.row.set_state(to);
  if (update.plan != nullptr) {
    op.plan = *update.plan;
    op.row.set_planned_unix_ms(Now());
  }
  if (update.stats.has_value()) *op.row.mutable_stats() = *update.stats;
  if (update.prediction.has_value()) *op.row.mutable_prediction() = *update.prediction;
  if (update.error.has_value()) op.row.set_error(mem::TruncateError(*update.error));
  if (update.bytes_total.has_value()) op.row.set_bytes_total(*update.bytes_total);
  if (IsTerminalState(to)) op.finished_unix_ms = Now();
  TouchOperation(op);
}

absl::Status MemoryStore::TransitionOperation(const std::string& operation_id,
                                              v1::OperationState from, v1::OperationState to,
                                              const OperationUpdate& update) {
  if (absl::Status s = CheckTransitionArgs(operation_id, from, to, update); !s.ok()) return s;
  std::lock_guard<CallLock> l(mu_);
  Operation* op = FindOperation(operation_id);
  if (op == nullptr) return mem::OperationNotFound(operation_id);
  if (op->row.state() != from) {
    return OperationNotIn(operation_id, op->row.state(), from, absl::StatusCode::kAborted);
  }
  const std::string job_id = op->row.job_id();
  if (!update.idempotency.key.empty() &&
      keys_.count({update.idempotency.tenants, update.idempotency.key}) > 0) {
    return KeyTakenConcurrently(update.idempotency);
  }
  EndOperation(*op, to, update);
  TouchJobOf(*op);
  Job* job = FindJob(job_id);
  if (IsTerminalState(to) && job != nullptr) {
    DiscardPendingGeneration(*job, op->row.to_generation());
    SettleJobState(*job);
    KeepReconfiguring(*job);
  }
  if (!update.idempotency.key.empty()) ClaimKey(update.idempotency, operation_id, job_id);
  Tx tx;
  WriteAudit(tx, job_id, operation_id);
  Commit(tx);
  return absl::OkStatus();
}

absl::Status MemoryStore::StartTransfer(const std::string& operation_id,
                                        const std::vector<HostProgress>& hosts) {
  if (absl::Status s = CheckHostRows(operation_id, hosts, /*check_states=*/true); !s.ok()) {
    return s;
  }
  {
    std::lock_guard<CallLock> l(mu_);
    Operation* op = FindOperation(operation_id);
    if (op == nullptr) return mem::OperationNotFound(operation_id);
    // PLANNED (stop-the-world) or LEGACY_CUTTING_OVER -> TRANSFERRING.
    if (absl::Status s = CheckMove(*op, OpPhase::kTransferring); !s.ok()) return s;
    if (absl::Status s = InsertPendingGeneration(*op); !s.ok()) return s;
    for (const HostProgress& h : hosts) {
      HostRow& row = op->hosts[h.host_id];
      row.progress = h;
      row.progress.error = mem::TruncateError(h.error);
      row.progress.waiting_on.clear();
    }
    op->row.set_state(v1::OPERATION_STATE_TRANSFERRING);
    TouchOperation(*op);
    TouchJobOf(*op);
  }
  TellTasks(mem::HostIds(hosts));
  return absl::OkStatus();
}

absl::Status MemoryStore::RecordHostProgress(const std::string& operation_id,
                                             const HostProgress& progress,
                                             const std::vector<v1::ShardChecksum>& checksums) {
  if (absl::Status s = CheckTaskState(progress.host_id, progress.state); !s.ok()) return s;
  std::map<int, std::vector<v1::ShardChecksum>> by_rank;
  for (const v1::ShardChecksum& c : checksums) by_rank[c.rank()].push_back(c);
  std::lock_guard<CallLock> l(mu_);
  Operation* op = FindOperation(operation_id);
  if (op == nullptr) return mem::OperationNotFound(operation_id);
  absl::StatusOr<bool> of_prepare =
      ProgressOfPrepare(operation_id, op->row.state(), progress.state);
  if (!of_prepare.ok()) return of_prepare.status();
  const bool preparing = *of_prepare;
  auto row = op->hosts.find(progress.host_id);
  if (row == op->hosts.end()) return HostNotInOperation(operation_id, progress.host_id);
  Job* job = FindJob(op->row.job_id());
  Generation* generation = nullptr;
  if (job != nullptr) {
    auto g = job->generations.find(op->row.to_generation());
    if (g != job->generations.end()) generation = &g->second;
  }
  if (!by_rank.empty()) {
    size_t exist = 0;
    for (const auto& [rank, list] : by_rank) {
      if (generation != nullptr && rank >= 0 &&
          rank < static_cast<int>(generation->rank_hosts.size())) {
        ++exist;
      }
    }
    if (exist != by_rank.size()) {
      return ChecksumRanksMissing(progress.host_id, by_rank.size(), exist, op->row.to_generation(),
                                  op->row.job_id());
    }
  }
  HostProgress& p = row->second.progress;
  const bool moved = p.state != progress.state || p.bytes_done != progress.bytes_done;
  if (!(FinalTaskState(p.state) && !FinalTaskState(progress.state))) p.state = progress.state;
  p.bytes_done = progress.bytes_done;
  if (progress.bytes_total > 0) p.bytes_total = progress.bytes_total;
  p.error = mem::TruncateError(progress.error);
  if (moved) p.progress_unix_ms = progress.progress_unix_ms;
  p.waiting_on = mem::TruncateError(progress.waiting_on);
  if (!progress.route.empty()) {
    p.route = mem::TruncateError(progress.route);
    p.route_reason = mem::TruncateError(progress.route_reason);
  }
  for (auto& [rank, list] : by_rank) generation->checksums[rank] = std::move(list);
  if (!preparing) {
    int64_t done = 0;
    for (const auto& [host, r] : op->hosts) done += r.progress.bytes_done;
    op->row.set_bytes_done(done);
    TouchOperation(*op);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<HostProgress>> MemoryStore::GetHostProgress(
    const std::string& operation_id) {
  std::lock_guard<CallLock> l(mu_);
  const Operation* op = FindOperation(operation_id);
  if (op == nullptr) return mem::OperationNotFound(operation_id);
  std::vector<HostProgress> rows;
  for (const auto& [host, row] : op->hosts) rows.push_back(row.progress);
  return rows;
}

absl::Status MemoryStore::CommitOperation(const std::string& operation_id) {
  std::lock_guard<CallLock> l(mu_);
  Operation* op = FindOperation(operation_id);
  if (op == nullptr) return mem::OperationNotFound(operation_id);
  // TRANSFERRING or PREPARED_TRANSFER -> COMMITTED.
  if (absl::Status s = CheckMove(*op, OpPhase::kCommitted); !s.ok()) return s;
  Job* job = FindJob(op->row.job_id());
  if (job == nullptr) return mem::JobNotFound(op->row.job_id());
  const int64_t to = op->row.to_generation();
  auto pending = job->generations.find(to);
  if (pending == job->generations.end() || pending->second.state != GenerationState::kPending) {
    return absl::InternalError(absl::StrCat("operation \"", operation_id, "\": job \"",
                                            op->row.job_id(), "\" has no pending generation ",
                                            to));
  }
  const int64_t now = Now();
  const int64_t from = job->row.generation();
  for (auto& [n, g] : job->generations) {
    if (g.state == GenerationState::kCurrent) g.state = GenerationState::kRetired;
  }
  pending->second.state = GenerationState::kCurrent;
  pending->second.committed_unix_ms = now;
  job->lost_hosts.clear();
  job->row.set_generation(to);
  bool lost = false;
  for (const std::string& h : pending->second.rank_hosts) lost = lost || HostLost(h);
  job->row.set_state(lost ? v1::JOB_STATE_DEGRADED : v1::JOB_STATE_ACTIVE);
  if (op->row.kind() != v1::OPERATION_KIND_CHECKPOINT) {
    job->row.set_layout_epoch(job->row.layout_epoch() + 1);
  }
  // The dataset state travels with the model state (docs/data.md).
  auto carried = job->dataset_states.find(from);
  if (carried != job->dataset_states.end() && job->dataset_states.count(to) == 0) {
    job->dataset_states[to] = carried->second;
  }
  auto d = job->dataset_states.find(to);
  if (op->step.has_value() && d != job->dataset_states.end()) {
    d->second.set_cursor(op->step_cursor.value_or(0));
    d->second.set_step(*op->step);
    d->second.set_committed_generation(to);
    d->second.set_committed_unix_ms(now);
  }
  op->row.set_state(v1::OPERATION_STATE_COMMITTED);
  op->finished_unix_ms = now;
  TouchOperation(*op);
  TouchJob(*job);
  KeepReconfiguring(*job);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> MemoryStore::AssignedOperations(
    const std::string& host_id) {
  std::lock_guard<CallLock> l(mu_);
  std::vector<std::string> ids;
  for (const auto& [seq, id] : operation_seq_) {
    const Operation& op = operations_.at(id);
    auto row = op.hosts.find(host_id);
    if (row == op.hosts.end()) continue;
    const v1::HostTaskState s = row->second.progress.state;
    const bool transferring = op.row.state() == v1::OPERATION_STATE_TRANSFERRING &&
                              s != v1::HOST_TASK_STATE_DONE && s != v1::HOST_TASK_STATE_FAILED;
    const bool preparing = InAgentsPrepare(PhaseOf(op.row)) &&
                           (s == v1::HOST_TASK_STATE_ASSIGNED || s == v1::HOST_TASK_STATE_RUNNING);
    if (transferring || preparing) ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<std::vector<v1::Operation>> MemoryStore::ListOperationsForJob(
    const std::string& job_id) {
  std::lock_guard<CallLock> l(mu_);
  if (FindJob(job_id) == nullptr) return mem::JobNotFound(job_id);
  std::vector<v1::Operation> ops;
  const std::vector<const Operation*> all = OperationsOfJob(job_id);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    ops.push_back(OperationView(**it, false).op);
  }
  return ops;
}

void MemoryStore::DeleteOperation(const std::string& operation_id) {
  auto it = operations_.find(operation_id);
  if (it == operations_.end()) return;
  operation_seq_.erase(it->second.seq);
  operations_.erase(it);
}

}  // namespace reshard::coordinator
