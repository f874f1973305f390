#include "planner/survivor.h"

#include <cstdint>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "planner/layout.h"

namespace reshard::planner {

absl::StatusOr<v1::Layout> SurvivorLayout(const v1::Layout& current,
                                          const std::vector<std::string>& lost_hosts,
                                          const std::vector<int>& lost_ranks) {
  const std::vector<v1::DeviceSlot> slots = ExpandPlacement(current.placement());
  const absl::flat_hash_set<std::string> hosts(lost_hosts.begin(), lost_hosts.end());
  const absl::flat_hash_set<int> ranks(lost_ranks.begin(), lost_ranks.end());
  std::vector<v1::DeviceSlot> alive;
  for (size_t r = 0; r < slots.size(); ++r) {
    if (hosts.contains(slots[r].host()) || ranks.contains(static_cast<int>(r))) continue;
    alive.push_back(slots[r]);
  }
  const v1::ParallelConfig& c = current.config();
  const int64_t model = int64_t{c.tp()} * CpOf(c) * c.pp();
  const int64_t fits = model > 0 ? static_cast<int64_t>(alive.size()) / model : 0;
  // Experts need tp * cp * dp to stay a multiple of expert_tp * ep.
  const int64_t experts = int64_t{ExpertTpOf(c)} * EpOf(c);
  int64_t dp = fits;
  while (dp >= 1 && (int64_t{c.tp()} * CpOf(c) * dp) % experts != 0) --dp;
  if (dp < 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        alive.size(), " surviving devices cannot hold tp ", c.tp(),
        CpOf(c) > 1 ? absl::StrCat(" x cp ", CpOf(c)) : "", " x pp ", c.pp(), " = ", model,
        " ranks",
        fits >= 1 ? absl::StrCat(" with tp * cp * dp a multiple of expert_tp * ep = ", experts)
                  : "",
        "; name a target layout"));
  }
  v1::Layout out;
  *out.mutable_config() = c;
  out.mutable_config()->set_dp(static_cast<int32_t>(dp));
  // HSDP keeps its shard groups when they still tile dp; otherwise the
  // survivors shard over the whole group (dp_shard 0), never an invalid size.
  if (c.dp_shard() > 0 && dp % c.dp_shard() != 0) out.mutable_config()->set_dp_shard(0);
  for (int64_t r = 0; r < dp * model; ++r) *out.mutable_placement()->add_ranks() = alive[r];
  return out;
}

}  // namespace reshard::planner
