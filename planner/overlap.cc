#include "planner/overlap.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/shard.h"

namespace reshard::planner {

std::string TemplateKey(const v1::TensorSpec& t) {
  const v1::PartitionSpec& p = t.partition();
  std::string key =
      absl::StrCat(absl::StrJoin(t.shape(), ","), "|", p.tp().mode(), ":", p.tp().axis(), ":",
                   absl::StrJoin(p.tp().blocks(), ","), "|", p.dp().mode(), ":", p.dp().axis());
  return key;
}

namespace {

void AddCoordShard(const CoordShard& cs, int tp_index, int dp_index,
                   absl::flat_hash_map<std::string, int>* by_box, std::vector<Group>* groups) {
  for (const Piece& piece : cs.pieces) {
    std::string key(reinterpret_cast<const char*>(piece.global.offset),
                    sizeof(int64_t) * piece.global.ndim);
    key.append(reinterpret_cast<const char*>(piece.global.size),
               sizeof(int64_t) * piece.global.ndim);
    auto [it, inserted] = by_box->emplace(std::move(key), static_cast<int>(groups->size()));
    if (inserted) groups->push_back(Group{piece.global, {}});
    (*groups)[it->second].members.push_back(Member{tp_index, dp_index, piece.local});
  }
}
}  // namespace

Template BuildTemplate(const v1::TensorSpec& t, const ResolvedLayout& from,
                       const ResolvedLayout& to) {
  Template tpl;
  absl::flat_hash_map<std::string, int> by_box;
  for (int d = 0; d < from.dp(); ++d) {
    for (int i = 0; i < from.tp(); ++i) {
      AddCoordShard(DeriveCoordShard(t, from.tp(), from.dp(), i, d), i, d, &by_box,
                    &tpl.old_groups);
    }
  }
  by_box.clear();
  tpl.new_padding.resize(static_cast<size_t>(to.tp()) * to.dp());
  for (int d = 0; d < to.dp(); ++d) {
    for (int i = 0; i < to.tp(); ++i) {
      const CoordShard cs = DeriveCoordShard(t, to.tp(), to.dp(), i, d);
      tpl.new_padding[i + to.tp() * d] = {cs.padding_offset, cs.local_elements - cs.padding_offset};
      AddCoordShard(cs, i, d, &by_box, &tpl.new_groups);
    }
  }
  // Old groups sorted by their start on dimension 0 let each new group scan
  // only the old groups that can meet it there.
  std::vector<int> order(tpl.old_groups.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return tpl.old_groups[a].box.offset[0] < tpl.old_groups[b].box.offset[0];
  });
  for (size_t n = 0; n < tpl.new_groups.size(); ++n) {
    const Box& nb = tpl.new_groups[n].box;
    const int64_t n_end = nb.offset[0] + nb.size[0];
    for (int o : order) {
      const Box& ob = tpl.old_groups[o].box;
      if (ob.offset[0] >= n_end) break;
      Overlap ov{o, static_cast<int>(n), {}};
      if (Intersect(ob, nb, &ov.region)) tpl.overlaps.push_back(ov);
    }
  }
  return tpl;
}

}  // namespace reshard::planner
