// Conversion between gRPC's status and absl::Status (the numeric codes
// agree). Pure; thread-safe.
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace reshard::client {

/// Same code, same message.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace reshard::client
