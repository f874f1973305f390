// What one host does in a TransferPlan: which hosts take part, the slice of
// the plan a host executes, the bytes it writes, the shards it must report
// checksums for. Pure functions of the plan (its layouts name the hosts).
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "planner/planner.h"
#include "reshard/v1/plan.pb.h"

namespace reshard::coordinator {

/// Hosts of every step's source rank (old layout), of every step's
/// destinations and of every zero fill's rank (new layout); sorted, unique.
std::vector<std::string> HostsTakingPart(const v1::TransferPlan& plan);

/// The plan with `steps` cut to those whose source rank's old host or whose
/// destinations' new host is `host`, and `zero_fills` to the host's new
/// ranks. Items, layouts, stats and lost ranks are kept whole.
v1::TransferPlan SliceForHost(const v1::TransferPlan& plan, const std::string& host);

/// Bytes written into new buffers on each host taking part: every
/// destination of every step plus every zero fill. Hosts that only send
/// appear with 0.
std::map<std::string, int64_t> BytesWrittenByHost(const v1::TransferPlan& plan);

/// Sum of BytesWrittenByHost: the operation's bytes_total.
int64_t BytesTotal(const v1::TransferPlan& plan);

/// (item, new rank) of every shard the plan writes on `host`: the shards
/// whose checksums the host reports when it is DONE.
std::set<std::pair<int, int>> ShardsWrittenOnHost(const v1::TransferPlan& plan,
                                                  const std::string& host);

/// (item, old rank) of every step's source shard that `host` reads: the
/// steps whose source rank the old layout places there.
std::set<std::pair<int, int>> ShardsReadOnHost(const v1::TransferPlan& plan,
                                               const std::string& host);

}  // namespace reshard::coordinator
