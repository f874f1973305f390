// The invalid variants of GptJobSpec that each planner check must refuse
// (InvalidSpecCases); and tests/support's layout builders, named in this
// namespace for the server, fault and e2e suites.
#pragma once

#include <string>
#include <vector>

#include "reshard/v1/coordinator.pb.h"
#include "reshard/v1/ptc.pb.h"
#include "tests/support/job_builders.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {

using ::reshard::test_support::HostsPlacement;
using ::reshard::test_support::MakeLayout;

/// One invalid variant of GptJobSpec, refused by the planner's
/// validation with InvalidArgument.
struct InvalidSpecCase {
  std::string name;  // test-case name
  v1::JobSpec spec;
};
std::vector<InvalidSpecCase> InvalidSpecCases();

}  // namespace reshard::coordinator::testing
