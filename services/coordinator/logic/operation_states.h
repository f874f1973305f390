// Small facts about operation states shared by the scheduler API and the
// driver. Pure.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "reshard/v1/coordinator.pb.h"

namespace reshard::coordinator {

/// COMMITTED, ABORTED and FAILED: nothing moves an operation out of them.
inline bool IsFinal(v1::OperationState state) {
  return state == v1::OPERATION_STATE_COMMITTED || state == v1::OPERATION_STATE_ABORTED ||
         state == v1::OPERATION_STATE_FAILED;
}

/// A stop-free operation whose agents prepare (docs/coordinator.md, "Agents
/// prepare"): PLANNED with its prepare started, until its transfer starts.
inline bool InPreparePhase(const v1::Operation& op) {
  return op.state() == v1::OPERATION_STATE_PLANNED && op.stop_free() &&
         op.prepared_from_generation() > 0;
}

/// The transfer of a stop-free operation whose agents prepared it.
inline bool IsPreparedTransfer(const v1::Operation& op) {
  return op.state() == v1::OPERATION_STATE_TRANSFERRING && op.stop_free() &&
         op.prepared_from_generation() > 0;
}

/// "TRANSFERRING" rather than "OPERATION_STATE_TRANSFERRING", as messages say.
inline std::string StateName(v1::OperationState state) {
  const std::string& full = v1::OperationState_Name(state);
  constexpr char kPrefix[] = "OPERATION_STATE_";
  return full.rfind(kPrefix, 0) == 0 ? full.substr(sizeof(kPrefix) - 1) : full;
}

/// "RESIZE" rather than "OPERATION_KIND_RESIZE".
inline std::string KindName(v1::OperationKind kind) {
  const std::string& full = v1::OperationKind_Name(kind);
  constexpr char kPrefix[] = "OPERATION_KIND_";
  return full.rfind(kPrefix, 0) == 0 ? full.substr(sizeof(kPrefix) - 1) : full;
}

/// Seconds from `start_unix_ms` to `now_unix_ms`, never negative (the store's
/// timestamps and the injected clock may disagree slightly).
inline double SecondsSince(int64_t start_unix_ms, int64_t now_unix_ms) {
  return std::max<int64_t>(0, now_unix_ms - start_unix_ms) / 1000.0;
}

}  // namespace reshard::coordinator
