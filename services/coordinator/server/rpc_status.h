// What every gRPC handler of the coordinator shares: the conversion from
// absl::Status to grpc::Status (common/rpc's, plus the log of the server's
// own bugs), and the wrapper that times a handler and records
// reshard_coordinator_rpc_duration_seconds{method, code}.
// Thread-safe.
#pragma once

#include <chrono>
#include <exception>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/rpc/status.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"
#include "services/coordinator/metrics/metrics.h"
#include "services/coordinator/server/auth.h"
#include "services/coordinator/server/call_audit.h"

namespace reshard::coordinator {

/// rpc::ToGrpc (same code, the message cut to rpc::kMaxStatusMessageBytes);
/// INTERNAL and UNKNOWN, the coordinator's own bugs, are logged at ERROR.
grpc::Status ToGrpcStatus(const absl::Status& status);

/// Moves a successful result into the reply.
template <typename T>
absl::Status Unwrap(absl::StatusOr<T> result, T* reply) {
  if (!result.ok()) return result.status();
  *reply = *std::move(result);
  return absl::OkStatus();
}

/// Runs `body` (returning absl::Status), records its duration and code
/// under `method`, and converts the status. An exception escaping the logic
/// is a bug there; it becomes INTERNAL rather than taking the process down
/// with a request from the network.
template <typename Body>
grpc::Status RunRpc(CoordinatorMetrics* metrics, const char* method, Body&& body) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status status;
  try {
    status = body();
  } catch (const std::exception& e) {
    status = absl::InternalError(std::string(method) + ": unexpected exception: " + e.what());
  }
  if (metrics != nullptr) {
    const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
    metrics->RpcDone(method, rpc::CodeName(status.code()), seconds.count());
  }
  return ToGrpcStatus(status);
}

/// RunRpc of a handler that first passes the Authorizer: `body` gets the
/// admitted principal; a refusal is recorded like any other status, and in
/// the audit trail as the method table says (CallAudit).
/// `host_id`: the host an AgentService request speaks for, else empty.
template <typename Body>
grpc::Status RunAdmitted(const Authorizer* authorizer, const grpc::ServerContextBase* context,
                         CoordinatorMetrics* metrics, const char* method,
                         const google::protobuf::Message& request, const std::string& host_id,
                         Body&& body) {
  return RunRpc(metrics, method, [&]() -> absl::Status {
    CallAudit audit(*authorizer, method, request);
    absl::StatusOr<Principal> principal = authorizer->Authenticate(*context, method);
    if (!principal.ok()) return audit.Finish(principal.status());
    audit.SetCaller(*principal);  // a refusal below names who was refused
    if (absl::Status s = authorizer->Authorize(*principal, method, host_id); !s.ok()) {
      return audit.Finish(s);
    }
    return audit.Finish(body(*principal));
  });
}

}  // namespace reshard::coordinator
