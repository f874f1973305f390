// The part of a HostTask one host executes, checked before any byte moves:
// this host's new ranks and their item sizes, the old buffers it reads, and
// its steps sorted into local copies, sends and receives. Everything that
// arrived over the network is validated here (ranks, items, regions within
// their buffers, destinations on one host, peers known), so the transfer loop
// can trust it. Not thread-safe; one per Execute.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/shard_store/shard_store.h"
#include "reshard/v1/agent.pb.h"

namespace reshard::agent {

/// A step whose source and destinations are on different hosts, seen from
/// one end.
struct RemoteStep {
  const v1::CopyStep* step = nullptr;
  bool is_send = false;
  std::string peer;  // the other end: the destinations' host, or the source's
};

struct HostSteps {
  /// This host's new ranks, ascending, and each one's item sizes.
  std::vector<int> new_ranks;
  std::vector<std::vector<int64_t>> new_item_bytes;
  std::map<int, size_t> new_index;  // new rank -> position in new_ranks
  /// Old buffers of this host's ranks that some step reads (sealed, files
  /// intact when checked).
  std::unordered_map<int, RankBufferPtr> old_bufs;
  /// Source and destinations here, in plan order.
  std::vector<const v1::CopyStep*> locals;
  /// Sends and receives in step-index order (both ends issue in this order).
  std::vector<RemoteStep> remotes;
  /// Zero fills of this host's new ranks.
  std::vector<const v1::ZeroFill*> fills;
  /// Bytes this host writes into its new buffers (copies x destinations + fills).
  int64_t total_bytes = 0;
  /// Peers that sends go to (all listed in the task's peers).
  std::map<std::string, std::string> send_peers;  // host id -> UCX address
};

/// InvalidArgument (naming the step, `what` and `rank`) unless every element
/// of region `r` of `step` lies in [0, elements) of its item.
[[nodiscard]] absl::Status CheckRegion(const v1::StridedRegion& r, const v1::CopyStep& step,
                                       int64_t elements, const char* what, int rank);

/// Checks `task` (PTC, layouts, steps, fills) for host `host_id` and sorts out
/// its part. InvalidArgument for anything malformed, NotFound naming the rank
/// when an old buffer a step reads is not in `store`, FailedPrecondition when
/// it is not sealed, DataLoss when its file was truncated or replaced.
[[nodiscard]] absl::StatusOr<HostSteps> PrepareHostSteps(ShardStore* store,
                                                         const std::string& host_id,
                                                         const v1::HostTask& task);

}  // namespace reshard::agent
