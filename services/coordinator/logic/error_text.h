// Texts the coordinator stores and returns as reasons: bounded in size, and
// the "not found" messages every API uses. Thread-safe.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace reshard::coordinator {

/// Operation.error is at most this many bytes.
inline constexpr size_t kMaxErrorBytes = 4096;

/// `text` cut to at most `max_bytes` bytes on a UTF-8 character boundary,
/// ending with a note of how much was dropped when it was cut.
std::string TruncateError(absl::string_view text, size_t max_bytes = kMaxErrorBytes);

/// NotFound `job "ID" not found`.
absl::Status JobNotFound(const std::string& job_id);
/// NotFound `operation "ID" not found`.
absl::Status OperationNotFound(const std::string& operation_id);
/// NotFound `host "ID" not found`.
absl::Status HostNotFound(const std::string& host_id);

/// `status` unchanged unless it is NotFound, which becomes `not_found`: the
/// store's NotFound texts are its own; the API promises these.
absl::Status NameNotFound(const absl::Status& status, const absl::Status& not_found);

}  // namespace reshard::coordinator
