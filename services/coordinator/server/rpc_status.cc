#include "services/coordinator/server/rpc_status.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace reshard::coordinator {

namespace {

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

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  if (status.code() == absl::StatusCode::kInternal || status.code() == absl::StatusCode::kUnknown) {
    RESHARD_LOG(ERROR) << "rpc failed: " << status;
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      CutStatusMessage(std::string(status.message())));
}

std::string StatusCodeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

}  // namespace reshard::coordinator
