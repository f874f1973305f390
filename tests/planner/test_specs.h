// The builders of the planner unit tests: tests/support's, under this suite's
// namespace.
#pragma once

#include "reshard/v1/ptc.pb.h"
#include "tests/support/job_builders.h"

namespace reshard::planner::testing {

using ::reshard::test_support::MakeLayoutOnHosts;
using ::reshard::test_support::Place;
using ::reshard::test_support::SetDp;
using ::reshard::test_support::SetPipeline;
using ::reshard::test_support::SetTpSplit;
using ::reshard::test_support::Tensor;

}  // namespace reshard::planner::testing
