// Random jobs and transitions shaped like the planner's property-test
// population (tests/verifier/property_test.cc), for measuring rule 5 over many
// plans: 1-5 tensors of up to 3 dimensions, tp/pp/dp 1-4, both rank orders,
// 1-4 devices per host, some onto new hosts, some with lost hosts or ranks.
// Built with the verifier tests' job builders (tests/verifier/jobs.h).
// Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/planner.h"
#include "reshard/v1/plan.pb.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::bench {

struct Transition {
  v1::Ptc ptc;
  v1::Layout from, to;
  planner::LostSet lost;
};

/// The transition of `seed`; `lost_chance` of losing a host or ranks,
/// `new_hosts_chance` of moving onto hosts the job never used.
Transition RandomTransition(uint64_t seed, double lost_chance, double new_hosts_chance);

/// The three mixes of the property tests, `per_mix` seeds each (seeds fixed:
/// the population is the same on every run).
std::vector<Transition> PropertyPopulation(int per_mix);

}  // namespace reshard::bench
