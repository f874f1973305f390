// Replicas that plan alone (docs/partitioning.md, "Replicas plan alone").
//
// An HSDP job's replicas hold identical state. When the old and the new
// layout both split into the same number of replicas, replica k's ranks are
// replica 0's shifted by a fixed stride in each layout, each replica keeps
// hosts of its own (on the same devices, in the same pattern) and nothing is
// lost, the plan of the whole job is replica 0's plan repeated: replica k
// fills its new layout from its own old ranks, never another replica's.
// Each replica's cross-host bytes are then at their lower bound, as the
// whole plan's are, and the planner does the work of one replica.
//
// Pure: no I/O, no clock, no threads.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "planner/planner.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::planner {

/// How a plan splits into replicas: `count` of them; the layouts of replica
/// 0 alone (its ranks renumbered from 0, its own slots); and, for each of
/// replica 0's ranks there, the job's rank (replica k's: that plus k * the
/// layout's stride).
struct ReplicaSplit {
  int count = 1;
  v1::Layout from, to;  // replica 0's
  std::vector<int> old_rank, new_rank;
  int32_t src_stride = 0, dst_stride = 0;
  /// Each host of the job -> (its replica, the host of replica 0 it mirrors).
  struct HostOf {
    int replica;
    std::string host0;
  };
  std::vector<std::pair<std::string, HostOf>> hosts;  // in the job's host order
};

/// The largest split of `from` -> `to` into replicas that plan alone, or
/// nothing when they do not (one replica, lost ranks, expert tensors, hosts
/// shared between replicas or laid out differently, per-rank blobs across a
/// change of world size). The inputs must have passed validation.
std::optional<ReplicaSplit> SplitReplicas(const v1::Ptc& ptc, const v1::Layout& from,
                                          const v1::Layout& to, const LostSet& lost);

/// Replica 0's plan (planned on split.from -> split.to) made the whole
/// job's: its ranks renumbered to the job's, `replicas` set, the totals and
/// hosts of every replica.
Plan RepeatOverReplicas(Plan one, const ReplicaSplit& split);

}  // namespace reshard::planner
