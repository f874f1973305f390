// Checks of scheduler requests that need no store: field presence and the
// target layouts of Resize / Migrate / RecoverFromFailure against the job.
// Every failure is InvalidArgument naming the field and value. Pure.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/repeated_field.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::coordinator {

/// InvalidArgument `FIELD is empty` when `value` is.
[[nodiscard]] absl::Status RequireNonEmpty(absl::string_view field, const std::string& value);

/// expected_generation must name a generation (they start at 1).
[[nodiscard]] absl::Status CheckExpectedGeneration(int64_t expected_generation);

/// Migrate keeps the config: the new placement must have a slot per rank.
[[nodiscard]] absl::Status CheckMigrateWorld(const v1::ParallelConfig& config,
                                             const v1::Placement& placement);

/// The lost set names at least one well-formed host or rank.
[[nodiscard]] absl::Status CheckLostFields(
    const google::protobuf::RepeatedPtrField<std::string>& lost_hosts,
    const google::protobuf::RepeatedField<int32_t>& lost_ranks);

/// The lost set against the generation it is about (`current`): every lost
/// host holds a rank of it, every lost rank exists, and `target` uses neither
/// a lost host nor the device of a lost rank.
[[nodiscard]] absl::Status CheckLostAgainst(
    const v1::Layout& current, const v1::Layout& target,
    const google::protobuf::RepeatedPtrField<std::string>& lost_hosts,
    const google::protobuf::RepeatedField<int32_t>& lost_ranks);

}  // namespace reshard::coordinator
