// Parsing `--lost`: which old hosts or ranks are gone. Pure; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/planner.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::cli {

/// Host names of `placement` (either form), each once, in rank order.
std::vector<std::string> PlacementHosts(const v1::Placement& placement);

/// Parses a comma-separated list against the job's (old) layout: a token
/// equal to one of its hosts is a host; otherwise an integer is an old rank;
/// `rank:N` is always a rank. InvalidArgument naming the token for anything
/// else, for a rank outside [0, world) and for an empty token. Duplicates are
/// dropped. An empty `text` is an empty set.
[[nodiscard]] absl::StatusOr<planner::LostSet> ParseLostSet(absl::string_view text,
                                                            const v1::Layout& layout);

}  // namespace reshard::cli
