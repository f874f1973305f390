// The property tests' population of random jobs and transitions: 1-5 tensors
// of up to 3 dimensions (tp splits with random blocks, every pipeline rule,
// every classic dp mode), tp/pp/dp 1-4, both rank orders, random stage
// starts, 1-4 devices per host in compact or shuffled per-rank placements,
// some moves onto new hosts, some lost hosts and ranks. Used by the verifier's
// property test and by bench/planner (rule 5 measured on this population).
// Deterministic per seed; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "planner/planner.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::verifier::testing {

struct Transition {
  v1::Ptc ptc;
  v1::Layout from, to;
  planner::LostSet lost;

  std::string Describe() const;
};

/// The transition of `seed`; `lost_chance` of losing a host or ranks,
/// `new_hosts_chance` of moving onto hosts the job never used.
Transition RandomTransition(uint64_t seed, double lost_chance, double new_hosts_chance);

}  // namespace reshard::verifier::testing
