// Small facts about operation states shared by the scheduler API, the agent
// API and the driver, read from the one state machine
// (store/operation_machine.h: phases, transitions, names). Pure.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "reshard/v1/coordinator.pb.h"
#include "services/coordinator/store/operation_machine.h"

namespace reshard::coordinator {

/// COMMITTED, ABORTED and FAILED: nothing moves an operation out of them.
inline bool IsFinal(v1::OperationState state) { return IsTerminalState(state); }

/// A stop-free operation whose agents prepare (docs/coordinator.md, "Agents
/// prepare"): PREPARING, PREPARED or CUTTING_OVER, until its transfer starts.
inline bool InPreparePhase(const v1::Operation& op) { return InAgentsPrepare(PhaseOf(op)); }

/// The transfer of a stop-free operation whose agents prepared it.
inline bool IsPreparedTransfer(const v1::Operation& op) {
  return PhaseOf(op) == OpPhase::kPreparedTransfer;
}

/// Agents hold a task of it: its prepare (InPreparePhase) or its transfer.
inline bool AgentsHaveTasks(const v1::Operation& op) {
  const OpPhase phase = PhaseOf(op);
  return InAgentsPrepare(phase) || StoredState(phase) == v1::OPERATION_STATE_TRANSFERRING;
}

/// Seconds from `start_unix_ms` to `now_unix_ms`, never negative (the store's
/// timestamps and the injected clock may disagree slightly).
inline double SecondsSince(int64_t start_unix_ms, int64_t now_unix_ms) {
  return std::max<int64_t>(0, now_unix_ms - start_unix_ms) / 1000.0;
}

}  // namespace reshard::coordinator
