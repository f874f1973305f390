// The one survivor-layout policy: what `recover` targets when the caller
// names no layout. The coordinator applies it (RecoverFromFailure without a
// target); reshardctl and the Python SDK no longer compute one themselves.
// Pure; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::planner {

/// The job's parallel config (tp, pp, order, stage starts) with data
/// parallelism reduced to what the surviving device slots of `current`'s
/// placement hold: every rank on a lost host and every lost rank is removed,
/// dp = surviving slots / (tp x cp x pp) rounded down (and further down
/// until tp x cp x dp is a multiple of expert_tp x ep), and the new ranks take the
/// surviving slots in their old rank order (so ranks that survive mostly keep
/// their devices and their bytes stay local). An HSDP `dp_shard` is kept when
/// it divides the new dp, else reset to 0 (shard over the whole group).
/// FailedPrecondition when not even dp 1 fits.
[[nodiscard]] absl::StatusOr<v1::Layout> SurvivorLayout(const v1::Layout& current,
                                                        const std::vector<std::string>& lost_hosts,
                                                        const std::vector<int>& lost_ranks);

}  // namespace reshard::planner
