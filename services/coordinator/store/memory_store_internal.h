// What the MemoryStore's files share besides the class (memory_store.h).
// Internal to the store.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"
#include "reshard/v1/ptc.pb.h"
#include "services/coordinator/store/store.h"

namespace reshard::coordinator::mem {

/// InvalidArgument for text with a NUL byte, as PgStore (which cannot store one).
absl::Status CheckText(absl::string_view what, absl::string_view value);
absl::Status JobNotFound(absl::string_view job_id);
absl::Status OperationNotFound(absl::string_view operation_id);
/// `text` cut to at most `max` bytes on a UTF-8 character boundary.
std::string CutUtf8(const std::string& text, size_t max);
/// An error as stored (4096 bytes at most).
std::string TruncateError(const std::string& text);
/// The host of each rank of `layout` (InvalidArgument as PgStore's
/// ToGenerationRows when the placement does not fit the config).
absl::StatusOr<std::vector<std::string>> RankHosts(const v1::Layout& layout,
                                                   absl::string_view what);

/// The host rows a transfer or a prepare starts with: ids non-empty, storable
/// and listed once, and (`check_states`) states ASSIGNED..FAILED.
absl::Status CheckHostRows(const std::string& operation_id, const std::vector<HostProgress>& hosts,
                           bool check_states);
std::vector<std::string> HostIds(const std::vector<HostProgress>& hosts);

}  // namespace reshard::coordinator::mem
