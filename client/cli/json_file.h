// Reading API messages from files in the protobuf JSON mapping.
// Pure apart from reading the named file; thread-safe.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace reshard::cli {

/// The whole file. The error (NotFound, PermissionDenied, ...) names `path`.
[[nodiscard]] absl::StatusOr<std::string> ReadFile(const std::string& path);

/// Reads `path` and parses it as JSON into `message`; both lowerCamel and
/// original field names are accepted, unknown fields are errors. On failure
/// the message names `path` and the message type; `what` (e.g. "--spec")
/// says which argument it came from.
[[nodiscard]] absl::Status ReadJsonMessage(const std::string& path, absl::string_view what,
                                           google::protobuf::Message* message);

}  // namespace reshard::cli
