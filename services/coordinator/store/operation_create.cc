#include "services/coordinator/store/operation_create.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/enum_name.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {
namespace {

// Why a stop-free operation cannot be cut over yet (empty: it can).
std::string NotReadyForCutOver(const CutOverTarget& t) {
  if (!t.stop_free) return "it is not stop-free";
  if (t.state != v1::OPERATION_STATE_PLANNED) return "it is not PLANNED";
  if (!t.cutover_operation_id.empty()) return "it was cut over already";
  if (t.prepared) return "";
  // Not prepared: name what is missing (docs/coordinator.md, "Agents prepare").
  std::vector<std::string> missing;
  if (!t.workers_prepared) missing.push_back("its new workers are not prepared yet (MarkPrepared)");
  if (!t.agents_prepared) {
    if (t.prepared_from_generation == 0) {
      missing.push_back("its agents have not started preparing yet");
    } else {
      std::vector<std::string> hosts;
      for (const std::string& host : t.hosts_not_prepared) {
        hosts.push_back(absl::StrCat("\"", host, "\""));
      }
      missing.push_back(
          absl::StrCat("hosts not prepared yet (not PREPARED): ", absl::StrJoin(hosts, ", ")));
    }
  }
  return absl::StrJoin(missing, "; ");
}

// The new row's derived fields. Generation numbers are never reused (a
// DISCARDED one keeps its); a stop-free operation reserves the number below
// its own for its cut-over checkpoint (docs/coordinator.md, "Agents
// prepare"). A queued operation's numbers, and the start of its
// step-boundary wait, are fixed when it is released (ReleaseQueuedOperation).
NewOperationRow RowOf(const NewOperation& op, const CreationSnapshot& s, const std::string& behind,
                      int64_t reserved_generation) {
  NewOperationRow row;
  row.from_generation = s.generation;
  row.to_generation = NewOperationToGeneration(!behind.empty(), reserved_generation, op.stop_free,
                                               s.max_generation + 1);
  row.queued_behind = behind;
  row.step_boundary =
      op.at_step_boundary ? v1::STEP_BOUNDARY_WAITING : v1::STEP_BOUNDARY_UNSPECIFIED;
  row.step_boundary_timeout_ms = op.at_step_boundary ? op.step_boundary_timeout_ms : 0;
  row.step_boundary_deadline_unix_ms =
      op.at_step_boundary && behind.empty() ? op.step_boundary_deadline_unix_ms : 0;
  return row;
}

}  // namespace

std::string AbortedForRecoveryError(const NewOperation& recovery) {
  std::string lost;
  for (const std::string& host : recovery.lost_hosts) {
    absl::StrAppend(&lost, lost.empty() ? "" : ", ", "host \"", host, "\"");
  }
  for (int rank : recovery.lost_ranks) {
    absl::StrAppend(&lost, lost.empty() ? "" : ", ", "rank ", rank);
  }
  return absl::StrCat("aborted: recovery \"", recovery.operation_id, "\" replaced it (lost ", lost,
                      "); a checkpoint needs every rank of its generation");
}

absl::StatusOr<int64_t> CheckCutOver(const NewOperation& op, const CreationSnapshot& s) {
  const std::string& target = op.cut_over_operation_id;
  const std::vector<ActiveOperation>& active = s.active;
  // Active operations in creation order: the stop-free one comes first.
  if (active.empty() || target != active[0].id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cut_over_operation_id \"", target, "\": not the active operation of job \"", op.job_id,
        "\"", active.empty() ? " (it has none)" : absl::StrCat(" (\"", active[0].id, "\" is)")));
  }
  if (active.size() > 1) {
    return absl::FailedPreconditionError(absl::StrCat("cut_over_operation_id \"", target,
                                                      "\": it was cut over already (checkpoint \"",
                                                      active[1].id, "\" is running)"));
  }
  if (!s.cut_over.has_value()) {
    return absl::NotFoundError(absl::StrCat("operation \"", target, "\" not found"));
  }
  if (const std::string why = NotReadyForCutOver(*s.cut_over); !why.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("cut_over_operation_id \"", target, "\" (",
                                                      rpc::EnumShortName(s.cut_over->state),
                                                      "): ", why));
  }
  // The checkpoint takes the number the operation reserved below its own;
  // an operation created before migration 0011 reserved none (0: the next).
  const int64_t reserved = s.cut_over->to_generation - 1;
  return reserved > s.generation ? reserved : 0;
}

absl::StatusOr<CreationPlan> PlanCreation(const NewOperation& op, const CreationSnapshot& s) {
  CreationPlan plan;
  if (s.replayed.has_value()) {
    plan.action = CreationPlan::Action::kReplay;
    plan.existing = *s.replayed;
    return plan;
  }
  if (op.expected_generation <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected_generation must be positive, got ", op.expected_generation));
  }
  if (op.expected_generation != s.generation) {
    return absl::AbortedError(absl::StrCat("job \"", op.job_id, "\" is at generation ",
                                           s.generation, ", request expected ",
                                           op.expected_generation));
  }
  // What meets the job's active operations (docs/coordinator.md,
  // "Checkpoints and operations").
  absl::StatusOr<MeetingVerdict> verdict =
      Meet(op.job_id, op.kind, op.cut_over_operation_id, s.active);
  if (!verdict.ok()) return verdict.status();
  if (verdict->what == Meeting::kFold) {
    plan.action = CreationPlan::Action::kFold;
    plan.existing = verdict->other;
    return plan;
  }
  int64_t reserved_generation = 0;  // a cut-over's
  if (verdict->what == Meeting::kCutOver) {
    absl::StatusOr<int64_t> reserved = CheckCutOver(op, s);
    if (!reserved.ok()) return reserved.status();
    reserved_generation = *reserved;
  }
  if (op.step.has_value()) {
    if (absl::Status st = CheckCheckpointStep(op, s.generation,
                                              s.committed.has_value() ? &*s.committed : nullptr);
        !st.ok()) {
      return st;
    }
  }
  if (verdict->what == Meeting::kAbortCheckpoint) {
    const ActiveOperation& checkpoint = s.active.front();
    plan.abort_checkpoint = CheckpointAbort{checkpoint.id, checkpoint.state,
                                            checkpoint.to_generation,
                                            TruncateError(AbortedForRecoveryError(op))};
  }
  plan.row = RowOf(op, s, verdict->what == Meeting::kQueue ? verdict->other : std::string(),
                   reserved_generation);
  if (verdict->what == Meeting::kCutOver) {
    const int64_t checkpoint_generation = plan.row.to_generation;
    plan.cut_over =
        CutOverWrite{op.cut_over_operation_id, checkpoint_generation,
                     std::max(s.cut_over->to_generation, checkpoint_generation + 1),
                     op.operation_id};
  }
  if (verdict->what == Meeting::kBoundaryCheckpoint) {
    BoundaryCheckpointWrite w;
    w.operation_id = verdict->other;
    w.checkpoint_id = op.operation_id;
    plan.boundary_checkpoint = w;
  }
  return plan;
}

}  // namespace reshard::coordinator
