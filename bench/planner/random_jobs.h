// The planner's property-test population (tests/verifier/transitions.h), for
// measuring rule 5 over many plans. Pure; thread-safe.
#pragma once

#include <vector>

#include "tests/verifier/transitions.h"

namespace reshard::bench {

using Transition = verifier::testing::Transition;

/// The three mixes of the verifier's property tests (random transitions,
/// random failures, migrations to new hosts), `per_mix` seeds each from the
/// same seed bases (seeds fixed: the population is the same on every run).
std::vector<Transition> PropertyPopulation(int per_mix);

}  // namespace reshard::bench
