#include "planner/overlap.h"

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "planner/bucket.h"
#include "planner/shard.h"

namespace reshard::planner {

std::string TemplateKey(const v1::TensorSpec& t, int tensor_index) {
  const v1::PartitionSpec& p = t.partition();
  if (p.dp().mode() == v1::DP_BUCKET) return absl::StrCat("bucket#", tensor_index);
  std::string key =
      absl::StrCat(absl::StrJoin(t.shape(), ","), "|", p.tp().mode(), ":", p.tp().axis(), ":",
                   absl::StrJoin(p.tp().blocks(), ","), "|", p.dp().mode(), ":", p.dp().axis());
  if (p.tp().granularity() > 1) absl::StrAppend(&key, "|u", p.tp().granularity());
  if (p.has_padding()) {
    absl::StrAppend(&key, "|pad", p.padding().axis(), ":", p.padding().multiple(), ":",
                    p.padding().times_tp());
  }
  if (p.has_expert()) absl::StrAppend(&key, "|e", p.expert().axis());
  // Same shape and rules but another data-parallel group: another template.
  if (p.dp().over() != v1::DP_OVER_DP_CP) absl::StrAppend(&key, "|over", p.dp().over());
  return key;
}

namespace {

struct BoxHash {
  size_t operator()(const Box& b) const {
    return absl::HashOf(absl::MakeConstSpan(b.offset, b.ndim), absl::MakeConstSpan(b.size, b.ndim));
  }
};
using BoxIndex = absl::flat_hash_map<Box, int, BoxHash>;

void AddCoordShard(const CoordShard& cs, int position, int stage, BoxIndex* by_box,
                   std::vector<Group>* groups) {
  for (const Piece& piece : cs.pieces) {
    auto [it, inserted] = by_box->emplace(piece.global, static_cast<int>(groups->size()));
    if (inserted) groups->push_back(Group{piece.global, {}});
    (*groups)[it->second].members.push_back(Member{position, stage, piece.local});
  }
}

// Groups and padding of one side: every position of every stage that holds
// the tensor (one pass with stage -1 unless the shards depend on the stage).
void BuildSide(const v1::Ptc& ptc, int tensor, const ResolvedLayout& rl, const Buckets& buckets,
               std::vector<Group>* groups, std::vector<PadRun>* padding) {
  const v1::TensorSpec& t = ptc.tensors(tensor);
  const v1::DpMode mode = t.partition().dp().mode();
  std::vector<int> stages{-1};
  if (mode == v1::DP_BUCKET) rl.StagesHolding(t.partition().pipeline(), &stages);
  BoxIndex by_box;
  // The local tensor of each tensor-parallel (and expert) index.
  std::vector<TpPiece> pieces;
  std::vector<int> piece_of;
  // Shards of equal coordinates are equal: derive each once. Index
  // tp_i + tp * (ep_i + ep * g) is below the stage size (tp * G for a dense
  // tensor, expert_tp * ep * edp for an expert one).
  std::vector<int> slot(rl.stage_size());
  std::vector<CoordShard> derived;
  for (int stage : stages) {
    std::fill(slot.begin(), slot.end(), -1);
    derived.clear();
    for (int l = 0; l < rl.stage_size(); ++l) {
      ShardCoord c = CoordOfRank(t, rl, rl.CoordAt(l, stage < 0 ? 0 : stage));
      if (mode == v1::DP_BUCKET) buckets.Range(tensor, stage, &c);
      const bool by_dp = mode != v1::DP_REPLICATED && c.dp > 1;
      int& k = slot[c.tp_index + c.tp * (c.ep_index + c.ep * (by_dp ? c.dp_index : 0))];
      if (k < 0) {
        const int tpi = c.tp_index + c.tp * c.ep_index;
        if (tpi >= static_cast<int>(piece_of.size())) piece_of.resize(tpi + 1, -1);
        if (piece_of[tpi] < 0) {
          piece_of[tpi] = static_cast<int>(pieces.size());
          pieces.push_back(DeriveTpPiece(t, c));
        }
        k = static_cast<int>(derived.size());
        derived.push_back(DeriveCoordShard(t, c, pieces[piece_of[tpi]]));
      }
      const CoordShard& cs = derived[k];
      AddCoordShard(cs, l, stage, &by_box, groups);
      if (padding != nullptr) {
        for (const auto& [offset, count] : cs.padding) {
          padding->push_back(PadRun{l, stage, offset, count});
        }
      }
    }
  }
  MakeDisjoint(groups);
}

// Recursive grid refinement of the boxes `active` (indices into `in`) on
// dimensions d.. inside `prefix`.
void Refine(const std::vector<Group>& in, const std::vector<int>& active, int d, Box prefix,
            std::vector<Group>* out) {
  if (d == prefix.ndim) {
    Group g{prefix, {}};
    for (int i : active) {
      for (const Member& m : in[i].members) {
        g.members.push_back(Member{m.position, m.stage, SubView(in[i].box, m.view, prefix)});
      }
    }
    out->push_back(std::move(g));
    return;
  }
  std::vector<int64_t> cuts;
  for (int i : active) {
    cuts.push_back(in[i].box.offset[d]);
    cuts.push_back(in[i].box.offset[d] + in[i].box.size[d]);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<int> inner;
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    inner.clear();
    for (int i : active) {
      const Box& b = in[i].box;
      if (b.offset[d] <= cuts[k] && cuts[k + 1] <= b.offset[d] + b.size[d]) inner.push_back(i);
    }
    if (inner.empty()) continue;
    prefix.offset[d] = cuts[k];
    prefix.size[d] = cuts[k + 1] - cuts[k];
    Refine(in, inner, d + 1, prefix, out);
  }
}

}  // namespace

void MakeDisjoint(std::vector<Group>* groups) {
  const int n = static_cast<int>(groups->size());
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return (*groups)[a].box.offset[0] < (*groups)[b].box.offset[0]; });
  std::vector<char> meets(n, 0);
  bool any = false;
  for (int a = 0; a < n; ++a) {
    const Box& ba = (*groups)[order[a]].box;
    const int64_t end = ba.offset[0] + ba.size[0];
    for (int b = a + 1; b < n; ++b) {
      const Box& bb = (*groups)[order[b]].box;
      if (bb.offset[0] >= end) break;
      Box x;
      if (Intersect(ba, bb, &x)) meets[order[a]] = meets[order[b]] = any = true;
    }
  }
  if (!any) return;
  std::vector<Group> out;
  std::vector<int> active;
  for (int i = 0; i < n; ++i) {
    if (meets[i]) {
      active.push_back(i);
    } else {
      out.push_back(std::move((*groups)[i]));
    }
  }
  Box prefix;
  prefix.ndim = (*groups)[active[0]].box.ndim;
  Refine(*groups, active, 0, prefix, &out);
  *groups = std::move(out);
}

Template BuildTemplate(const v1::Ptc& ptc, int tensor, const ResolvedLayout& from,
                       const Buckets& from_buckets, const ResolvedLayout& to,
                       const Buckets& to_buckets) {
  Template tpl;
  BuildSide(ptc, tensor, from, from_buckets, &tpl.old_groups, nullptr);
  BuildSide(ptc, tensor, to, to_buckets, &tpl.new_groups, &tpl.new_padding);
  // Old groups sorted by their start on dimension 0 let each new group scan
  // only the old groups that can meet it there.
  std::vector<int> order(tpl.old_groups.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return tpl.old_groups[a].box.offset[0] < tpl.old_groups[b].box.offset[0];
  });
  // reach[k]: the furthest end on dimension 0 of the first k + 1 old groups
  // in that order; a new group starts scanning at the first that reaches it.
  std::vector<int64_t> reach(order.size());
  int64_t furthest = INT64_MIN;
  for (size_t k = 0; k < order.size(); ++k) {
    const Box& ob = tpl.old_groups[order[k]].box;
    furthest = std::max(furthest, ob.offset[0] + ob.size[0]);
    reach[k] = furthest;
  }
  for (size_t n = 0; n < tpl.new_groups.size(); ++n) {
    const Box& nb = tpl.new_groups[n].box;
    const int64_t n_end = nb.offset[0] + nb.size[0];
    const size_t first = std::upper_bound(reach.begin(), reach.end(), nb.offset[0]) - reach.begin();
    for (size_t k = first; k < order.size(); ++k) {
      const int o = order[k];
      const Box& ob = tpl.old_groups[o].box;
      if (ob.offset[0] >= n_end) break;
      Overlap ov{o, static_cast<int>(n), {}};
      if (Intersect(ob, nb, &ov.region)) tpl.overlaps.push_back(ov);
    }
  }
  return tpl;
}

}  // namespace reshard::planner
