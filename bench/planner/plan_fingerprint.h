// A 64-bit fingerprint of everything a planner::Plan says (items, steps,
// destinations, fills, totals, host traffic and rule 5's sends and choices),
// so that a change meant to make planning faster can show that it plans
// exactly the same. Pure; thread-safe.
#pragma once

#include <cstdint>

#include "planner/planner.h"

namespace reshard::bench {

/// FNV-1a over every field of `plan` (field by field, never raw memory, so
/// struct padding does not count).
uint64_t PlanFingerprint(const planner::Plan& plan);

}  // namespace reshard::bench
