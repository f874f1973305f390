// Bucket layout (docs/partitioning.md, "Buckets"): where each DP_BUCKET
// member starts in its chunk's flattened buffer, and which bucket holds it.
// Immutable after construction; thread-safe to read.
#pragma once

#include <cstdint>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "planner/layout.h"
#include "planner/shard.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::planner {

/// A member's place in its chunk's buffer: its start, its element count N
/// and the bucket [bucket_begin, bucket_begin + bucket_size) holding it.
struct BucketSlot {
  int64_t start = 0;
  int64_t elements = 0;
  int64_t bucket_begin = 0;
  int64_t bucket_size = 0;
};

class Buckets {
 public:
  /// `ptc` and `rl` must be valid (validate.h); lays out every group on
  /// every stage for every tensor-parallel (dense: tp_i; expert: etp_i, ep_i)
  /// index.
  Buckets(const v1::Ptc& ptc, const ResolvedLayout& rl);

  /// The slot of DP_BUCKET tensor `tensor` on `stage` (which holds it) for
  /// the tensor-parallel index of `c`.
  const BucketSlot& Slot(int tensor, int stage, const ShardCoord& c) const;

  /// Sets c->flat_begin/flat_end: the elements of the local tensor that fall
  /// into the shard of index c->dp_index of the group (size c->dp).
  void Range(int tensor, int stage, ShardCoord* c) const;

 private:
  // (tensor, stage, tp_index, ep_index)
  using Key = std::tuple<int, int, int, int>;
  absl::flat_hash_map<Key, BucketSlot> slots_;
};

/// Lays out members of `elements` each (in member order) into buckets;
/// returns one slot per member. `group_size` is the data-parallel group size.
std::vector<BucketSlot> LayOutBucket(const v1::BucketGroup& group, int group_size,
                                     const std::vector<int64_t>& elements);

}  // namespace reshard::planner
