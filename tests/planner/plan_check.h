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

/// The plan of every replica written out (Plan::replicas back to one): the
/// plan as the job would have it without the repeat.
Plan WrittenOut(const Plan& plan);

/// MakePlan + both checks: CheckPlan above and the independent
/// verifier::VerifyPlan. Failures are EXPECT failures; an empty Plan when
/// MakePlan fails.
Plan PlanAndCheck(const v1::Ptc& ptc, const v1::Layout& from, const v1::Layout& to,
                  const LostSet& lost = {});

/// What MakePlan made of a job (AgreeOnRefusal).
enum class PlanOutcome { kInvalid, kUnrecoverable, kPlanned };

/// MakePlan on a job losing `lost_hosts`, and whether the independent
/// verifier, written from the same page, agrees: invalid inputs are
/// INVALID_ARGUMENT for both; an unrecoverable job is the planner's
/// FAILED_PRECONDITION naming every item verifier::UnrecoverableItems finds
/// lost; a planned job loses nothing for the verifier. Disagreements are
/// EXPECT failures. `plan` gets MakePlan's result.
PlanOutcome AgreeOnRefusal(const v1::Ptc& ptc, const v1::Layout& from, const v1::Layout& to,
                           const std::vector<std::string>& lost_hosts,
                           absl::StatusOr<Plan>* plan);

}  // namespace reshard::planner::testing
