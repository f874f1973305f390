// The job builders of the logic tests under their old names, for the two
// tests that still call them (leader_test.cc, task_pickup_test.cc); the
// others call tests/support's (TwoLayerJob, MakeLayout) directly.
#pragma once

#include <string>

#include "reshard/v1/ptc.pb.h"
#include "tests/support/job_builders.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {

using ::reshard::test_support::MakeLayout;

/// TwoLayerJob: tp 2, pp 2, dp 1 on h0, h1 x 2 devices.
inline v1::JobSpec SmallJob(const std::string& name, const std::string& tenant = "team-a") {
  return ::reshard::test_support::TwoLayerJob(name, tenant);
}

}  // namespace reshard::coordinator::testing
