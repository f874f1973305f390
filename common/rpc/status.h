// How reshard carries a status across gRPC: absl::Status <-> grpc::Status
// (the numeric codes agree), the worker's fd-socket wire code, the code's
// name, and the cap on a message's length. Used by the coordinator, the
// agent and the C++ client alike; the Python SDK mirrors it in
// client/python/reshard/_rpc.py (tests/data/rpc_vectors.json ties the two).
// Pure; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace reshard::rpc {

/// Longest status message sent back, counted as gRPC encodes it (bytes
/// outside printable ASCII, and '%', take three): it travels in a trailer,
/// and peers refuse metadata past 8 KiB by default. Longer messages are cut
/// and say so.
inline constexpr size_t kMaxStatusMessageBytes = 4096;

/// `message` itself when it fits kMaxStatusMessageBytes; else its longest
/// prefix that fits (never splitting a UTF-8 sequence) plus
/// " ... (N more bytes)".
std::string CutStatusMessage(std::string message);

/// Same code, same message; OK gives absl::OkStatus().
absl::Status FromGrpc(const grpc::Status& status);

/// As FromGrpc, the message prefixed with "what: " (OK stays OK).
absl::Status FromGrpc(const grpc::Status& status, absl::string_view what);

/// Same code, the message through CutStatusMessage; OK gives grpc::Status::OK.
/// Logs nothing: a server that logs its own bugs does so above this.
grpc::Status ToGrpc(const absl::Status& status);

/// The status a peer sent as a number and a message (WorkerFdResponse):
/// 0 is OK (the message dropped); a number outside [0, 16] becomes UNKNOWN
/// with the same message.
absl::Status FromWireCode(int64_t code, absl::string_view message);

/// The number that travels for `code` (its absl/gRPC value).
int32_t ToWireCode(absl::StatusCode code);

/// "OK", "INVALID_ARGUMENT", ... ; a value outside the 17 codes gives
/// "CODE_<n>". The metrics' `code` label.
std::string CodeName(absl::StatusCode code);

/// Same code, the message prefixed with "what: "; OK stays OK.
absl::Status WithContext(const absl::Status& status, absl::string_view what);

}  // namespace reshard::rpc
