#include "common/rpc/status.h"

#include "absl/strings/str_cat.h"

namespace reshard::rpc {

namespace {

// The conversions are casts: every one of the 17 codes has one value in both.
#define RESHARD_SAME_CODE(absl_name, grpc_name)                    \
  static_assert(static_cast<int>(absl::StatusCode::absl_name) ==   \
                    static_cast<int>(grpc::StatusCode::grpc_name), \
                "absl and gRPC disagree on " #grpc_name);
RESHARD_SAME_CODE(kOk, OK)
RESHARD_SAME_CODE(kCancelled, CANCELLED)
RESHARD_SAME_CODE(kUnknown, UNKNOWN)
RESHARD_SAME_CODE(kInvalidArgument, INVALID_ARGUMENT)
RESHARD_SAME_CODE(kDeadlineExceeded, DEADLINE_EXCEEDED)
RESHARD_SAME_CODE(kNotFound, NOT_FOUND)
RESHARD_SAME_CODE(kAlreadyExists, ALREADY_EXISTS)
RESHARD_SAME_CODE(kPermissionDenied, PERMISSION_DENIED)
RESHARD_SAME_CODE(kResourceExhausted, RESOURCE_EXHAUSTED)
RESHARD_SAME_CODE(kFailedPrecondition, FAILED_PRECONDITION)
RESHARD_SAME_CODE(kAborted, ABORTED)
RESHARD_SAME_CODE(kOutOfRange, OUT_OF_RANGE)
RESHARD_SAME_CODE(kUnimplemented, UNIMPLEMENTED)
RESHARD_SAME_CODE(kInternal, INTERNAL)
RESHARD_SAME_CODE(kUnavailable, UNAVAILABLE)
RESHARD_SAME_CODE(kDataLoss, DATA_LOSS)
RESHARD_SAME_CODE(kUnauthenticated, UNAUTHENTICATED)
#undef RESHARD_SAME_CODE

constexpr int kLastCode = static_cast<int>(absl::StatusCode::kUnauthenticated);  // 16

// Bytes `c` takes on the wire: gRPC percent-encodes the status message,
// every byte outside printable ASCII (and '%') as three.
size_t WireBytes(unsigned char c) { return (c >= 0x20 && c <= 0x7e && c != '%') ? 1 : 3; }

}  // namespace

std::string CutStatusMessage(std::string message) {
  size_t wire = 0, cut = message.size();
  for (size_t i = 0; i < message.size(); ++i) {
    wire += WireBytes(static_cast<unsigned char>(message[i]));
    if (wire > kMaxStatusMessageBytes) {
      cut = i;
      break;
    }
  }
  if (cut == message.size()) return message;
  // Never split a UTF-8 sequence: back up over continuation bytes.
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xc0) == 0x80) --cut;
  const size_t dropped = message.size() - cut;
  message.resize(cut);
  absl::StrAppend(&message, " ... (", dropped, " more bytes)");
  return message;
}

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::Status FromGrpc(const grpc::Status& status, absl::string_view what) {
  return WithContext(FromGrpc(status), what);
}

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      CutStatusMessage(std::string(status.message())));
}

absl::Status FromWireCode(int64_t code, absl::string_view message) {
  if (code == 0) return absl::OkStatus();
  if (code < 0 || code > kLastCode) return absl::Status(absl::StatusCode::kUnknown, message);
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

int32_t ToWireCode(absl::StatusCode code) { return static_cast<int32_t>(code); }

std::string CodeName(absl::StatusCode code) {
  const int n = static_cast<int>(code);
  if (n < 0 || n > kLastCode) return absl::StrCat("CODE_", n);
  return absl::StatusCodeToString(code);
}

absl::Status WithContext(const absl::Status& status, absl::string_view what) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

}  // namespace reshard::rpc
