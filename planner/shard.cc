#include "planner/shard.h"

#include <algorithm>
#include <tuple>

#include "common/log.h"
#include "planner/bucket.h"

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

// The padding runs of the dp-local region `region` (view `view`).
void AppendPadding(const TpPiece& tp, const Box& region, const View& view,
                   std::vector<std::pair<int64_t, int64_t>>* out) {
  for (const Box& pad : tp.pad) {
    Box in_local;
    if (Intersect(region, pad, &in_local))
      AppendRuns(in_local, SubView(region, view, in_local), out);
  }
}

// Sorts and merges adjacent runs.
void NormalizeRuns(std::vector<std::pair<int64_t, int64_t>>* runs) {
  if (runs->size() < 2) return;
  std::sort(runs->begin(), runs->end());
  size_t w = 0;
  for (size_t r = 1; r < runs->size(); ++r) {
    auto& last = (*runs)[w];
    if (last.first + last.second == (*runs)[r].first) {
      last.second += (*runs)[r].second;
    } else {
      (*runs)[++w] = (*runs)[r];
    }
  }
  runs->resize(w + 1);
}

bool IsExpert(const v1::TensorSpec& t) { return t.partition().has_expert(); }

}  // namespace

std::vector<int64_t> HeldShape(const v1::TensorSpec& t, int tp) {
  std::vector<int64_t> held(t.shape().begin(), t.shape().end());
  if (!t.partition().has_padding()) return held;
  const v1::AxisPadding& p = t.partition().padding();
  const int64_t m = std::max<int64_t>(p.multiple(), 1) * (p.times_tp() ? tp : 1);
  held[p.axis()] = (held[p.axis()] + m - 1) / m * m;
  return held;
}

ShardCoord CoordOfRank(const v1::TensorSpec& t, const ResolvedLayout& rl, RankCoord c) {
  ShardCoord out;
  if (IsExpert(t)) {
    const ExpertCoord e = rl.Expert(c);
    out.tp = rl.expert_tp();
    out.tp_index = e.etp;
    out.ep = rl.ep();
    out.ep_index = e.ep;
    out.dp = rl.edp();
    out.dp_index = e.edp;
  } else {
    out.tp = rl.tp();
    out.tp_index = c.tp;
    std::tie(out.dp, out.dp_index) = rl.ShardGroup(t.partition().dp().over(), c);
  }
  return out;
}

TpPiece DeriveTpPiece(const v1::TensorSpec& t, const ShardCoord& c) {
  TpPiece piece;
  const int ndim = t.shape_size();
  const v1::PartitionSpec& ps = t.partition();
  piece.local_shape = HeldShape(t, c.tp);
  Box global = WholeBox(ndim, piece.local_shape.data());
  if (IsExpert(t)) {
    const int axis = ps.expert().axis();
    const Part part = SplitPart(piece.local_shape[axis], c.ep, c.ep_index);
    global.offset[axis] = part.start;
    global.size[axis] = part.size;
    piece.local_shape[axis] = part.size;
  }
  const Box local = WholeBox(ndim, piece.local_shape.data());
  std::vector<TpPiece::Slab> slabs;
  if (ps.tp().mode() != v1::TP_SPLIT || c.tp == 1) {
    slabs.push_back({global, local});
  } else {
    const int axis = ps.tp().axis();
    std::vector<int64_t> blocks(ps.tp().blocks().begin(), ps.tp().blocks().end());
    if (blocks.empty()) blocks.push_back(piece.local_shape[axis]);
    const int64_t u = std::max<int64_t>(ps.tp().granularity(), 1);
    int64_t block_start = 0, local_pos = 0;
    for (int64_t b : blocks) {
      const int64_t n = b / u;
      Part part;
      if (ps.tp().granularity() == 0) {
        part = SplitPart(b, c.tp, c.tp_index);  // element-wise, possibly empty
      } else if (n >= c.tp) {
        part = SplitPart(n, c.tp, c.tp_index);
      } else {
        part = Part{int64_t{c.tp_index} * n / c.tp, 1};  // units and replication
      }
      if (part.size > 0) {
        TpPiece::Slab slab{global, local};
        slab.global.offset[axis] = block_start + u * part.start;
        slab.global.size[axis] = u * part.size;
        slab.local.offset[axis] = local_pos;
        slab.local.size[axis] = u * part.size;
        slabs.push_back(slab);
      }
      local_pos += u * part.size;
      block_start += b;
    }
    piece.local_shape[axis] = local_pos;
  }
  // Cut each slab at the logical end of the padded axis.
  const int pa = ps.has_padding() ? ps.padding().axis() : -1;
  for (const TpPiece::Slab& slab : slabs) {
    if (slab.global.Empty()) continue;
    if (pa < 0 || slab.global.offset[pa] + slab.global.size[pa] <= t.shape(pa)) {
      piece.slabs.push_back(slab);
      continue;
    }
    const int64_t keep = std::max<int64_t>(0, t.shape(pa) - slab.global.offset[pa]);
    if (keep > 0) {
      TpPiece::Slab head = slab;
      head.global.size[pa] = keep;
      head.local.size[pa] = keep;
      piece.slabs.push_back(head);
    }
    Box pad = slab.local;
    pad.offset[pa] += keep;
    pad.size[pa] -= keep;
    piece.pad.push_back(pad);
  }
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

void AppendRuns(const Box& b, const View& v, std::vector<std::pair<int64_t, int64_t>>* out) {
  if (b.Empty()) return;
  // The innermost dimensions that are contiguous form one run.
  int k = b.ndim - 1;
  int64_t run = 1;
  while (k >= 0 && (b.size[k] == 1 || v.strides[k] == run)) {
    run *= b.size[k];
    --k;
  }
  if (k < 0) {
    out->emplace_back(v.offset, run);
    return;
  }
  int64_t idx[kMaxDims] = {};
  for (;;) {
    int64_t off = v.offset;
    for (int d = 0; d <= k; ++d) off += idx[d] * v.strides[d];
    out->emplace_back(off, run);
    int d = k;
    while (d >= 0 && ++idx[d] == b.size[d]) idx[d--] = 0;
    if (d < 0) break;
  }
}

CoordShard DeriveCoordShard(const v1::TensorSpec& t, const ShardCoord& c) {
  return DeriveCoordShard(t, c, DeriveTpPiece(t, c));
}

CoordShard DeriveCoordShard(const v1::TensorSpec& t, const ShardCoord& c, const TpPiece& tpp) {
  CoordShard shard;
  const int ndim = t.shape_size();
  const std::vector<int64_t>& tshape = tpp.local_shape;
  const v1::DataParallel& dpspec = t.partition().dp();
  const bool flat = (dpspec.mode() == v1::DP_FLAT && c.dp > 1) || dpspec.mode() == v1::DP_BUCKET;
  if (flat) {
    const int64_t n = Product(tshape);
    int64_t begin, end, length;
    if (dpspec.mode() == v1::DP_BUCKET) {
      begin = std::min(n, c.flat_begin);
      end = std::max(begin, std::min(n, c.flat_end));
      length = end - begin;
    } else {
      const int64_t chunk = (n + c.dp - 1) / c.dp;
      begin = std::min(n, c.dp_index * chunk);
      end = std::min(n, begin + chunk);
      length = chunk;
    }
    shard.local_shape = {length};
    shard.local_elements = length;
    View base;
    RowMajorStrides(ndim, tshape.data(), base.strides);
    std::vector<Box> boxes;
    FlatRangeToBoxes(ndim, tshape.data(), begin, end, &boxes);
    for (const Box& b : boxes) {
      View v = base;
      for (int d = 0; d < ndim; ++d) v.offset += b.offset[d] * base.strides[d];
      v.offset -= begin;
      AppendPieces(tpp, b, v, &shard.pieces);
      AppendPadding(tpp, b, v, &shard.padding);
    }
    if (end - begin < length) shard.padding.emplace_back(end - begin, length - (end - begin));
  } else {
    Box region = WholeBox(ndim, tshape.data());
    shard.local_shape = tshape;
    if ((dpspec.mode() == v1::DP_SPLIT || dpspec.mode() == v1::DP_CHUNK) && c.dp > 1) {
      const int axis = dpspec.axis();
      Part part;
      if (dpspec.mode() == v1::DP_SPLIT) {
        part = SplitPart(tshape[axis], c.dp, c.dp_index);
      } else {
        const int64_t chunk = (tshape[axis] + c.dp - 1) / c.dp;
        part.start = std::min(tshape[axis], c.dp_index * chunk);
        part.size = std::min(tshape[axis], part.start + chunk) - part.start;
      }
      region.offset[axis] = part.start;
      region.size[axis] = part.size;
      shard.local_shape[axis] = part.size;
    }
    shard.local_elements = Product(shard.local_shape);
    if (shard.local_elements > 0) {
      View v;
      RowMajorStrides(ndim, shard.local_shape.data(), v.strides);
      AppendPieces(tpp, region, v, &shard.pieces);
      AppendPadding(tpp, region, v, &shard.padding);
    }
  }
  NormalizeRuns(&shard.padding);
  shard.padding_offset = shard.local_elements;
  if (!shard.padding.empty() &&
      shard.padding.back().first + shard.padding.back().second == shard.local_elements) {
    shard.padding_offset = shard.padding.back().first;
  }
  return shard;
}

CoordShard DeriveRankShard(const v1::Ptc& ptc, int tensor, const ResolvedLayout& rl,
                           const Buckets& buckets, int rank) {
  const v1::TensorSpec& t = ptc.tensors(tensor);
  const RankCoord rc = rl.Coord(rank);
  std::vector<int> stages;
  rl.StagesHolding(t.partition().pipeline(), &stages);
  if (std::find(stages.begin(), stages.end(), rc.pp) == stages.end()) return CoordShard{};
  ShardCoord c = CoordOfRank(t, rl, rc);
  if (t.partition().dp().mode() == v1::DP_BUCKET) buckets.Range(tensor, rc.pp, &c);
  return DeriveCoordShard(t, c);
}

std::vector<v1::Shard> DeriveShards(const v1::Ptc& ptc, const v1::Layout& layout) {
  HostTable hosts;
  const ResolvedLayout rl = ResolvedLayout::Resolve(layout, ptc.num_layers(), &hosts);
  const Buckets buckets(ptc, rl);
  std::vector<v1::Shard> out;
  std::vector<int> stages;
  for (int ti = 0; ti < ptc.tensors_size(); ++ti) {
    const v1::TensorSpec& t = ptc.tensors(ti);
    rl.StagesHolding(t.partition().pipeline(), &stages);
    for (int rank = 0; rank < rl.world(); ++rank) {
      const RankCoord c = rl.Coord(rank);
      if (std::find(stages.begin(), stages.end(), c.pp) == stages.end()) continue;
      const CoordShard cs = DeriveRankShard(ptc, ti, rl, buckets, rank);
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
