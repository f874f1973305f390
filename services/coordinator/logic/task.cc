#include "services/coordinator/logic/task.h"

#include <algorithm>
#include <utility>

#include "planner/layout.h"
#include "planner/plan_steps.h"

namespace reshard::coordinator {
namespace {

// Rank -> host of a layout's placement. Ranks outside it (a corrupt plan)
// map to "" rather than crash: plans come from the store.
class RankHosts {
 public:
  explicit RankHosts(const v1::Layout& layout) {
    for (const v1::DeviceSlot& slot : planner::ExpandPlacement(layout.placement())) {
      hosts_.push_back(slot.host());
    }
  }
  std::vector<int> RanksOn(const std::string& host) const {
    std::vector<int> ranks;
    for (size_t r = 0; r < hosts_.size(); ++r) {
      if (hosts_[r] == host) ranks.push_back(static_cast<int>(r));
    }
    return ranks;
  }
  const std::string& operator()(int rank) const {
    static const std::string kNone;
    return rank >= 0 && rank < static_cast<int>(hosts_.size()) ? hosts_[rank] : kNone;
  }

 private:
  std::vector<std::string> hosts_;
};

int64_t ElementBytes(const v1::TransferPlan& plan, int item) {
  return item >= 0 && item < plan.items_size() ? plan.items(item).element_bytes() : 0;
}

}  // namespace

std::vector<std::string> HostsTakingPart(const v1::TransferPlan& plan) {
  const RankHosts old_host(plan.source_layout());
  const RankHosts new_host(plan.target_layout());
  std::set<std::string> hosts;
  planner::ForEachStep(plan, [&](const v1::CopyStep& step, const planner::ReplicaShift& at) {
    hosts.insert(old_host(step.src_rank() + at.src));
    for (const v1::Destination& dst : step.dsts()) hosts.insert(new_host(dst.rank() + at.dst));
  });
  planner::ForEachZeroFill(plan, [&](const v1::ZeroFill& fill, const planner::ReplicaShift& at) {
    hosts.insert(new_host(fill.rank() + at.dst));
  });
  hosts.erase("");
  return {hosts.begin(), hosts.end()};
}

v1::TransferPlan SliceForHost(const v1::TransferPlan& plan, const std::string& host) {
  const RankHosts old_host(plan.source_layout());
  const RankHosts new_host(plan.target_layout());
  v1::TransferPlan out;
  *out.mutable_source_layout() = plan.source_layout();
  *out.mutable_target_layout() = plan.target_layout();
  *out.mutable_items() = plan.items();
  *out.mutable_stats() = plan.stats();
  *out.mutable_lost_ranks() = plan.lost_ranks();
  // A slice never repeats: a host's steps, fills and blobs are written out,
  // read from the replicas that name its ranks only (one, when the replicas
  // have hosts of their own: planner/replicas.h).
  for (int k : planner::ReplicasNaming(plan, old_host.RanksOn(host), new_host.RanksOn(host))) {
    const planner::ReplicaShift at = planner::ShiftOf(plan, k);
    for (const v1::CopyStep& step : plan.steps()) {
      bool mine = old_host(step.src_rank() + at.src) == host;
      for (const v1::Destination& dst : step.dsts()) {
        if (mine) break;
        mine = new_host(dst.rank() + at.dst) == host;
      }
      if (mine) planner::AddShifted(step, at, out.mutable_steps());
    }
    for (const v1::ZeroFill& fill : plan.zero_fills()) {
      if (new_host(fill.rank() + at.dst) == host) {
        planner::AddShifted(fill, at, out.mutable_zero_fills());
      }
    }
    for (const v1::Regenerate& g : plan.regenerate()) {
      if (new_host(g.rank() + at.dst) == host) planner::AddShifted(g, at, out.mutable_regenerate());
    }
  }
  planner::SortRegenerate(out.mutable_regenerate());
  return out;
}

std::map<std::string, int64_t> BytesWrittenByHost(const v1::TransferPlan& plan) {
  const RankHosts new_host(plan.target_layout());
  std::map<std::string, int64_t> bytes;
  for (const std::string& host : HostsTakingPart(plan)) bytes[host] = 0;
  planner::ForEachStep(plan, [&](const v1::CopyStep& step, const planner::ReplicaShift& at) {
    for (const v1::Destination& dst : step.dsts()) {
      bytes[new_host(dst.rank() + at.dst)] += step.bytes();
    }
  });
  planner::ForEachZeroFill(plan, [&](const v1::ZeroFill& fill, const planner::ReplicaShift& at) {
    bytes[new_host(fill.rank() + at.dst)] += fill.count() * ElementBytes(plan, fill.item());
  });
  bytes.erase("");
  return bytes;
}

int64_t BytesTotal(const v1::TransferPlan& plan) {
  int64_t total = 0;
  for (const auto& [host, bytes] : BytesWrittenByHost(plan)) total += bytes;
  return total;
}

std::set<std::pair<int, int>> ShardsWrittenOnHost(const v1::TransferPlan& plan,
                                                  const std::string& host) {
  const RankHosts new_host(plan.target_layout());
  std::set<std::pair<int, int>> shards;
  planner::ForEachStep(plan, [&](const v1::CopyStep& step, const planner::ReplicaShift& at) {
    for (const v1::Destination& dst : step.dsts()) {
      const int rank = dst.rank() + at.dst;
      if (new_host(rank) == host) shards.emplace(step.item(), rank);
    }
  });
  planner::ForEachZeroFill(plan, [&](const v1::ZeroFill& fill, const planner::ReplicaShift& at) {
    const int rank = fill.rank() + at.dst;
    if (new_host(rank) == host) shards.emplace(fill.item(), rank);
  });
  return shards;
}

std::set<std::pair<int, int>> ShardsReadOnHost(const v1::TransferPlan& plan,
                                               const std::string& host) {
  const RankHosts old_host(plan.source_layout());
  std::set<std::pair<int, int>> shards;
  planner::ForEachStep(plan, [&](const v1::CopyStep& step, const planner::ReplicaShift& at) {
    const int rank = step.src_rank() + at.src;
    if (old_host(rank) == host) shards.emplace(step.item(), rank);
  });
  return shards;
}

}  // namespace reshard::coordinator
