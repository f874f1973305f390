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
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator::mem {

// The checks and limits PgStore applies too (store_checks.h).
using ::reshard::coordinator::CheckText;
using ::reshard::coordinator::CutUtf8;
using ::reshard::coordinator::TruncateError;

absl::Status JobNotFound(absl::string_view job_id);
absl::Status OperationNotFound(absl::string_view operation_id);
/// The host of each rank of `layout` (InvalidArgument as PgStore's
/// ToGenerationRows when the placement does not fit the config).
absl::StatusOr<std::vector<std::string>> RankHosts(const v1::Layout& layout,
                                                   absl::string_view what);

/// The hosts' ids, in order.
std::vector<std::string> HostIds(const std::vector<HostProgress>& hosts);

}  // namespace reshard::coordinator::mem
