// Builders for the jobs and layouts of the verifier's tests: the shared ones
// of tests/support/job_builders.h, and two queries of plans and layouts.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "reshard/v1/plan.pb.h"
#include "reshard/v1/ptc.pb.h"
#include "tests/support/job_builders.h"

namespace reshard::verifier::testing {

using ::reshard::test_support::AddBlob;
using ::reshard::test_support::AddGroup;
using ::reshard::test_support::AddTensor;
using ::reshard::test_support::Extra;
using ::reshard::test_support::MakeLayout;
using ::reshard::test_support::SetBucket;
using ::reshard::test_support::SetDp;
using ::reshard::test_support::SetExpert;
using ::reshard::test_support::SetGranularity;
using ::reshard::test_support::SetLayers;
using ::reshard::test_support::SetPadding;
using ::reshard::test_support::SetPipeline;
using ::reshard::test_support::SetTpSplit;
using ::reshard::test_support::With;

/// Host and device of `rank` in `layout` (either placement form).
inline std::pair<std::string, int> SlotOf(const v1::Layout& layout, int rank) {
  const auto& p = layout.placement();
  if (p.ranks_size() > 0) return {p.ranks(rank).host(), p.ranks(rank).device()};
  return {p.hosts(rank / p.devices_per_host()), rank % p.devices_per_host()};
}

/// Total bytes of the copies of a plan (each destination counted).
inline int64_t CopiedBytes(const v1::TransferPlan& plan) {
  int64_t n = 0;
  for (const auto& s : plan.steps()) n += s.bytes() * s.dsts_size();
  return n;
}

}  // namespace reshard::verifier::testing
