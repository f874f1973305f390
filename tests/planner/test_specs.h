// The builders of the planner unit tests: tests/support's, under this suite's
// namespace. TpSplit, Dp and MakeLayout(tp, pp, dp, per_host, ..) keep the
// reference style and the old name for the tests that still call them
// (tests/agent/executor); new code calls SetTpSplit, SetDp and
// MakeLayoutOnHosts.
#pragma once

#include <cstdint>
#include <vector>

#include "reshard/v1/ptc.pb.h"
#include "tests/support/job_builders.h"

namespace reshard::planner::testing {

using ::reshard::test_support::MakeLayoutOnHosts;
using ::reshard::test_support::Place;
using ::reshard::test_support::SetDp;
using ::reshard::test_support::SetPipeline;
using ::reshard::test_support::SetTpSplit;
using ::reshard::test_support::Tensor;

inline v1::TensorSpec& TpSplit(v1::TensorSpec& t, int axis,
                               const std::vector<int64_t>& blocks = {}) {
  SetTpSplit(&t, axis, blocks);
  return t;
}

inline v1::TensorSpec& Dp(v1::TensorSpec& t, v1::DpMode mode, int axis = 0) {
  SetDp(&t, mode, axis);
  return t;
}

/// tp x pp x dp over hosts h<first_host>.. with `per_host` devices each.
inline v1::Layout MakeLayout(int tp, int pp, int dp, int per_host, int first_host = 0,
                             const std::vector<int>& stage_starts = {}) {
  return MakeLayoutOnHosts(tp, pp, dp, per_host, first_host, stage_starts);
}

}  // namespace reshard::planner::testing
