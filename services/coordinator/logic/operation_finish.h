// The one way an operation ends (COMMITTED, ABORTED, FAILED), whoever ends
// it: the driver's steps and a client's cancel. Reads the move from the
// state machine (store/operation_machine.h), makes it with the store's
// compare-and-set, logs it and records the metrics. Thread-safe as the
// store is.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "cost/model.h"
#include "reshard/v1/coordinator.pb.h"
#include "services/coordinator/metrics/metrics.h"
#include "services/coordinator/store/operation_machine.h"
#include "services/coordinator/store/store.h"

namespace reshard::coordinator {

struct OperationEnding {
  /// kCommitted, kAborted, kCancelled or kFailed.
  OpEvent event = OpEvent::kAborted;
  /// Why (empty for kCommitted); stored truncated as the operation's error.
  std::string error;
  /// A cancel's key, claimed in the move's transaction (OperationUpdate).
  Idempotency idempotency;
};

/// Ends `op`, as read in its current state, by `ending` at `now_unix_ms`.
/// FailedPrecondition naming the phase and the event when the state machine
/// has no such move (a terminal operation, or an event that does not end
/// one); Aborted when the row moved under us (re-read and decide again);
/// the store's error otherwise. `metrics` may be null.
/// `cost` (may be null) learns from the end (cost_estimates.h).
[[nodiscard]] absl::Status FinishOperation(Store& store, CoordinatorMetrics* metrics,
                                           const v1::Operation& op, const OperationEnding& ending,
                                           int64_t now_unix_ms, cost::CostModel* cost = nullptr);

}  // namespace reshard::coordinator
