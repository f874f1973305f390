// The driver's steps, one per active phase of the state machine
// (store/operation_machine.h; Advance dispatches): release a QUEUED
// operation, end an AT_STEP_BOUNDARY wait, plan a PENDING one, start a
// PLANNED one's transfer, await a stop-free one's cut-over, watch a
// TRANSFERRING one to its end. Each persists its transition
// (compare-and-set) before anything acts on it.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/rpc/enum_name.h"
#include "google/protobuf/arena.h"
#include "planner/planner.h"
#include "services/coordinator/logic/cost_estimates.h"
#include "services/coordinator/logic/operation_driver.h"
#include "services/coordinator/logic/operation_states.h"
#include "services/coordinator/logic/redundancy.h"
#include "services/coordinator/logic/task.h"

namespace reshard::coordinator {
// QUEUED: waiting for a checkpoint to end (docs/coordinator.md,
// "Checkpoints and operations").
absl::StatusOr<bool> OperationDriver::ReleaseQueued(const OperationRecord& record, int64_t now) {
  const v1::Operation& op = record.op;
  absl::StatusOr<bool> released = store_->ReleaseQueuedOperation(op.id(), now);
  if (!released.ok() || !*released) return released;
  RESHARD_LOG(INFO) << "job=" << op.job_id() << " operation=" << op.id()
                    << " released: checkpoint " << op.queued_behind_operation_id() << " ended";
  return true;
}

// AT_STEP_BOUNDARY: waiting for a checkpoint that names it, until its deadline.
absl::StatusOr<bool> OperationDriver::WaitForStepBoundary(const OperationRecord& record,
                                                          int64_t now) {
  const v1::Operation& op = record.op;
  if (now < op.step_boundary_deadline_unix_ms()) return false;
  absl::StatusOr<bool> timed_out = store_->EndStepBoundaryWait(op.id());
  if (!timed_out.ok()) return timed_out.status();
  // A checkpoint named it first: look again.
  if (!*timed_out) return absl::AbortedError("step-boundary checkpoint arrived");
  RESHARD_LOG(WARNING) << "job=" << op.job_id() << " operation=" << op.id()
                       << " no checkpoint named it by its step-boundary deadline: planned from "
                       << "generation " << op.from_generation() << ", the last committed";
  return true;
}

// PENDING: plan it.
absl::StatusOr<bool> OperationDriver::PlanOperation(const OperationRecord& record, int64_t now) {
  const v1::Operation& op = record.op;
  absl::StatusOr<v1::Job> job = store_->GetJob(op.job_id(), /*include_ptc=*/false);
  if (absl::IsNotFound(job.status())) {
    return Moved(Finish(op, v1::OPERATION_STATE_FAILED,
                        absl::StrCat("job \"", op.job_id(), "\" not found"), now));
  }
  if (!job.ok()) return job.status();
  // One operation at a time per job, so the generation cannot have moved;
  // if it did, the state is not what the operation was asked against.
  if (job->generation() != op.from_generation()) {
    return Moved(
        Finish(op, v1::OPERATION_STATE_FAILED,
               absl::StrCat("job \"", op.job_id(), "\" is at generation ", job->generation(),
                            " but the operation was created for ", op.from_generation()),
               now));
  }
  absl::StatusOr<v1::Ptc> ptc = store_->GetPtc(op.job_id());
  if (!ptc.ok()) return ptc.status();

  const planner::LostSet lost = JobLostSet(job->lost_hosts(), record.lost_hosts, record.lost_ranks);
  // A lost rank whose device the target reuses, on a host not lost, crashed
  // on a healthy host: it restarts in place and its agent's buffer of the
  // current generation stays a source (redundancy.h).
  absl::StatusOr<planner::Plan> plan =
      planner::MakePlan(*ptc, job->layout(), op.target_layout(),
                        PlannerLostSet(job->layout(), op.target_layout(), lost));
  if (!plan.ok()) {
    // Invalid targets and lost data alike end the operation: retrying the
    // same inputs gives the same answer.
    return Moved(Finish(op, v1::OPERATION_STATE_FAILED, std::string(plan.status().message()), now));
  }
  google::protobuf::Arena arena;
  OperationUpdate update;
  update.plan = planner::ToProto(*plan, job->layout(), op.target_layout(), &arena);
  update.stats = update.plan->stats();
  update.bytes_total = BytesTotal(*update.plan);
  // A checkpoint's hosts wait for the workers' publish: nothing to predict.
  if (options_.cost != nullptr && op.kind() != v1::OPERATION_KIND_CHECKPOINT) {
    update.prediction =
        PredictPlan(*options_.cost, *store_, *plan, job->layout(), op.target_layout());
  }
  const int64_t local = update.stats->bytes_local();
  const int64_t cross_host = update.stats->bytes_cross_host();
  if (absl::Status s = store_->TransitionOperation(op.id(), v1::OPERATION_STATE_PENDING,
                                                   v1::OPERATION_STATE_PLANNED, update);
      !s.ok()) {
    return s;
  }
  RESHARD_LOG(INFO) << "job=" << op.job_id() << " operation=" << op.id()
                    << " PENDING -> PLANNED: " << update.stats->steps() << " steps"
                    << (plan->replicas.count > 1
                            ? absl::StrCat(" (", plan->replicas.count, " replicas planned alone)")
                            : "")
                    << ", " << cross_host << " bytes cross-host, " << local << " local, "
                    << *update.bytes_total << " bytes to write"
                    << (update.prediction.has_value()
                            ? absl::StrCat(", predicted ", update.prediction->seconds(), " s")
                            : "");
  if (metrics_ != nullptr) metrics_->PlannedBytes(local, cross_host);
  return true;
}

// PLANNED (stop-the-world), and a LEGACY_CUTTING_OVER one whose cut-over
// committed: the transfer of the whole plan.
absl::StatusOr<bool> OperationDriver::StartTransfer(const OperationRecord& record,
                                                    HostMap& hosts, int64_t now) {
  const v1::Operation& op = record.op;
  std::string no_agent;
  absl::StatusOr<std::vector<HostProgress>> rows =
      AssignedRows(BytesWrittenByHost(*record.plan), hosts, now, &no_agent);
  if (!rows.ok()) return rows.status();
  if (!no_agent.empty()) return Moved(Finish(op, v1::OPERATION_STATE_ABORTED, no_agent, now));
  if (absl::Status s = store_->StartTransfer(op.id(), *rows); !s.ok()) return s;
  RESHARD_LOG(INFO) << "job=" << op.job_id() << " operation=" << op.id()
                    << " PLANNED -> TRANSFERRING on " << rows->size() << " hosts";
  return true;
}

// CUTTING_OVER / LEGACY_CUTTING_OVER: a stop-free operation was planned and
// prepared (workers and agents) while the old layout trained; its transfer
// starts once the cut-over checkpoint (the state of the step boundary, this
// operation's source generation) has committed (prepare_steps.cc).
absl::StatusOr<bool> OperationDriver::AwaitCutOver(const OperationRecord& record,
                                                   HostMap& hosts, int64_t now) {
  const v1::Operation& op = record.op;
  const bool agents_prepare = PhaseOf(op) == OpPhase::kCuttingOver;
  const std::string& cut_id = op.cutover_operation_id();
  absl::StatusOr<OperationRecord> cut = store_->GetOperation(cut_id, /*include_plan=*/false);
  if (!cut.ok() && !absl::IsNotFound(cut.status())) return cut.status();
  if (cut.ok() && !IsFinal(cut->op.state())) {
    return agents_prepare ? CheckPrepare(record, hosts, now) : false;
  }
  if (!cut.ok() || cut->op.state() != v1::OPERATION_STATE_COMMITTED) {
    return Moved(
        Finish(op, v1::OPERATION_STATE_ABORTED,
               cut.ok() ? absl::StrCat("cut-over checkpoint \"", cut_id, "\" ended ",
                                       rpc::EnumShortName(cut->op.state()), ": ", cut->op.error())
                        : absl::StrCat("cut-over checkpoint \"", cut_id, "\" not found"),
               now));
  }
  // An operation created before migration 0011 was not prepared by its
  // agents: its transfer moves the whole plan.
  if (agents_prepare) return StartPreparedTransfer(record, hosts, now);
  return StartTransfer(record, hosts, now);
}

absl::StatusOr<bool> OperationDriver::CheckTransfer(const OperationRecord& record,
                                                    HostMap& hosts, int64_t now) {
  const v1::Operation& op = record.op;
  absl::StatusOr<std::vector<HostProgress>> rows = store_->GetHostProgress(op.id());
  if (!rows.ok()) return rows.status();
  auto finish = [&](v1::OperationState to, const std::string& error) -> absl::StatusOr<bool> {
    return Moved(Finish(op, to, error, now));
  };
  // A failed or lost host aborts; finished work is committed even when it
  // finished late (no finished row stalls).
  absl::StatusOr<std::optional<std::string>> trouble =
      HostTrouble(*rows, hosts, now, /*preparing=*/false);
  if (!trouble.ok()) return trouble.status();
  if (trouble->has_value()) return finish(v1::OPERATION_STATE_ABORTED, **trouble);
  const bool all_done =
      !rows->empty() && std::all_of(rows->begin(), rows->end(), [](const auto& r) {
        return r.state == v1::HOST_TASK_STATE_DONE;
      });
  if (all_done) return finish(v1::OPERATION_STATE_COMMITTED, "");
  // A stop-free operation waited for its cut-over as long as the scheduler
  // chose, and a step-boundary one for its boundary checkpoint: the
  // transfer is timed from the cut-over.
  const int64_t started_ms =
      op.cutover_unix_ms() > 0 ? op.cutover_unix_ms() : op.created_unix_ms();
  const int64_t age_ms = now - started_ms;
  if (age_ms > options_.transfer_timeout_ms) {
    return finish(v1::OPERATION_STATE_ABORTED,
                  absl::StrCat("timed out: the operation is ", age_ms,
                               " ms old, over transfer_timeout_ms ", options_.transfer_timeout_ms));
  }
  return false;
}

absl::StatusOr<std::optional<std::string>> OperationDriver::HostTrouble(
    const std::vector<HostProgress>& rows, HostMap& hosts, int64_t now, bool preparing) const {
  // A finished row neither stalls nor holds the others back.
  const v1::HostTaskState finished =
      preparing ? v1::HOST_TASK_STATE_PREPARED : v1::HOST_TASK_STATE_DONE;
  for (const HostProgress& row : rows) {
    if (row.state == v1::HOST_TASK_STATE_FAILED) {
      return absl::StrCat("host \"", row.host_id, "\": ", row.error);
    }
  }
  for (const HostProgress& row : rows) {
    absl::StatusOr<std::optional<v1::HostState>> state = hosts.StateOf(row.host_id);
    if (!state.ok()) return state.status();
    if (*state != v1::HOST_STATE_ALIVE) {
      return absl::StrCat("host \"", row.host_id, "\" lost (lease expired) during ",
                          preparing ? "its prepare" : "transfer");
    }
  }
  // Stalls are judged on the whole operation: while any host's task moves,
  // one that waits (on a peer's bytes or proofs, or to be fetched by a busy
  // agent) is slow, not stalled. A host that only sends moves with its
  // peers; waits on a live peer that never answers end at the agent
  // (--peer-wait-ms), a silent peer by its lease.
  if (!judging_stalls_) return std::nullopt;
  int64_t latest_progress_ms = resumed_at_ms_;
  for (const HostProgress& row : rows) {
    latest_progress_ms = std::max(latest_progress_ms, row.progress_unix_ms);
  }
  const int64_t silent_ms = now - latest_progress_ms;
  if (silent_ms <= options_.stall_timeout_ms) return std::nullopt;
  for (const HostProgress& row : rows) {
    if (row.state == finished) continue;
    std::string what =
        row.state == v1::HOST_TASK_STATE_ASSIGNED
            ? std::string("its task was never fetched")
            : absl::StrCat("its task is at ", row.bytes_done, " of ", row.bytes_total, " bytes");
    if (!row.waiting_on.empty()) absl::StrAppend(&what, ", waiting on ", row.waiting_on);
    return absl::StrCat("host \"", row.host_id, "\" made no progress",
                        preparing ? " in its prepare" : "", " for ", silent_ms,
                        " ms, nor did any other host of the operation (stall_timeout_ms ",
                        options_.stall_timeout_ms, "): ", what);
  }
  return std::nullopt;
}

absl::StatusOr<std::vector<HostProgress>> OperationDriver::AssignedRows(
    const std::map<std::string, int64_t>& bytes, HostMap& hosts, int64_t now,
    std::string* no_agent) {
  std::vector<HostProgress> rows;
  for (const auto& [host_id, host_bytes] : bytes) {
    absl::StatusOr<std::optional<v1::HostState>> state = hosts.StateOf(host_id);
    if (!state.ok()) return state.status();
    const char* why = nullptr;
    if (!state->has_value()) {
      why = "never registered";
    } else if (**state != v1::HOST_STATE_ALIVE) {
      why = "LOST";
    }
    if (why != nullptr) {
      *no_agent = absl::StrCat("host \"", host_id, "\" has no live agent (", why, ")");
      return std::vector<HostProgress>{};
    }
    HostProgress row;
    row.host_id = host_id;
    row.state = v1::HOST_TASK_STATE_ASSIGNED;
    row.bytes_total = host_bytes;
    row.progress_unix_ms = now;
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace reshard::coordinator
