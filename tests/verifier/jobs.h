// Two queries of plans and layouts for the verifier's tests (their jobs and
// layouts are built with tests/support/job_builders.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "reshard/v1/plan.pb.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::verifier::testing {

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
