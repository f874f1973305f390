#include "services/coordinator/logic/prepared_steps.h"

#include <algorithm>
#include <utility>

#include "planner/plan_steps.h"
#include "services/coordinator/logic/task.h"

namespace reshard::coordinator {
namespace {

using ShardKey = std::pair<int, int>;  // (item, rank)

std::map<ShardKey, const v1::ShardChecksum*> ByShard(const std::vector<v1::ShardChecksum>& sums) {
  std::map<ShardKey, const v1::ShardChecksum*> out;
  for (const v1::ShardChecksum& c : sums) out[{c.item(), c.rank()}] = &c;
  return out;
}

}  // namespace

PreparedSteps ComputePreparedSteps(const v1::TransferPlan& plan,
                                   const std::vector<v1::ShardChecksum>& prepared,
                                   const std::vector<v1::ShardChecksum>& checkpoint) {
  const auto before = ByShard(prepared);
  const auto after = ByShard(checkpoint);
  auto unchanged = [&](const ShardKey& shard) {
    auto b = before.find(shard);
    auto a = after.find(shard);
    return b != before.end() && a != after.end() &&
           b->second->checksum() == a->second->checksum() &&
           b->second->bytes() == a->second->bytes();
  };
  // What is left of the plan: its steps that moved again. The hosts stay
  // those of the whole plan (every one of them seals its new ranks).
  v1::TransferPlan left;
  *left.mutable_source_layout() = plan.source_layout();
  *left.mutable_target_layout() = plan.target_layout();
  *left.mutable_items() = plan.items();
  PreparedSteps out;
  planner::ForEachStep(plan, [&](const v1::CopyStep& step, const planner::ReplicaShift& at) {
    if (unchanged({step.item(), step.src_rank() + at.src})) {
      out.skipped.push_back(step.index() + at.index);
    } else {
      planner::AddShifted(step, at, left.mutable_steps());
    }
  });
  std::sort(out.skipped.begin(), out.skipped.end());
  const std::map<std::string, int64_t> whole = BytesWrittenByHost(plan);
  const std::map<std::string, int64_t> remaining = BytesWrittenByHost(left);
  for (const auto& [host, bytes] : whole) {
    auto it = remaining.find(host);
    const int64_t still = it == remaining.end() ? 0 : it->second;
    out.bytes_by_host[host] = still;
    out.bytes_skipped += bytes - still;
  }
  return out;
}

v1::TransferPlan WithoutSkipped(v1::TransferPlan slice, const std::set<int64_t>& skipped) {
  auto* steps = slice.mutable_steps();
  steps->erase(std::remove_if(steps->begin(), steps->end(),
                              [&](const v1::CopyStep& s) { return skipped.count(s.index()) > 0; }),
               steps->end());
  slice.clear_zero_fills();
  slice.clear_regenerate();
  return slice;
}

}  // namespace reshard::coordinator
