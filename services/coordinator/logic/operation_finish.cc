// FinishOperation (operation_finish.h).
#include "services/coordinator/logic/operation_finish.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/rpc/enum_name.h"
#include "services/coordinator/logic/cost_estimates.h"
#include "services/coordinator/logic/error_text.h"
#include "services/coordinator/logic/operation_states.h"

namespace reshard::coordinator {

absl::Status FinishOperation(Store& store, CoordinatorMetrics* metrics, const v1::Operation& op,
                             const OperationEnding& ending, int64_t now_unix_ms,
                             cost::CostModel* cost) {
  const OpPhase from = PhaseOf(op);
  OpPhase to_phase;
  if (!NextPhase(from, ending.event, &to_phase) || !IsTerminal(to_phase)) {
    return absl::FailedPreconditionError(
        absl::StrCat("operation \"", op.id(), "\" is ", PhaseName(from), ": the operation state ",
                     "machine does not end it by \"", EventName(ending.event), "\""));
  }
  const v1::OperationState to = StoredState(to_phase);
  absl::Status moved;
  if (to == v1::OPERATION_STATE_COMMITTED) {
    moved = store.CommitOperation(op.id());
  } else {
    OperationUpdate update;
    update.error = TruncateError(ending.error);
    update.idempotency = ending.idempotency;
    moved = store.TransitionOperation(op.id(), op.state(), to, update);
  }
  if (!moved.ok()) return moved;
  if (to == v1::OPERATION_STATE_COMMITTED) {
    RESHARD_LOG(INFO) << "job=" << op.job_id() << " operation=" << op.id() << " "
                      << rpc::EnumShortName(op.state()) << " -> COMMITTED: generation "
                      << op.to_generation() << " is current";
  } else if (ending.event == OpEvent::kCancelled) {
    RESHARD_LOG(INFO) << "job=" << op.job_id() << " operation=" << op.id() << " "
                      << rpc::EnumShortName(op.state()) << " -> " << rpc::EnumShortName(to) << ": "
                      << ending.error;
  } else {
    RESHARD_LOG(WARNING) << "job=" << op.job_id() << " operation=" << op.id() << " "
                         << rpc::EnumShortName(op.state()) << " -> " << rpc::EnumShortName(to)
                         << ": " << ending.error;
  }
  if (metrics != nullptr) {
    metrics->OperationFinished(op.kind(), to, SecondsSince(op.created_unix_ms(), now_unix_ms));
  }
  if (cost != nullptr) {
    // As GetOperation reports it (actual_seconds by the store's clock).
    absl::StatusOr<OperationRecord> ended = store.GetOperation(op.id(), /*include_plan=*/false);
    if (ended.ok()) {
      LearnFromEnd(*cost, metrics, ended->op);
      if (ended->op.has_prediction() && ended->op.actual_seconds() > 0) {
        RESHARD_LOG(INFO) << "job=" << op.job_id() << " operation=" << op.id() << " took "
                          << ended->op.actual_seconds() << " s from planned, predicted "
                          << ended->op.prediction().seconds() << " s";
      }
    }
  }
  if (to == v1::OPERATION_STATE_COMMITTED && op.stop_free()) {
    // As GetOperation reports them (the store's clock): the preparation
    // while the old layout trained, and the pause from the cut-over.
    absl::StatusOr<OperationRecord> done = store.GetOperation(op.id(), /*include_plan=*/false);
    if (done.ok()) {
      RESHARD_LOG(INFO) << "job=" << op.job_id() << " operation=" << op.id()
                        << " stop-free: prepared in " << done->op.prepare_seconds()
                        << " s while the old layout trained; paused " << done->op.pause_seconds()
                        << " s from the cut-over to the commit";
      if (metrics != nullptr) {
        metrics->StopFreeCommitted(done->op.prepare_seconds(), done->op.pause_seconds());
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace reshard::coordinator
