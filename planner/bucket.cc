#include "planner/bucket.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <string>

#include "common/log.h"

namespace reshard::planner {

std::vector<BucketSlot> LayOutBucket(const v1::BucketGroup& group, int group_size,
                                     const std::vector<int64_t>& elements) {
  const int64_t a = std::max<int64_t>(group.param_align(), 1);
  const int64_t q = std::lcm(int64_t{group_size}, std::max<int64_t>(group.pad_multiple(), 1));
  std::vector<BucketSlot> out(elements.size());
  int64_t pos = 0, bucket_start = 0;
  size_t first_open = 0;  // first member of the open bucket
  const auto close = [&](size_t end_member) {
    const int64_t padded = (pos - bucket_start + q - 1) / q * q;
    for (size_t m = first_open; m < end_member; ++m) {
      out[m].bucket_begin = bucket_start;
      out[m].bucket_size = padded;
    }
    first_open = end_member;
    pos = bucket_start = bucket_start + padded;
  };
  for (size_t m = 0; m < elements.size(); ++m) {
    pos = (pos + a - 1) / a * a;
    out[m].start = pos;
    out[m].elements = elements[m];
    pos += elements[m];
    if (group.bucket_elements() > 0 && pos - bucket_start >= group.bucket_elements()) close(m + 1);
  }
  if (first_open < elements.size()) close(elements.size());
  return out;
}

Buckets::Buckets(const v1::Ptc& ptc, const ResolvedLayout& rl) {
  if (ptc.buckets_size() == 0) return;
  std::map<std::string, int> group_index;
  for (int g = 0; g < ptc.buckets_size(); ++g) group_index.emplace(ptc.buckets(g).name(), g);
  // (group, stage, chunk) -> members in PTC order.
  std::map<std::tuple<int, int, int>, std::vector<int>> members;
  std::vector<int> stages;
  for (int ti = 0; ti < ptc.tensors_size(); ++ti) {
    const v1::TensorSpec& t = ptc.tensors(ti);
    if (t.partition().dp().mode() != v1::DP_BUCKET) continue;
    const int g = group_index.at(t.partition().dp().bucket());
    rl.StagesHolding(t.partition().pipeline(), &stages);
    for (int s : stages) {
      members[{g, s, rl.ChunkOf(t.partition().pipeline(), s)}].push_back(ti);
    }
  }
  std::vector<int64_t> elements;
  for (auto& [key, list] : members) {
    const v1::BucketGroup& group = ptc.buckets(std::get<0>(key));
    const int stage = std::get<1>(key);
    if (group.reverse_order()) std::reverse(list.begin(), list.end());
    const bool expert = ptc.tensors(list[0]).partition().has_expert();
    ShardCoord c;
    c.tp = expert ? rl.expert_tp() : rl.tp();
    c.ep = expert ? rl.ep() : 1;
    // Members are all dense or all expert, and dense members split over
    // dp x cp (validation): the HSDP shard group dp_shard x cp.
    const int group_size = expert ? rl.edp() : rl.dp_shard() * rl.cp();
    for (c.tp_index = 0; c.tp_index < c.tp; ++c.tp_index) {
      for (c.ep_index = 0; c.ep_index < c.ep; ++c.ep_index) {
        elements.clear();
        for (int ti : list) {
          int64_t n = 1;
          for (int64_t x : DeriveTpPiece(ptc.tensors(ti), c).local_shape) n *= x;
          elements.push_back(n);
        }
        const std::vector<BucketSlot> slots = LayOutBucket(group, group_size, elements);
        for (size_t m = 0; m < list.size(); ++m) {
          slots_[Key{list[m], stage, c.tp_index, c.ep_index}] = slots[m];
        }
      }
    }
  }
}

const BucketSlot& Buckets::Slot(int tensor, int stage, const ShardCoord& c) const {
  auto it = slots_.find(Key{tensor, stage, c.tp_index, c.ep_index});
  RESHARD_CHECK(it != slots_.end()) << "no bucket slot for tensor " << tensor << " stage " << stage;
  return it->second;
}

void Buckets::Range(int tensor, int stage, ShardCoord* c) const {
  const BucketSlot& s = Slot(tensor, stage, *c);
  const int64_t share = s.bucket_size / c->dp;
  const int64_t lo = s.bucket_begin + c->dp_index * share;
  const int64_t hi = lo + share;
  c->flat_begin = std::clamp(lo - s.start, int64_t{0}, s.elements);
  c->flat_end = std::max(c->flat_begin, std::clamp(hi - s.start, int64_t{0}, s.elements));
}

}  // namespace reshard::planner
