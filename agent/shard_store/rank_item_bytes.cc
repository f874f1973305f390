// RankItemBytes, LayoutItems, Checksum: what a rank buffer holds and where.
#include <xxhash.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/shard_store/shard_store.h"
#include "planner/bucket.h"
#include "planner/layout.h"
#include "planner/shard.h"
#include "planner/validate.h"

namespace reshard::agent {
namespace {

std::vector<int64_t> ItemBytesOfRank(const v1::Ptc& ptc, const planner::ResolvedLayout& rl,
                                     const planner::Buckets& buckets, int rank) {
  std::vector<int64_t> out;
  out.reserve(ptc.tensors_size() + ptc.blobs_size());
  for (int i = 0; i < ptc.tensors_size(); ++i) {
    const planner::CoordShard cs = planner::DeriveRankShard(ptc, i, rl, buckets, rank);
    out.push_back(cs.local_elements * planner::ElementBytes(ptc.tensors(i).dtype()));
  }
  for (const v1::BlobSpec& b : ptc.blobs()) out.push_back(b.size_bytes());
  return out;
}

}  // namespace

uint64_t Checksum(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

std::vector<int64_t> RankItemBytes(const v1::Ptc& ptc, const v1::Layout& layout, int rank) {
  planner::HostTable hosts;
  const planner::ResolvedLayout rl =
      planner::ResolvedLayout::Resolve(layout, ptc.num_layers(), &hosts);
  const planner::Buckets buckets(ptc, rl);
  return ItemBytesOfRank(ptc, rl, buckets, rank);
}

std::vector<std::vector<int64_t>> AllRankItemBytes(const v1::Ptc& ptc, const v1::Layout& layout) {
  planner::HostTable hosts;
  const planner::ResolvedLayout rl =
      planner::ResolvedLayout::Resolve(layout, ptc.num_layers(), &hosts);
  const planner::Buckets buckets(ptc, rl);
  std::vector<std::vector<int64_t>> out;
  out.reserve(rl.world());
  for (int rank = 0; rank < rl.world(); ++rank) {
    out.push_back(ItemBytesOfRank(ptc, rl, buckets, rank));
  }
  return out;
}

std::vector<ItemSlot> LayoutItems(const std::vector<int64_t>& item_bytes, int64_t* total_bytes) {
  std::vector<ItemSlot> slots;
  slots.reserve(item_bytes.size());
  int64_t end = 0;
  for (int64_t bytes : item_bytes) {
    ItemSlot slot;
    slot.offset = (end + kItemAlignment - 1) / kItemAlignment * kItemAlignment;
    slot.bytes = bytes;
    end = slot.offset + bytes;
    slots.push_back(slot);
  }
  if (total_bytes != nullptr) {
    *total_bytes = (end + kItemAlignment - 1) / kItemAlignment * kItemAlignment;
  }
  return slots;
}

std::string RankBufferFileName(const std::string& host_id, const RankBufferKey& key) {
  return absl::StrCat("reshard-", host_id, "-", key.job_id, "-g", key.generation, "-r", key.rank);
}

}  // namespace reshard::agent
