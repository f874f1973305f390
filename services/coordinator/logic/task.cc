#include "services/coordinator/logic/task.h"

#include "planner/layout.h"

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
  for (const v1::CopyStep& step : plan.steps()) {
    hosts.insert(old_host(step.src_rank()));
    for (const v1::Destination& dst : step.dsts()) hosts.insert(new_host(dst.rank()));
  }
  for (const v1::ZeroFill& fill : plan.zero_fills()) hosts.insert(new_host(fill.rank()));
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
  for (const v1::CopyStep& step : plan.steps()) {
    bool mine = old_host(step.src_rank()) == host;
    for (const v1::Destination& dst : step.dsts()) {
      if (mine) break;
      mine = new_host(dst.rank()) == host;
    }
    if (mine) *out.add_steps() = step;
  }
  for (const v1::ZeroFill& fill : plan.zero_fills()) {
    if (new_host(fill.rank()) == host) *out.add_zero_fills() = fill;
  }
  return out;
}

std::map<std::string, int64_t> BytesWrittenByHost(const v1::TransferPlan& plan) {
  const RankHosts new_host(plan.target_layout());
  std::map<std::string, int64_t> bytes;
  for (const std::string& host : HostsTakingPart(plan)) bytes[host] = 0;
  for (const v1::CopyStep& step : plan.steps()) {
    for (const v1::Destination& dst : step.dsts()) bytes[new_host(dst.rank())] += step.bytes();
  }
  for (const v1::ZeroFill& fill : plan.zero_fills()) {
    bytes[new_host(fill.rank())] += fill.count() * ElementBytes(plan, fill.item());
  }
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
  for (const v1::CopyStep& step : plan.steps()) {
    for (const v1::Destination& dst : step.dsts()) {
      if (new_host(dst.rank()) == host) shards.emplace(step.item(), dst.rank());
    }
  }
  for (const v1::ZeroFill& fill : plan.zero_fills()) {
    if (new_host(fill.rank()) == host) shards.emplace(fill.item(), fill.rank());
  }
  return shards;
}

std::set<std::pair<int, int>> ShardsReadOnHost(const v1::TransferPlan& plan,
                                               const std::string& host) {
  const RankHosts old_host(plan.source_layout());
  std::set<std::pair<int, int>> shards;
  for (const v1::CopyStep& step : plan.steps()) {
    if (old_host(step.src_rank()) == host) shards.emplace(step.item(), step.src_rank());
  }
  return shards;
}

v1::PlanStats StatsOf(const planner::Plan& plan) {
  v1::PlanStats stats;
  stats.set_bytes_local(plan.bytes_local);
  stats.set_bytes_cross_host(plan.bytes_cross_host);
  stats.set_lower_bound_cross_host(plan.lower_bound_cross_host);
  stats.set_bytes_zero_filled(plan.bytes_zero_filled);
  stats.set_steps(static_cast<int64_t>(plan.steps.size()));
  stats.set_cross_host_steps(plan.cross_host_steps);
  stats.set_zero_fills(static_cast<int64_t>(plan.fills.size()));
  for (const planner::Plan::HostStats& h : plan.hosts) {
    v1::HostTraffic* traffic = stats.add_hosts();
    traffic->set_host(h.host);
    traffic->set_bytes_in(h.bytes_in);
    traffic->set_bytes_out(h.bytes_out);
    traffic->set_bytes_local(h.bytes_local);
  }
  return stats;
}

}  // namespace reshard::coordinator
