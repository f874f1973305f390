// What happens when a request for a new operation meets the job's active
// ones (docs/coordinator.md, "Checkpoints and operations"): create it, queue
// it behind a checkpoint, fold a checkpoint into an operation's cut-over,
// cut over, take a step-boundary checkpoint, abort a checkpoint for a
// recovery, or refuse. Pure: the store evaluates it under the job's row lock.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "reshard/v1/coordinator.pb.h"

namespace reshard::coordinator {

/// One active (PENDING, PLANNED, TRANSFERRING) operation of the job, as the
/// rule needs it; a job's are given in creation order.
struct ActiveOperation {
  std::string id;
  v1::OperationState state = v1::OPERATION_STATE_UNSPECIFIED;
  v1::OperationKind kind = v1::OPERATION_KIND_UNSPECIFIED;
  bool stop_free = false;
  v1::StepBoundary step_boundary = v1::STEP_BOUNDARY_UNSPECIFIED;
  std::string queued_behind;  // empty: not queued
  std::string step_boundary_checkpoint_id;
  int64_t to_generation = 0;
};

enum class Meeting {
  kCreate,              // nothing in the way
  kQueue,               // a reconfiguration behind the checkpoint `other`
  kAbortCheckpoint,     // a recovery: the checkpoint `other` is aborted, then kCreate
  kFold,                // a checkpoint folded into `other`'s cut-over: nothing is created
  kCutOver,             // a checkpoint naming a stop-free operation (CheckCutOver decides)
  kBoundaryCheckpoint,  // a checkpoint naming `other`, which waits for its step boundary
};

struct MeetingVerdict {
  Meeting what = Meeting::kCreate;
  std::string other;  // the active operation it concerns (empty for kCreate)
};

/// The rule. `cut_over_operation_id` is a checkpoint's
/// (CheckpointRequest.cut_over_operation_id). FailedPrecondition naming the
/// operation in the way (and why) when the request is refused.
[[nodiscard]] absl::StatusOr<MeetingVerdict> Meet(const std::string& job_id,
                                                  v1::OperationKind kind,
                                                  const std::string& cut_over_operation_id,
                                                  const std::vector<ActiveOperation>& active);

}  // namespace reshard::coordinator
