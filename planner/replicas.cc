#include "planner/replicas.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "planner/layout.h"
#include "planner/validate.h"

namespace reshard::planner {
namespace {

// Replica 0 of one layout: its config (dp / count), for each of its ranks the
// job's rank, and the stride from replica k to k + 1.
struct OneReplica {
  v1::ParallelConfig config;
  std::vector<int> job_rank;
  int32_t stride = 0;
};

// Replica 0 of `layout` split `count` ways, or nothing when its ranks do not
// shift by a fixed stride (they do for every rank order: dp enters a rank
// linearly).
std::optional<OneReplica> ReplicaOf(const v1::Layout& layout, int num_layers, int count) {
  OneReplica out;
  out.config = layout.config();
  const int dp = layout.config().dp();
  if (dp % count != 0 || (dp / count) % DpShardOf(layout.config()) != 0) return std::nullopt;
  const int dr = dp / count;
  out.config.set_dp(dr);
  HostTable scratch;
  const ResolvedLayout whole = ResolvedLayout::Resolve(layout, num_layers, &scratch);
  // Replica 0's rank numbering only: one host holds its every rank here.
  v1::Layout numbering;
  *numbering.mutable_config() = out.config;
  numbering.mutable_placement()->add_hosts("replica");
  numbering.mutable_placement()->set_devices_per_host(static_cast<int>(WorldSize(out.config)));
  const ResolvedLayout one = ResolvedLayout::Resolve(numbering, num_layers, &scratch);
  RankCoord next;
  next.dp = dr;
  out.stride = whole.Rank(next) - whole.Rank(RankCoord{});
  out.job_rank.assign(one.world(), -1);
  for (int r = 0; r < whole.world(); ++r) {
    RankCoord c = whole.Coord(r);
    const int k = c.dp / dr;
    c.dp %= dr;
    const int j = one.Rank(c);
    const int at = whole.Rank(c);
    if (r != at + k * out.stride) return std::nullopt;
    out.job_rank[j] = at;
  }
  return out;
}

// Fills `split` for `count` replicas, or false.
bool Split(const v1::Ptc& ptc, const v1::Layout& from, const v1::Layout& to, int count,
           bool per_rank_blobs, ReplicaSplit* split) {
  const std::optional<OneReplica> a = ReplicaOf(from, ptc.num_layers(), count);
  const std::optional<OneReplica> b = ReplicaOf(to, ptc.num_layers(), count);
  if (!a || !b) return false;
  // A per-rank blob's new rank r takes old rank r mod the old world: the same
  // in every replica only when the ranks are.
  if (per_rank_blobs && (a->job_rank != b->job_rank || a->stride != b->stride)) return false;

  // Every host of replica k mirrors one of replica 0 (the same devices), in
  // both layouts alike, and belongs to no other replica.
  std::map<std::pair<int, std::string>, std::string> mirror;  // (k, host0) -> host
  absl::flat_hash_map<std::string, ReplicaSplit::HostOf> of;
  std::vector<std::string> order;
  auto check = [&](const v1::Layout& layout, const OneReplica& one) {
    const std::vector<v1::DeviceSlot> slots = ExpandPlacement(layout.placement());
    const int per = static_cast<int>(one.job_rank.size());
    for (int k = 0; k < count; ++k) {
      for (int j = 0; j < per; ++j) {
        const v1::DeviceSlot& s0 = slots[one.job_rank[j]];
        const v1::DeviceSlot& s = slots[one.job_rank[j] + k * one.stride];
        if (s.device() != s0.device()) return false;
        auto [m, new_pair] = mirror.emplace(std::make_pair(k, s0.host()), s.host());
        if (!new_pair && m->second != s.host()) return false;
        auto [h, new_host] = of.emplace(s.host(), ReplicaSplit::HostOf{k, s0.host()});
        if (!new_host && (h->second.replica != k || h->second.host0 != s0.host())) return false;
      }
    }
    for (const v1::DeviceSlot& s : slots) {
      if (std::find(order.begin(), order.end(), s.host()) == order.end()) order.push_back(s.host());
    }
    return true;
  };
  if (!check(from, *a) || !check(to, *b)) return false;

  auto layout_of = [](const v1::Layout& layout, const OneReplica& one) {
    v1::Layout out;
    *out.mutable_config() = one.config;
    const std::vector<v1::DeviceSlot> slots = ExpandPlacement(layout.placement());
    for (int r : one.job_rank) *out.mutable_placement()->add_ranks() = slots[r];
    return out;
  };
  split->count = count;
  split->from = layout_of(from, *a);
  split->to = layout_of(to, *b);
  if (!ValidateLayout(ptc, split->from, "layout").ok() ||
      !ValidateLayout(ptc, split->to, "target").ok()) {
    return false;
  }
  split->old_rank = a->job_rank;
  split->new_rank = b->job_rank;
  split->src_stride = a->stride;
  split->dst_stride = b->stride;
  split->hosts.clear();
  for (const std::string& h : order) split->hosts.emplace_back(h, of.at(h));
  return true;
}

}  // namespace

std::optional<ReplicaSplit> SplitReplicas(const v1::Ptc& ptc, const v1::Layout& from,
                                          const v1::Layout& to, const LostSet& lost) {
  if (!lost.hosts.empty() || !lost.ranks.empty()) return std::nullopt;
  for (const v1::TensorSpec& t : ptc.tensors()) {
    if (t.partition().has_expert()) return std::nullopt;
  }
  bool per_rank_blobs = false;
  for (const v1::BlobSpec& b : ptc.blobs()) per_rank_blobs |= b.scope() == v1::BLOB_PER_RANK;
  const int old_replicas = from.config().dp() / DpShardOf(from.config());
  const int new_replicas = to.config().dp() / DpShardOf(to.config());
  const int most = std::gcd(old_replicas, new_replicas);
  for (int count = most; count >= 2; --count) {
    if (most % count != 0) continue;
    ReplicaSplit split;
    if (Split(ptc, from, to, count, per_rank_blobs, &split)) return split;
  }
  return std::nullopt;
}

Plan RepeatOverReplicas(Plan one, const ReplicaSplit& split) {
  for (Plan::Step& s : one.steps) s.src_rank = split.old_rank[s.src_rank];
  for (Plan::Dst& d : one.dsts) d.rank = split.new_rank[d.rank];
  for (Plan::Fill& f : one.fills) f.rank = split.new_rank[f.rank];
  for (auto& [rank, item] : one.regenerate) rank = split.new_rank[rank];
  std::sort(one.regenerate.begin(), one.regenerate.end());
  one.replicas = Plan::Replicas{split.count, split.src_stride, split.dst_stride};
  one.bytes_local *= split.count;
  one.bytes_cross_host *= split.count;
  one.lower_bound_cross_host *= split.count;
  one.bytes_zero_filled *= split.count;
  one.cross_host_steps *= split.count;
  absl::flat_hash_map<std::string, Plan::HostStats> by_host;
  for (const Plan::HostStats& h : one.hosts) by_host[h.host] = h;
  one.hosts.clear();
  for (const auto& [host, of] : split.hosts) {
    Plan::HostStats h = by_host[of.host0];
    h.host = host;
    one.hosts.push_back(std::move(h));
  }
  return one;
}

}  // namespace reshard::planner
