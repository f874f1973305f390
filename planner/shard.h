// Shard derivation: what each rank holds of each tensor under a layout.
// Pure functions; inputs must have passed validation.
#pragma once

#include <cstdint>
#include <vector>

#include "planner/geometry.h"
#include "planner/layout.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::planner {

/// A box of the global tensor and where it sits in the rank's local buffer.
struct Piece {
  Box global;
  View local;
};

/// What one (tp index, dp index) holds of one tensor. Every rank of a stage
/// that holds the tensor and has these indices holds exactly this.
struct CoordShard {
  int64_t local_elements = 0;  // buffer length, padding included
  int64_t padding_offset = 0;  // [padding_offset, local_elements) is zero
  std::vector<int64_t> local_shape;
  std::vector<Piece> pieces;  // disjoint; empty when the rank holds nothing
};

/// The tensor-parallel piece of index `tp_index`: boxes of the global tensor
/// and the shape of the rank's local (concatenated) tensor.
struct TpPiece {
  std::vector<int64_t> local_shape;
  struct Slab {
    Box global;
    Box local;  // the same elements in local-tensor coordinates
  };
  std::vector<Slab> slabs;
};
TpPiece DeriveTpPiece(const v1::TensorSpec& t, int tp, int tp_index);

/// The shard of (tp_index, dp_index) under tp x dp.
CoordShard DeriveCoordShard(const v1::TensorSpec& t, int tp, int dp, int tp_index, int dp_index);

/// Decomposes the flat range [begin, end) of a row-major tensor of `shape`
/// into at most 2 * ndim - 1 boxes, in memory order.
void FlatRangeToBoxes(int ndim, const int64_t* shape, int64_t begin, int64_t end,
                      std::vector<Box>* out);

/// Every shard of every tensor of `ptc` under `layout`, ranks ascending within
/// a tensor. For tooling and tests; the planner works on CoordShards.
std::vector<v1::Shard> DeriveShards(const v1::Ptc& ptc, const v1::Layout& layout);

}  // namespace reshard::planner
