#include "verifier/grid.h"

#include <cstdint>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace reshard::verifier {
namespace {

constexpr int kMaxWorld = 1 << 16;

// A size field: 0 means `zero_means`; negative or huge is invalid.
absl::StatusOr<int> Size(int value, int zero_means, const std::string& what, const char* field) {
  if (value == 0) return zero_means;
  if (value < 0 || value > kMaxWorld) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", field, " is ", value));
  }
  return value;
}

absl::Status ParseChunks(const v1::ParallelConfig& c, int num_layers, const std::string& what,
                         RankGrid* g) {
  const int chunks = g->pp * g->vpp;
  g->chunk_begin.assign(chunks + 1, num_layers);
  if (c.stage_starts_size() == 0) {
    for (int k = 0; k < chunks; ++k) g->chunk_begin[k] = PartStart(num_layers, chunks, k);
    return absl::OkStatus();
  }
  if (c.stage_starts_size() != chunks || c.stage_starts(0) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": stage_starts [", absl::StrJoin(c.stage_starts(), ", "), "] for pp ",
                     g->pp, " x vpp ", g->vpp, " chunks"));
  }
  for (int k = 0; k < chunks; ++k) {
    g->chunk_begin[k] = c.stage_starts(k);
    if ((k > 0 && g->chunk_begin[k] <= g->chunk_begin[k - 1]) || g->chunk_begin[k] >= num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": stage_starts[", k, "] = ", g->chunk_begin[k], " invalid"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParsePlacement(const v1::Placement& pl, const std::string& what,
                            std::vector<std::string>* hosts, std::map<std::string, int>* host_index,
                            RankGrid* g) {
  std::vector<std::pair<std::string, int>> slots;
  if (pl.ranks_size() > 0) {
    if (pl.hosts_size() > 0 || pl.ranks_size() != g->world) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": placement has ", pl.ranks_size(),
                                                     " rank slots for world ", g->world));
    }
    for (const auto& s : pl.ranks()) slots.emplace_back(s.host(), s.device());
  } else {
    const int dph = pl.devices_per_host();
    if (dph < 1 || int64_t{pl.hosts_size()} * dph < g->world) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": placement ", pl.hosts_size(),
                                                     " hosts x ", dph,
                                                     " devices is too small for world ", g->world));
    }
    for (int r = 0; r < g->world; ++r) slots.emplace_back(pl.hosts(r / dph), r % dph);
  }
  std::set<std::pair<std::string, int>> seen;
  for (int r = 0; r < g->world; ++r) {
    if (!seen.insert(slots[r]).second || slots[r].second < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: rank %d on (host \"%s\", device %d) which is invalid or taken", what,
                          r, slots[r].first, slots[r].second));
    }
    auto [it, fresh] = host_index->emplace(slots[r].first, static_cast<int>(hosts->size()));
    if (fresh) hosts->push_back(slots[r].first);
    g->host.push_back(it->second);
    g->device.push_back(slots[r].second);
  }
  return absl::OkStatus();
}

// The chunk owning `layer` (chunks may be empty under an even split).
int ChunkOfLayer(const RankGrid& g, int64_t layer) {
  const int chunks = g.pp * g.vpp;
  for (int k = 0; k < chunks; ++k) {
    if (g.chunk_begin[k] <= layer && layer < g.chunk_begin[k + 1]) return k;
  }
  return -1;
}

}  // namespace

Coords CoordsOf(const RankGrid& g, int r) {
  Coords c;
  c.tp_i = r % g.tp;
  const int rest = r / g.tp;  // cp_i + cp * (dp_i + dp * pp_i), or with pp and dp swapped
  c.cp_i = rest % g.cp;
  const int outer = rest / g.cp;
  if (g.order == v1::RANK_ORDER_TP_PP_DP) {
    c.pp_i = outer % g.pp;
    c.dp_i = outer / g.pp;
  } else {
    c.dp_i = outer % g.dp;
    c.pp_i = outer / g.dp;
  }
  const int l = c.tp_i + g.tp * (c.cp_i + g.cp * c.dp_i);
  c.etp_i = l % g.expert_tp;
  c.ep_i = (l / g.expert_tp) % g.ep;
  c.edp_i = l / (g.expert_tp * g.ep);
  return c;
}

absl::StatusOr<RankGrid> ParseGrid(const v1::Layout& layout, int num_layers,
                                   const std::string& what, std::vector<std::string>* hosts,
                                   std::map<std::string, int>* host_index) {
  const auto& c = layout.config();
  RankGrid g;
  if (c.tp() < 1 || c.pp() < 1 || c.dp() < 1 || c.tp() > kMaxWorld || c.pp() > kMaxWorld ||
      c.dp() > kMaxWorld) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: (tp, pp, dp) = (%d, %d, %d) invalid", what, c.tp(), c.pp(), c.dp()));
  }
  g.tp = c.tp();
  g.pp = c.pp();
  g.dp = c.dp();
  absl::StatusOr<int> v = Size(c.cp(), 1, what, "cp");
  if (!v.ok()) return v.status();
  g.cp = *v;
  if (v = Size(c.vpp(), 1, what, "vpp"); !v.ok()) return v.status();
  g.vpp = *v;
  if (v = Size(c.ep(), 1, what, "ep"); !v.ok()) return v.status();
  g.ep = *v;
  if (v = Size(c.expert_tp(), g.tp, what, "expert_tp"); !v.ok()) return v.status();
  g.expert_tp = *v;
  const int64_t world = int64_t{g.tp} * g.cp * g.dp * g.pp;
  if (world > kMaxWorld || int64_t{g.pp} * g.vpp > kMaxWorld) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: tp %d x cp %d x dp %d x pp %d (vpp %d) is too large", what, g.tp, g.cp,
                        g.dp, g.pp, g.vpp));
  }
  g.world = static_cast<int>(world);
  const int stage_ranks = g.tp * g.cp * g.dp;
  if (stage_ranks % (int64_t{g.expert_tp} * g.ep) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: tp %d x cp %d x dp %d is not a multiple of expert_tp %d x ep %d", what,
                        g.tp, g.cp, g.dp, g.expert_tp, g.ep));
  }
  g.edp = stage_ranks / (g.expert_tp * g.ep);
  // "Data-parallel groups": dp_shard divides dp, 0 meaning dp.
  if (c.dp_shard() < 0 || c.dp_shard() > g.dp || (c.dp_shard() > 0 && g.dp % c.dp_shard() != 0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: dp_shard %d does not divide dp %d", what, c.dp_shard(), g.dp));
  }
  g.dp_shard = c.dp_shard() == 0 ? g.dp : c.dp_shard();
  if (c.order() != v1::RANK_ORDER_TP_DP_PP && c.order() != v1::RANK_ORDER_TP_PP_DP) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": unknown rank order ", c.order()));
  }
  g.order = c.order();
  if (absl::Status s = ParseChunks(c, num_layers, what, &g); !s.ok()) return s;
  if (absl::Status s = ParsePlacement(layout.placement(), what, hosts, host_index, &g); !s.ok()) {
    return s;
  }
  return g;
}

bool StageHolds(const v1::TensorSpec& t, const RankGrid& g, int stage) {
  const auto& p = t.partition().pipeline();
  switch (p.mode()) {
    case v1::PIPELINE_LAYER:
      return ChunkOfLayer(g, p.layer()) % g.pp == stage;
    case v1::PIPELINE_FIRST_STAGE:
      return stage == 0;
    case v1::PIPELINE_LAST_STAGE:
      return stage == g.pp - 1;
    case v1::PIPELINE_FIRST_AND_LAST_STAGE:
      return stage == 0 || stage == g.pp - 1;
    case v1::PIPELINE_LAYERS:
      for (int layer : p.layers()) {
        if (ChunkOfLayer(g, layer) % g.pp == stage) return true;
      }
      return false;
    default:  // PIPELINE_EVERY_STAGE
      return true;
  }
}

int ChunkOf(const v1::TensorSpec& t, const RankGrid& g, int stage) {
  const auto& p = t.partition().pipeline();
  const int last = g.pp * g.vpp - 1;
  switch (p.mode()) {
    case v1::PIPELINE_LAYER:
      return ChunkOfLayer(g, p.layer());
    case v1::PIPELINE_FIRST_STAGE:
      return 0;
    case v1::PIPELINE_LAST_STAGE:
      return last;
    case v1::PIPELINE_LAYERS: {
      int first = -1;
      for (int layer : p.layers()) {
        const int k = ChunkOfLayer(g, layer);
        if (k % g.pp == stage && (first < 0 || k < first)) first = k;
      }
      return first;
    }
    default:  // every stage, first and last stage
      if (stage == 0) return 0;
      if (stage == g.pp - 1) return last;
      return stage;
  }
}

}  // namespace reshard::verifier
