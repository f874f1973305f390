#include "planner/layout.h"

#include "common/log.h"
#include "planner/geometry.h"

namespace reshard::planner {

int HostTable::Intern(const std::string& name) {
  auto [it, inserted] = index_.emplace(name, static_cast<int>(names_.size()));
  if (inserted) names_.push_back(name);
  return it->second;
}

int HostTable::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

std::vector<v1::DeviceSlot> ExpandPlacement(const v1::Placement& p) {
  std::vector<v1::DeviceSlot> out(p.ranks().begin(), p.ranks().end());
  if (out.empty() && p.devices_per_host() > 0) {
    out.reserve(static_cast<size_t>(p.hosts_size()) * p.devices_per_host());
    for (const std::string& h : p.hosts()) {
      for (int d = 0; d < p.devices_per_host(); ++d) {
        v1::DeviceSlot s;
        s.set_host(h);
        s.set_device(d);
        out.push_back(std::move(s));
      }
    }
  }
  return out;
}

std::vector<int> StageStarts(const v1::ParallelConfig& c, int num_layers) {
  if (c.stage_starts_size() > 0) return {c.stage_starts().begin(), c.stage_starts().end()};
  std::vector<int> starts(c.pp());
  for (int s = 0; s < c.pp(); ++s) {
    starts[s] = static_cast<int>(SplitPart(num_layers, c.pp(), s).start);
  }
  return starts;
}

ResolvedLayout ResolvedLayout::Resolve(const v1::Layout& layout, int num_layers, HostTable* hosts) {
  ResolvedLayout r;
  const v1::ParallelConfig& c = layout.config();
  r.tp_ = c.tp();
  r.pp_ = c.pp();
  r.dp_ = c.dp();
  r.order_ = c.order();
  const std::vector<int> starts = StageStarts(c, num_layers);
  r.stage_of_layer_.assign(num_layers, 0);
  for (int s = 0; s < r.pp_; ++s) {
    const int end = s + 1 < r.pp_ ? starts[s + 1] : num_layers;
    for (int l = starts[s]; l < end; ++l) r.stage_of_layer_[l] = s;
  }
  const std::vector<v1::DeviceSlot> slots = ExpandPlacement(layout.placement());
  RESHARD_CHECK(static_cast<int>(slots.size()) == r.world())
      << "placement of " << slots.size() << " ranks for world " << r.world();
  r.host_.resize(slots.size());
  r.device_.resize(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    r.host_[i] = hosts->Intern(slots[i].host());
    r.device_[i] = slots[i].device();
  }
  return r;
}

int ResolvedLayout::Rank(RankCoord c) const {
  if (order_ == v1::RANK_ORDER_TP_PP_DP) return c.tp + tp_ * (c.pp + pp_ * c.dp);
  return c.tp + tp_ * (c.dp + dp_ * c.pp);
}

RankCoord ResolvedLayout::Coord(int rank) const {
  RankCoord c;
  c.tp = rank % tp_;
  const int rest = rank / tp_;
  if (order_ == v1::RANK_ORDER_TP_PP_DP) {
    c.pp = rest % pp_;
    c.dp = rest / pp_;
  } else {
    c.dp = rest % dp_;
    c.pp = rest / dp_;
  }
  return c;
}

int ResolvedLayout::StageOfLayer(int layer) const { return stage_of_layer_[layer]; }

void ResolvedLayout::StagesHolding(const v1::Pipeline& p, std::vector<int>* stages) const {
  stages->clear();
  switch (p.mode()) {
    case v1::PIPELINE_LAYER:
      stages->push_back(StageOfLayer(p.layer()));
      break;
    case v1::PIPELINE_FIRST_STAGE:
      stages->push_back(0);
      break;
    case v1::PIPELINE_LAST_STAGE:
      stages->push_back(pp_ - 1);
      break;
    default:
      for (int s = 0; s < pp_; ++s) stages->push_back(s);
      break;
  }
}

}  // namespace reshard::planner
