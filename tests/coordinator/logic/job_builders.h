// The job specs and layouts of the logic tests, under their old names: the
// builders and canned specs are tests/support's (TwoLayerPtc: a 2-layer model
// whose tensors use every partition rule and both blob scopes, so plans have
// cross-host steps, local steps and zero fills).
#pragma once

#include <string>

#include "reshard/v1/ptc.pb.h"
#include "tests/support/job_builders.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {

using ::reshard::test_support::Config;
using ::reshard::test_support::HostsPlacement;
using ::reshard::test_support::MakeLayout;

inline v1::Ptc SmallPtc() { return ::reshard::test_support::TwoLayerPtc(); }

/// SmallPtc at tp 2, pp 2, dp 1 on h0, h1 x 2 devices.
inline v1::JobSpec SmallJob(const std::string& name, const std::string& tenant = "team-a") {
  return ::reshard::test_support::TwoLayerJob(name, tenant);
}

/// SmallPtc, every item replicated, at tp 1, pp 1, dp 2 on h0, h1 x 1
/// device: each item has a replica on each host, so losing one loses nothing.
inline v1::JobSpec ReplicatedJob(const std::string& name, const std::string& tenant = "team-a") {
  return ::reshard::test_support::ReplicatedTwoLayerJob(name, tenant);
}

}  // namespace reshard::coordinator::testing
