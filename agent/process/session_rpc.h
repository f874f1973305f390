// What CoordinatorSession's calls to the coordinator share (coordinator_session.cc,
// operation_run.cc): deadlines, which failures are retried, and the backoff.
#pragma once

#include <algorithm>
#include <chrono>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"

namespace reshard::agent::session_rpc {

inline constexpr int kMaxBackoffMs = 2000;
inline constexpr int kRpcDeadlineMs = 5000;

inline void SetDeadline(grpc::ClientContext* ctx, int ms = kRpcDeadlineMs) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
}

/// A call that failed so may succeed when tried again: the coordinator was
/// unreachable, slow, or shedding load.
inline bool Retryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsResourceExhausted(s);
}

/// A call the coordinator did not answer: it was unreachable, or said that
/// its store (PostgreSQL) does not answer (UNAVAILABLE), or the deadline
/// passed. Waits on the coordinator do not count such time (peer_wait.h).
inline bool CoordinatorAway(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

/// The next backoff after `ms`: doubled, at most kMaxBackoffMs.
inline int NextBackoffMs(int ms) { return std::min(ms * 2, kMaxBackoffMs); }

}  // namespace reshard::agent::session_rpc
