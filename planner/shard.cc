#include "planner/shard.h"

#include <algorithm>

#include "common/log.h"

namespace reshard::planner {
namespace {

Box WholeBox(int ndim, const int64_t* shape) {
  Box b;
  b.ndim = ndim;
  for (int d = 0; d < ndim; ++d) b.size[d] = shape[d];
  return b;
}

int64_t Product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t x : v) n *= x;
  return n;
}

// Pieces of the dp-local region `region` (a box of the tp-local tensor whose
// local view is `view`) in global coordinates: cut at the tp slabs.
void AppendPieces(const TpPiece& tp, const Box& region, const View& view, std::vector<Piece>* out) {
  for (const TpPiece::Slab& slab : tp.slabs) {
    Box in_local;
    if (!Intersect(region, slab.local, &in_local)) continue;
    Piece p;
    p.global.ndim = in_local.ndim;
    for (int d = 0; d < in_local.ndim; ++d) {
      p.global.offset[d] = slab.global.offset[d] + (in_local.offset[d] - slab.local.offset[d]);
      p.global.size[d] = in_local.size[d];
    }
    p.local = SubView(region, view, in_local);
    out->push_back(p);
  }
}

}  // namespace

TpPiece DeriveTpPiece(const v1::TensorSpec& t, int tp, int tp_index) {
  TpPiece piece;
  const int ndim = t.shape_size();
  piece.local_shape.assign(t.shape().begin(), t.shape().end());
  const Box whole = WholeBox(ndim, t.shape().data());
  if (t.partition().tp().mode() != v1::TP_SPLIT || tp == 1) {
    piece.slabs.push_back({whole, whole});
    return piece;
  }
  const int axis = t.partition().tp().axis();
  std::vector<int64_t> blocks(t.partition().tp().blocks().begin(),
                              t.partition().tp().blocks().end());
  if (blocks.empty()) blocks.push_back(t.shape(axis));
  int64_t block_start = 0, local_pos = 0;
  for (int64_t b : blocks) {
    const Part part = SplitPart(b, tp, tp_index);
    if (part.size > 0) {
      TpPiece::Slab slab{whole, whole};
      slab.global.offset[axis] = block_start + part.start;
      slab.global.size[axis] = part.size;
      slab.local.offset[axis] = local_pos;
      slab.local.size[axis] = part.size;
      piece.slabs.push_back(slab);
    }
    local_pos += part.size;
    block_start += b;
  }
  piece.local_shape[axis] = local_pos;
  return piece;
}

void FlatRangeToBoxes(int ndim, const int64_t* shape, int64_t begin, int64_t end,
                      std::vector<Box>* out) {
  if (begin >= end) return;
  // inner[d] = elements in one index step of dimension d.
  int64_t inner[kMaxDims];
  RowMajorStrides(ndim, shape, inner);
  // Recursive descent with an explicit prefix (the fixed leading indices).
  struct Frame {
    static void Go(int ndim, const int64_t* shape, const int64_t* inner, int d, int64_t b,
                   int64_t e, Box prefix, std::vector<Box>* out) {
      // [b, e) is relative to the start of the sub-tensor at dimension d.
      if (b >= e) return;
      if (d == ndim - 1) {
        prefix.offset[d] = b;
        prefix.size[d] = e - b;
        out->push_back(prefix);
        return;
      }
      const int64_t step = inner[d];
      int64_t i0 = b / step;
      if (b % step != 0) {
        const int64_t head_end = std::min(e, (i0 + 1) * step);
        Box p = prefix;
        p.offset[d] = i0;
        p.size[d] = 1;
        Go(ndim, shape, inner, d + 1, b - i0 * step, head_end - i0 * step, p, out);
        b = head_end;
        ++i0;
        if (b >= e) return;
      }
      const int64_t i1 = e / step;
      if (i1 > i0) {
        Box p = prefix;
        p.offset[d] = i0;
        p.size[d] = i1 - i0;
        for (int k = d + 1; k < ndim; ++k) {
          p.offset[k] = 0;
          p.size[k] = shape[k];
        }
        out->push_back(p);
      }
      if (e % step != 0 && i1 >= i0) {
        Box p = prefix;
        p.offset[d] = i1;
        p.size[d] = 1;
        Go(ndim, shape, inner, d + 1, 0, e - i1 * step, p, out);
      }
    }
  };
  Box prefix;
  prefix.ndim = ndim;
  Frame::Go(ndim, shape, inner, 0, begin, end, prefix, out);
}

CoordShard DeriveCoordShard(const v1::TensorSpec& t, int tp, int dp, int tp_index, int dp_index) {
  CoordShard shard;
  const TpPiece tpp = DeriveTpPiece(t, tp, tp_index);
  const int ndim = t.shape_size();
  const std::vector<int64_t>& tshape = tpp.local_shape;
  const v1::DataParallel& dpspec = t.partition().dp();
  if (dpspec.mode() == v1::DP_FLAT && dp > 1) {
    const int64_t n = Product(tshape);
    const int64_t chunk = (n + dp - 1) / dp;
    const int64_t begin = std::min(n, dp_index * chunk);
    const int64_t end = std::min(n, begin + chunk);
    shard.local_shape = {chunk};
    shard.local_elements = chunk;
    shard.padding_offset = end - begin;
    View base;
    RowMajorStrides(ndim, tshape.data(), base.strides);
    std::vector<Box> boxes;
    FlatRangeToBoxes(ndim, tshape.data(), begin, end, &boxes);
    for (const Box& b : boxes) {
      View v = base;
      for (int d = 0; d < ndim; ++d) v.offset += b.offset[d] * base.strides[d];
      v.offset -= begin;
      AppendPieces(tpp, b, v, &shard.pieces);
    }
    return shard;
  }
  Box region = WholeBox(ndim, tshape.data());
  shard.local_shape = tshape;
  if (dpspec.mode() == v1::DP_SPLIT && dp > 1) {
    const int axis = dpspec.axis();
    const Part part = SplitPart(tshape[axis], dp, dp_index);
    region.offset[axis] = part.start;
    region.size[axis] = part.size;
    shard.local_shape[axis] = part.size;
  }
  shard.local_elements = Product(shard.local_shape);
  shard.padding_offset = shard.local_elements;
  if (shard.local_elements == 0) return shard;
  View v;
  RowMajorStrides(ndim, shard.local_shape.data(), v.strides);
  AppendPieces(tpp, region, v, &shard.pieces);
  return shard;
}

std::vector<v1::Shard> DeriveShards(const v1::Ptc& ptc, const v1::Layout& layout) {
  HostTable hosts;
  const ResolvedLayout rl = ResolvedLayout::Resolve(layout, ptc.num_layers(), &hosts);
  std::vector<v1::Shard> out;
  std::vector<int> stages;
  for (const v1::TensorSpec& t : ptc.tensors()) {
    rl.StagesHolding(t.partition().pipeline(), &stages);
    for (int rank = 0; rank < rl.world(); ++rank) {
      const RankCoord c = rl.Coord(rank);
      if (std::find(stages.begin(), stages.end(), c.pp) == stages.end()) continue;
      const CoordShard cs = DeriveCoordShard(t, rl.tp(), rl.dp(), c.tp, c.dp);
      v1::Shard s;
      s.set_tensor(t.name());
      s.set_rank(rank);
      s.set_local_elements(cs.local_elements);
      s.set_padding_offset(cs.padding_offset);
      for (int64_t x : cs.local_shape) s.add_local_shape(x);
      for (const Piece& p : cs.pieces) {
        v1::ShardPiece* sp = s.add_pieces();
        for (int d = 0; d < p.global.ndim; ++d) {
          sp->mutable_global()->add_offset(p.global.offset[d]);
          sp->mutable_global()->add_size(p.global.size[d]);
          sp->add_local_strides(p.local.strides[d]);
        }
        sp->set_local_offset(p.local.offset);
      }
      out.push_back(std::move(s));
    }
  }
  return out;
}

}  // namespace reshard::planner
