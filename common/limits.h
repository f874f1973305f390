// Limits on what a client sends that more than one component checks: the
// planner (names inside a job spec) and the coordinator's request checks
// (ids, idempotency keys, host fields). Each limit is listed in
// docs/coordinator.md ("Limits"); the component's own limits stay with it
// (planner/validate.h, services/coordinator/logic/request_checks.h). Together
// they keep every name below PostgreSQL's btree key limit (~2,700 bytes).
// Pure; thread-safe.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace reshard {

/// Names of things inside a job: tensor and blob names.
inline constexpr int64_t kMaxItemNameBytes = 1024;
/// Identifiers: job name, tenant, host ids (in placements and agents),
/// idempotency keys, job and operation ids.
inline constexpr int64_t kMaxIdBytes = 256;

/// InvalidArgument `FIELD "VALUE..." is N bytes; the limit is L bytes` when
/// `value` is longer than `limit` (the value is shown cut to 64 bytes).
[[nodiscard]] absl::Status CheckLength(absl::string_view field, absl::string_view value,
                                       int64_t limit);

}  // namespace reshard
