// `reshardctl advise` and `resize --choose`: the flags that describe the
// model and the devices offered (docs/advisor.md, "The Advise RPC"), turned
// into an AdviseRequest, and the advice as a table. Pure; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "reshard/v1/coordinator.pb.h"

namespace reshard::cli {

/// Value flags of the advice (besides --gpus, which advise requires).
const std::vector<std::string>& AdviseValueFlags();
/// Boolean flags of the advice.
const std::vector<std::string>& AdviseBoolFlags();
/// The usage lines of those flags.
const char* AdviseFlagsHelp();

/// The AdviseRequest for `job_id` from the command's flags (no "--").
/// InvalidArgument naming the flag and value for a malformed one.
[[nodiscard]] absl::StatusOr<v1::AdviseRequest> AdviseRequestFromFlags(
    const absl::flat_hash_map<std::string, std::string>& flags, const std::string& job_id);

/// The offer, then one row per candidate: TP, PP, DP, MB, RECOMPUTE, STEP,
/// MEMORY/DEV, CROSS-HOST, MOVE, STEPS/HORIZON; "*" marks the best one.
std::string FormatAdviceTable(const v1::AdviseResponse& advice);

}  // namespace reshard::cli
