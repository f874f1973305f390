// The invalid variants of GptJobSpec that each planner check must refuse
// (InvalidSpecCases), and, under their old names, the job specs and layout
// builders of tests/support for the suites that still call them by these
// names (tests/client, tests/agent/e2e, tests/fault).
#pragma once

#include <string>
#include <vector>

#include "reshard/v1/coordinator.pb.h"
#include "reshard/v1/ptc.pb.h"
#include "tests/support/job_builders.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {

// tests/support's builders and GPT-like specs, under the old names.
using ::reshard::test_support::HostsPlacement;
using ::reshard::test_support::MakeLayout;

/// A 4-layer GPT-like job: embeddings (first stage), per layer a fused QKV
/// weight (blocks), a row-parallel weight and a norm, the output head (last
/// stage), an fp32 Adam moment per weight (DP_FLAT), a step blob and a
/// per-rank RNG blob. Layout: tp 2, pp 2, dp 2 on hosts `hosts` x 4.
inline v1::JobSpec SmallJobSpec(const std::string& name, const std::string& tenant,
                                const std::vector<std::string>& hosts = {"h0", "h1"}) {
  return ::reshard::test_support::GptJobSpec(name, tenant, hosts);
}

/// The same model without per-rank or data-parallel-split state (every
/// tensor DP_REPLICATED, no per-rank blob), at tp 2, pp 2, dp 2 on
/// h0..h3 x 2 devices: each host holds one data-parallel replica of one
/// stage, so losing h1 (or h3) is recoverable from the other replica.
inline v1::JobSpec ReplicatedJobSpec(const std::string& name, const std::string& tenant) {
  return ::reshard::test_support::ReplicatedGptJobSpec(name, tenant);
}

/// One invalid variant of GptJobSpec, refused by the planner's
/// validation with InvalidArgument.
struct InvalidSpecCase {
  std::string name;  // test-case name
  v1::JobSpec spec;
};
std::vector<InvalidSpecCase> InvalidSpecCases();

}  // namespace reshard::coordinator::testing
