#include "services/coordinator/store/operation_meeting.h"

#include "absl/strings/str_cat.h"
#include "common/rpc/enum_name.h"
#include "services/coordinator/store/operation_machine.h"

namespace reshard::coordinator {
namespace {

// Queued behind a checkpoint that is still active (one that ended releases
// it, whether or not the driver has done so yet).
bool QueuedNow(const ActiveOperation& op, const std::vector<ActiveOperation>& active) {
  if (op.queued_behind.empty()) return false;
  for (const ActiveOperation& other : active) {
    if (other.id == op.queued_behind) return true;
  }
  return false;
}

// Waiting for a checkpoint naming it, and free to take one now.
bool WaitsForBoundary(const ActiveOperation& op, const std::vector<ActiveOperation>& active) {
  return op.state == v1::OPERATION_STATE_PENDING &&
         op.step_boundary == v1::STEP_BOUNDARY_WAITING && !QueuedNow(op, active);
}

// The refusal every rule falls back to, as before this rule existed; `why`
// says what the active operation is doing.
absl::Status Busy(const std::string& job_id, const ActiveOperation& op, const std::string& why) {
  return absl::FailedPreconditionError(absl::StrCat("job \"", job_id, "\" has active operation \"",
                                                    op.id, "\" (", rpc::EnumShortName(op.state),
                                                    ")", why.empty() ? "" : ": ", why));
}

// Why a checkpoint cannot start beside `op` (neither folded nor queued).
std::string CheckpointBlockedBy(const ActiveOperation& op) {
  if (op.kind == v1::OPERATION_KIND_CHECKPOINT) return "one checkpoint at a time";
  if (!op.queued_behind.empty()) {
    return absl::StrCat("a stop-the-world ", rpc::EnumShortName(op.kind),
                        " is queued behind checkpoint \"", op.queued_behind, "\"");
  }
  return absl::StrCat("a stop-the-world ", rpc::EnumShortName(op.kind),
                      " moves the last committed generation; stop training");
}

}  // namespace

absl::StatusOr<MeetingVerdict> Meet(const std::string& job_id, v1::OperationKind kind,
                                    const std::string& cut_over_operation_id,
                                    const std::vector<ActiveOperation>& active) {
  if (!cut_over_operation_id.empty()) {
    for (const ActiveOperation& op : active) {
      if (op.id != cut_over_operation_id) continue;
      if (op.step_boundary == v1::STEP_BOUNDARY_UNSPECIFIED) break;  // stop-free or not at all
      if (WaitsForBoundary(op, active)) {
        return MeetingVerdict{Meeting::kBoundaryCheckpoint, op.id};
      }
      const std::string prefix = absl::StrCat("cut_over_operation_id \"", op.id, "\": ");
      if (QueuedNow(op, active) && op.step_boundary == v1::STEP_BOUNDARY_WAITING) {
        return absl::FailedPreconditionError(
            absl::StrCat(prefix, "it is queued behind checkpoint \"", op.queued_behind,
                         "\" and waits for its step boundary once that one ends "
                         "(Job.step_boundary_operation_id)"));
      }
      if (op.step_boundary == v1::STEP_BOUNDARY_CHECKPOINTING) {
        return absl::FailedPreconditionError(absl::StrCat(
            prefix, "its step-boundary checkpoint \"", op.step_boundary_checkpoint_id,
            "\" was created already"));
      }
      return absl::FailedPreconditionError(absl::StrCat(
          prefix, "it no longer waits for a step boundary (", rpc::EnumShortName(op.step_boundary),
          ", ", rpc::EnumShortName(op.state), ")"));
    }
    return MeetingVerdict{Meeting::kCutOver, cut_over_operation_id};
  }
  if (active.empty()) return MeetingVerdict{};
  const ActiveOperation& first = active.front();
  if (kind == v1::OPERATION_KIND_CHECKPOINT) {
    if (first.stop_free || WaitsForBoundary(first, active)) {
      return MeetingVerdict{Meeting::kFold, first.id};
    }
    return Busy(job_id, first, CheckpointBlockedBy(first));
  }
  // A reconfiguration: behind a lone checkpoint (a cut-over or boundary
  // checkpoint always has its operation active before it).
  if (active.size() == 1 && first.kind == v1::OPERATION_KIND_CHECKPOINT) {
    if (kind == v1::OPERATION_KIND_RECOVER) {
      return MeetingVerdict{Meeting::kAbortCheckpoint, first.id};
    }
    return MeetingVerdict{Meeting::kQueue, first.id};
  }
  return Busy(job_id, first, "");
}

}  // namespace reshard::coordinator
