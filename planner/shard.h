// Shard derivation: what each rank holds of each tensor under a layout
// (docs/partitioning.md). Pure functions; inputs must have passed validation.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "planner/geometry.h"
#include "planner/layout.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::planner {

class Buckets;

/// A box of the global (logical) tensor and where it sits in the rank's
/// local buffer.
struct Piece {
  Box global;
  View local;
};

/// The resolved coordinates a tensor's shard depends on: its tensor-parallel
/// size and index (tp, tp_i; expert tensors expert_tp, etp_i), its expert
/// slab (ep, ep_i; 1, 0 for a dense tensor), its data-parallel group size and
/// index (the shard group's S, s of docs/partitioning.md, "Data-parallel
/// groups"; G, g by default) and, for DP_BUCKET only, the range [flat_begin, flat_end) of
/// the local tensor's row-major elements the rank holds (Buckets::Range).
struct ShardCoord {
  int tp = 1, tp_index = 0;
  int ep = 1, ep_index = 0;
  int dp = 1, dp_index = 0;
  int64_t flat_begin = 0, flat_end = 0;
};

/// A dense tensor's coordinates under tp x dp (no cp, no experts).
inline ShardCoord DenseCoord(int tp, int dp, int tp_index, int dp_index) {
  ShardCoord c;
  c.tp = tp;
  c.tp_index = tp_index;
  c.dp = dp;
  c.dp_index = dp_index;
  return c;
}

/// The coordinates of the rank at `c` for tensor `t` (DP_BUCKET's range is
/// left empty: see Buckets::Range).
ShardCoord CoordOfRank(const v1::TensorSpec& t, const ResolvedLayout& rl, RankCoord c);

/// What one rank holds of one tensor. Ranks with equal ShardCoords hold
/// exactly the same.
struct CoordShard {
  int64_t local_elements = 0;  // buffer length, padding included
  // Start of the trailing zero run ([padding_offset, local_elements) is
  // zero); local_elements when the buffer does not end in padding.
  int64_t padding_offset = 0;
  std::vector<int64_t> local_shape;
  std::vector<Piece> pieces;  // disjoint; empty when the rank holds nothing
  // Every local position no piece covers, as sorted, disjoint, non-adjacent
  // (offset, count) runs: axis padding, the DP_FLAT tail.
  std::vector<std::pair<int64_t, int64_t>> padding;
};

/// The held shape of `t` under tensor-parallel size `tp` (`expert_tp` for an
/// expert tensor): `shape` with the padded axis rounded up.
std::vector<int64_t> HeldShape(const v1::TensorSpec& t, int tp);

/// The tensor-parallel piece (the local tensor T) of coordinates `c`: boxes
/// of the global tensor, the same elements in T's coordinates, and T's boxes
/// that are axis padding.
struct TpPiece {
  std::vector<int64_t> local_shape;
  struct Slab {
    Box global;
    Box local;  // the same elements in local-tensor coordinates
  };
  std::vector<Slab> slabs;  // non-padding
  std::vector<Box> pad;     // padding boxes of T
};
TpPiece DeriveTpPiece(const v1::TensorSpec& t, const ShardCoord& c);

/// The shard of coordinates `c`.
CoordShard DeriveCoordShard(const v1::TensorSpec& t, const ShardCoord& c);
/// The same with `tpp` = DeriveTpPiece(t, c) given (it depends only on the
/// tensor-parallel and expert indices: callers deriving many data-parallel
/// indices compute it once).
CoordShard DeriveCoordShard(const v1::TensorSpec& t, const ShardCoord& c, const TpPiece& tpp);

/// The shard rank `rank` holds of tensor `tensor` of `ptc` (nothing when its
/// stage does not hold the tensor). `buckets` is for DP_BUCKET tensors: built
/// from the same ptc and layout.
CoordShard DeriveRankShard(const v1::Ptc& ptc, int tensor, const ResolvedLayout& rl,
                           const Buckets& buckets, int rank);

/// Decomposes the flat range [begin, end) of a row-major tensor of `shape`
/// into at most 2 * ndim - 1 boxes, in memory order.
void FlatRangeToBoxes(int ndim, const int64_t* shape, int64_t begin, int64_t end,
                      std::vector<Box>* out);

/// Appends the contiguous runs (offset, count) of the local positions of box
/// `b` kept with view `v`, in the box's row-major order.
void AppendRuns(const Box& b, const View& v, std::vector<std::pair<int64_t, int64_t>>* out);

/// Every shard of every tensor of `ptc` under `layout`, ranks ascending within
/// a tensor. For tooling and tests; the planner works on CoordShards.
std::vector<v1::Shard> DeriveShards(const v1::Ptc& ptc, const v1::Layout& layout);

}  // namespace reshard::planner
