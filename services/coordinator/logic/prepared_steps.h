// Which steps of a prepared stop-free operation move again at the cut-over
// (docs/coordinator.md, "Agents prepare"). Pure. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "reshard/v1/agent.pb.h"
#include "reshard/v1/plan.pb.h"

namespace reshard::coordinator {

struct PreparedSteps {
  /// CopyStep.index of every step whose source shard did not change since
  /// the prepare, ascending.
  std::vector<int64_t> skipped;
  /// Of the plan's bytes (BytesTotal): the skipped steps' (per destination)
  /// and every zero fill's, which the prepare wrote.
  int64_t bytes_skipped = 0;
  /// Bytes each host of the plan (BytesWrittenByHost's hosts) still writes.
  std::map<std::string, int64_t> bytes_by_host;
};

/// A step is skipped when its source shard (item, src_rank) has a prepared
/// checksum (`prepared`: what the agents read during the prepare) equal,
/// checksum and bytes, to the one the cut-over checkpoint's generation
/// recorded for it (`checkpoint`); a shard missing from either moves again.
/// Zero fills and regenerates are always skipped.
PreparedSteps ComputePreparedSteps(const v1::TransferPlan& plan,
                                   const std::vector<v1::ShardChecksum>& prepared,
                                   const std::vector<v1::ShardChecksum>& checkpoint);

/// The slice a host gets in the transfer phase: `slice` without the steps
/// in `skipped` (CopyStep.index), zero fills and regenerates.
v1::TransferPlan WithoutSkipped(v1::TransferPlan slice, const std::set<int64_t>& skipped);

}  // namespace reshard::coordinator
