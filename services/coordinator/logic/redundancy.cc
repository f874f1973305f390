#include "services/coordinator/logic/redundancy.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "planner/layout.h"
#include "planner/survivor.h"
#include "planner/validate.h"

namespace reshard::coordinator {
namespace {

// Slots a layout text lists before it only counts the rest.
constexpr size_t kMaxSlotsShown = 32;

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// `layout` with every slot's host renamed: the same ranks on hosts no lost
// set names, so a plan to it needs every byte of the source layout.
v1::Layout ProbeTarget(const v1::Layout& layout) {
  v1::Layout probe;
  *probe.mutable_config() = layout.config();
  for (const v1::DeviceSlot& s : planner::ExpandPlacement(layout.placement())) {
    v1::DeviceSlot* out = probe.mutable_placement()->add_ranks();
    out->set_host(absl::StrCat("probe/", s.host()));
    out->set_device(s.device());
  }
  return probe;
}

// The survivors of `lost` with the current number of HSDP replicas (dp a
// multiple of them, each replica a shard group of dp / replicas), ranks on
// the surviving slots in their old order; nullopt when not even one rank
// per replica fits.
std::optional<v1::Layout> ReplicaKeepingSurvivors(const v1::Layout& current,
                                                  const planner::LostSet& lost) {
  const v1::ParallelConfig& c = current.config();
  const int replicas = ReplicasOf(c);
  if (replicas <= 1) return std::nullopt;
  const std::vector<v1::DeviceSlot> slots = planner::ExpandPlacement(current.placement());
  std::vector<v1::DeviceSlot> alive;
  for (size_t r = 0; r < slots.size(); ++r) {
    if (Contains(lost.hosts, slots[r].host()) ||
        std::find(lost.ranks.begin(), lost.ranks.end(), static_cast<int>(r)) != lost.ranks.end()) {
      continue;
    }
    alive.push_back(slots[r]);
  }
  const int64_t model = int64_t{c.tp()} * planner::CpOf(c) * c.pp();
  const int64_t experts = int64_t{planner::ExpertTpOf(c)} * planner::EpOf(c);
  if (model <= 0) return std::nullopt;
  int64_t dp = static_cast<int64_t>(alive.size()) / model;
  dp -= dp % replicas;
  while (dp >= replicas && (int64_t{c.tp()} * planner::CpOf(c) * dp) % experts != 0) {
    dp -= replicas;
  }
  if (dp < replicas) return std::nullopt;
  v1::Layout out;
  *out.mutable_config() = c;
  out.mutable_config()->set_dp(static_cast<int32_t>(dp));
  out.mutable_config()->set_dp_shard(static_cast<int32_t>(dp / replicas));
  for (int64_t r = 0; r < dp * model; ++r) *out.mutable_placement()->add_ranks() = alive[r];
  return out;
}

}  // namespace

int ReplicasOf(const v1::ParallelConfig& c) {
  const int shard = planner::DpShardOf(c);
  return shard > 0 && c.dp() % shard == 0 ? c.dp() / shard : 1;
}

std::vector<int> InPlaceRanks(const v1::Layout& current, const v1::Layout& target,
                              const planner::LostSet& lost) {
  const std::vector<v1::DeviceSlot> old_slots = planner::ExpandPlacement(current.placement());
  const std::vector<v1::DeviceSlot> new_slots = planner::ExpandPlacement(target.placement());
  std::vector<int> in_place;
  for (int rank : lost.ranks) {
    if (rank < 0 || rank >= static_cast<int>(old_slots.size())) continue;
    const v1::DeviceSlot& old = old_slots[rank];
    if (Contains(lost.hosts, old.host())) continue;
    const bool reused = std::any_of(new_slots.begin(), new_slots.end(), [&](const auto& s) {
      return s.host() == old.host() && s.device() == old.device();
    });
    if (reused && std::find(in_place.begin(), in_place.end(), rank) == in_place.end()) {
      in_place.push_back(rank);
    }
  }
  return in_place;
}

planner::LostSet JobLostSet(const google::protobuf::RepeatedPtrField<std::string>& job_lost_hosts,
                            std::vector<std::string> hosts, std::vector<int> ranks) {
  planner::LostSet lost;
  lost.hosts = std::move(hosts);
  for (const std::string& h : job_lost_hosts) {
    if (!Contains(lost.hosts, h)) lost.hosts.push_back(h);
  }
  lost.ranks = std::move(ranks);
  return lost;
}

planner::LostSet PlannerLostSet(const v1::Layout& current, const v1::Layout& target,
                                const planner::LostSet& lost) {
  const std::vector<int> in_place = InPlaceRanks(current, target, lost);
  planner::LostSet out;
  out.hosts = lost.hosts;
  for (int rank : lost.ranks) {
    if (std::find(in_place.begin(), in_place.end(), rank) == in_place.end()) {
      out.ranks.push_back(rank);
    }
  }
  return out;
}

absl::StatusOr<std::optional<std::string>> HostWhoseLossLosesState(const v1::Ptc& ptc,
                                                                   const v1::Layout& layout) {
  std::vector<std::string> hosts;
  for (const v1::DeviceSlot& s : planner::ExpandPlacement(layout.placement())) {
    if (!Contains(hosts, s.host())) hosts.push_back(s.host());
  }
  if (hosts.size() == 1) return hosts[0];  // nothing is left to hold anything
  const v1::Layout probe = ProbeTarget(layout);
  for (const std::string& host : hosts) {
    planner::LostSet lost;
    lost.hosts = {host};
    absl::StatusOr<planner::Plan> plan = planner::MakePlan(ptc, layout, probe, lost);
    if (absl::IsFailedPrecondition(plan.status())) return host;
    if (!plan.ok()) return plan.status();
  }
  return std::nullopt;
}

absl::StatusOr<std::vector<std::string>> RedundancyLost(const v1::Ptc& ptc,
                                                        const v1::Layout& current,
                                                        const v1::Layout& target) {
  std::vector<std::string> lost;
  const int had = ReplicasOf(current.config());
  if (had > 1 && ReplicasOf(target.config()) == 1) {
    lost.push_back(absl::StrCat("its HSDP replicas (", had, " replicas of dp_shard ",
                                planner::DpShardOf(current.config()), " -> one copy at dp ",
                                target.config().dp(), ")"));
  }
  absl::StatusOr<std::optional<std::string>> target_weak = HostWhoseLossLosesState(ptc, target);
  if (!target_weak.ok()) return target_weak.status();
  if (target_weak->has_value()) {
    absl::StatusOr<std::optional<std::string>> current_weak = HostWhoseLossLosesState(ptc, current);
    if (!current_weak.ok()) return current_weak.status();
    if (!current_weak->has_value()) {
      lost.push_back(absl::StrCat(
          "its ability to survive the loss of any one host (the current layout has it; with the "
          "target, losing host \"",
          **target_weak, "\" loses state no other host holds)"));
    }
  }
  return lost;
}

std::optional<v1::Layout> KeepingLayout(const v1::Ptc& ptc, const v1::Layout& current,
                                        const planner::LostSet& lost,
                                        const std::set<std::string>& alive_hosts) {
  const std::vector<v1::DeviceSlot> slots = planner::ExpandPlacement(current.placement());
  std::vector<v1::Layout> candidates;
  const bool in_place =
      lost.hosts.empty() && std::all_of(lost.ranks.begin(), lost.ranks.end(), [&](int r) {
        return r >= 0 && r < static_cast<int>(slots.size()) &&
               alive_hosts.count(slots[r].host()) > 0;
      });
  if (in_place) candidates.push_back(current);
  if (std::optional<v1::Layout> kept = ReplicaKeepingSurvivors(current, lost); kept.has_value()) {
    candidates.push_back(*std::move(kept));
  }
  if (absl::StatusOr<v1::Layout> survivors =
          planner::SurvivorLayout(current, lost.hosts, lost.ranks);
      survivors.ok()) {
    candidates.push_back(*std::move(survivors));
  }
  for (const v1::Layout& candidate : candidates) {
    if (!planner::ValidateLayout(ptc, candidate, "target").ok()) continue;
    absl::StatusOr<std::vector<std::string>> gives_up = RedundancyLost(ptc, current, candidate);
    if (!gives_up.ok() || !gives_up->empty()) continue;
    if (!planner::MakePlan(ptc, current, candidate, PlannerLostSet(current, candidate, lost))
             .ok()) {
      continue;
    }
    return candidate;
  }
  return std::nullopt;
}

std::string LayoutText(const v1::Layout& layout) {
  const v1::ParallelConfig& c = layout.config();
  std::string out = absl::StrCat("tp ", c.tp(), " pp ", c.pp(), " dp ", c.dp());
  if (c.dp_shard() > 0) absl::StrAppend(&out, " dp_shard ", c.dp_shard());
  if (planner::CpOf(c) > 1) absl::StrAppend(&out, " cp ", c.cp());
  if (planner::EpOf(c) > 1) absl::StrAppend(&out, " ep ", c.ep());
  const std::vector<v1::DeviceSlot> slots = planner::ExpandPlacement(layout.placement());
  absl::StrAppend(&out, " on");
  for (size_t r = 0; r < slots.size() && r < kMaxSlotsShown; ++r) {
    absl::StrAppend(&out, " ", slots[r].host(), ":", slots[r].device());
  }
  if (slots.size() > kMaxSlotsShown) {
    absl::StrAppend(&out, " ... (", slots.size(), " ranks)");
  }
  return out;
}

}  // namespace reshard::coordinator
