#include "bench/planner/random_jobs.h"

#include <cstdint>

namespace reshard::bench {

std::vector<Transition> PropertyPopulation(int per_mix) {
  struct Mix {
    uint64_t base;
    double lost, new_hosts;
  };
  // tests/verifier/property_test.cc: RandomTransitions, RandomFailures,
  // MigrationsToNewHosts.
  static constexpr Mix kMixes[] = {{1000, 0.0, 0.15}, {100000, 1.0, 0.3}, {200000, 0.2, 1.0}};
  std::vector<Transition> out;
  for (const Mix& m : kMixes) {
    for (int i = 0; i < per_mix; ++i) {
      out.push_back(verifier::testing::RandomTransition(m.base + i, m.lost, m.new_hosts));
    }
  }
  return out;
}

}  // namespace reshard::bench
