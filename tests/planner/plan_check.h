// CheckPlan: replays a planner::Plan element by element against the shards
// the planner derives, for the planner's own tests (the independent check is
// verifier::VerifyPlan). Small shapes only: it materialises every buffer.
#pragma once

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "planner/planner.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::planner::testing {

/// Checks: every position of every new buffer written exactly once, by a
/// copy of the element the target puts there or by a zero fill of a padding
/// position (or of a listed regenerated blob); sources alive and holding the
/// element; an old rank on the destination's device used whenever one holds
/// the element, else one on its host; bytes_cross_host and
/// lower_bound_cross_host equal to the lower bound computed from the shards.
::testing::AssertionResult CheckPlan(const v1::Ptc& ptc, const v1::Layout& from,
                                     const v1::Layout& to, const LostSet& lost, const Plan& plan);

/// MakePlan + both checks: CheckPlan above and the independent
/// verifier::VerifyPlan. Failures are EXPECT failures; an empty Plan when
/// MakePlan fails.
Plan PlanAndCheck(const v1::Ptc& ptc, const v1::Layout& from, const v1::Layout& to,
                  const LostSet& lost = {});

}  // namespace reshard::planner::testing
