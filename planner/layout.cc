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

int CpOf(const v1::ParallelConfig& c) { return c.cp() > 0 ? c.cp() : 1; }

int64_t WorldSize(const v1::ParallelConfig& c) {
  return int64_t{c.tp()} * CpOf(c) * c.dp() * c.pp();
}
int VppOf(const v1::ParallelConfig& c) { return c.vpp() > 0 ? c.vpp() : 1; }
int EpOf(const v1::ParallelConfig& c) { return c.ep() > 0 ? c.ep() : 1; }
int ExpertTpOf(const v1::ParallelConfig& c) { return c.expert_tp() > 0 ? c.expert_tp() : c.tp(); }
int DpShardOf(const v1::ParallelConfig& c) { return c.dp_shard() > 0 ? c.dp_shard() : c.dp(); }

std::vector<int> StageStarts(const v1::ParallelConfig& c, int num_layers) {
  if (c.stage_starts_size() > 0) return {c.stage_starts().begin(), c.stage_starts().end()};
  const int chunks = c.pp() * VppOf(c);
  std::vector<int> starts(chunks);
  for (int s = 0; s < chunks; ++s) {
    starts[s] = static_cast<int>(SplitPart(num_layers, chunks, s).start);
  }
  return starts;
}

ResolvedLayout ResolvedLayout::Resolve(const v1::Layout& layout, int num_layers, HostTable* hosts) {
  ResolvedLayout r;
  const v1::ParallelConfig& c = layout.config();
  r.tp_ = c.tp();
  r.pp_ = c.pp();
  r.dp_ = c.dp();
  r.cp_ = CpOf(c);
  r.vpp_ = VppOf(c);
  r.ep_ = EpOf(c);
  r.expert_tp_ = ExpertTpOf(c);
  r.dp_shard_ = DpShardOf(c);
  r.order_ = c.order();
  const std::vector<int> starts = StageStarts(c, num_layers);
  const int chunks = r.num_chunks();
  r.chunk_of_layer_.assign(num_layers, 0);
  for (int k = 0; k < chunks; ++k) {
    const int end = k + 1 < chunks ? starts[k + 1] : num_layers;
    for (int l = starts[k]; l < end; ++l) r.chunk_of_layer_[l] = k;
  }
  const std::vector<v1::DeviceSlot> slots = ExpandPlacement(layout.placement());
  RESHARD_CHECK(static_cast<int>(slots.size()) == r.world())
      << "placement of " << slots.size() << " ranks for world " << r.world();
  r.rank_at_.resize(r.world());
  for (int stage = 0; stage < r.pp_; ++stage) {
    for (int position = 0; position < r.stage_size(); ++position) {
      r.rank_at_[stage * r.stage_size() + position] = r.Rank(r.CoordAt(position, stage));
    }
  }
  r.host_.resize(slots.size());
  r.device_.resize(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    r.host_[i] = hosts->Intern(slots[i].host());
    r.device_[i] = slots[i].device();
  }
  return r;
}

RankCoord ResolvedLayout::Coord(int rank) const {
  RankCoord c;
  c.tp = rank % tp_;
  c.cp = (rank / tp_) % cp_;
  const int rest = rank / (tp_ * cp_);
  if (order_ == v1::RANK_ORDER_TP_PP_DP) {
    c.pp = rest % pp_;
    c.dp = rest / pp_;
  } else {
    c.dp = rest % dp_;
    c.pp = rest / dp_;
  }
  return c;
}

ExpertCoord ResolvedLayout::Expert(RankCoord c) const {
  const int l = PositionInStage(c);
  return ExpertCoord{l % expert_tp_, (l / expert_tp_) % ep_, l / (expert_tp_ * ep_)};
}

int ResolvedLayout::StageOfLayer(int layer) const { return chunk_of_layer_[layer] % pp_; }

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
    case v1::PIPELINE_FIRST_AND_LAST_STAGE:
      stages->push_back(0);
      if (pp_ > 1) stages->push_back(pp_ - 1);
      break;
    case v1::PIPELINE_LAYERS: {
      std::vector<char> holds(pp_, 0);
      for (int layer : p.layers()) holds[StageOfLayer(layer)] = 1;
      for (int s = 0; s < pp_; ++s) {
        if (holds[s]) stages->push_back(s);
      }
      break;
    }
    default:
      for (int s = 0; s < pp_; ++s) stages->push_back(s);
      break;
  }
}

int ResolvedLayout::ChunkOf(const v1::Pipeline& p, int stage) const {
  switch (p.mode()) {
    case v1::PIPELINE_LAYER:
      return ChunkOfLayer(p.layer());
    case v1::PIPELINE_FIRST_STAGE:
      return 0;
    case v1::PIPELINE_LAST_STAGE:
      return num_chunks() - 1;
    default:
      break;
  }
  if (p.mode() == v1::PIPELINE_LAYERS) {
    int best = -1;
    for (int layer : p.layers()) {
      const int k = ChunkOfLayer(layer);
      if (k % pp_ == stage && (best < 0 || k < best)) best = k;
    }
    if (best >= 0) return best;
  }
  if (stage == 0) return 0;
  if (stage == pp_ - 1) return num_chunks() - 1;
  return stage;
}

}  // namespace reshard::planner
