// What CoordinatorSession's calls to the coordinator share (coordinator_session.cc,
// operation_run.cc, session_pickup.cc): their deadlines. Which failures are
// retried and the backoff come from the one table (common/rpc/retry.h,
// CallKind::kAgentCall).
#pragma once

#include <chrono>

#include "grpcpp/grpcpp.h"

namespace reshard::agent::session_rpc {

inline constexpr int kRpcDeadlineMs = 5000;

inline void SetDeadline(grpc::ClientContext* ctx, int ms = kRpcDeadlineMs) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
}

}  // namespace reshard::agent::session_rpc
