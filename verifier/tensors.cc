#include "verifier/tensors.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace reshard::verifier {
namespace {

int64_t SatMul(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  if (a > kCap / b) return kCap;
  return std::min(a * b, kCap);
}
int64_t CeilDiv(int64_t n, int64_t k) { return n / k + (n % k != 0 ? 1 : 0); }
int64_t RoundUp(int64_t n, int64_t m) { return std::min(SatMul(CeilDiv(n, m), m), kCap); }

// A range [start, start + size) of held coordinates on one axis.
struct Piece {
  int64_t start, size;
};
// Per axis of the local tensor T: the held coordinates it covers, in order.
using Pieces = std::vector<std::vector<Piece>>;

int64_t Extent(const std::vector<Piece>& axis) {
  int64_t n = 0;
  for (const Piece& p : axis) n += p.size;
  return n;
}

int64_t Elements(const Pieces& pieces) {
  int64_t n = 1;
  for (const auto& axis : pieces) n = SatMul(n, Extent(axis));
  return n;
}

// Local positions [lo, hi) of an axis made of `axis`'s pieces.
std::vector<Piece> Slice(const std::vector<Piece>& axis, int64_t lo, int64_t hi) {
  std::vector<Piece> out;
  int64_t at = 0;
  for (const Piece& p : axis) {
    const int64_t b = std::max(lo, at), e = std::min(hi, at + p.size);
    if (b < e) out.push_back({p.start + (b - at), e - b});
    at += p.size;
  }
  return out;
}

bool IsExpert(const v1::TensorSpec& t) { return t.partition().has_expert(); }
int TpSize(const v1::TensorSpec& t, const RankGrid& g) { return IsExpert(t) ? g.expert_tp : g.tp; }

// The group a data-parallel split runs over and the rank's index in it
// ("Data-parallel groups"): the shard group (S, s) of the table, read from
// the group (G, g) the tensor's `over` names as s = g % S.
std::pair<int, int> DpGroup(const v1::TensorSpec& t, const RankGrid& g, const Coords& c) {
  if (IsExpert(t)) return {g.edp, c.edp_i};
  const bool dp_only = t.partition().dp().over() == v1::DP_OVER_DP;
  const int group_index = dp_only ? c.dp_i : c.cp_i + g.cp * c.dp_i;  // g of (G, g)
  const int shard = dp_only ? g.dp_shard : g.dp_shard * g.cp;        // S
  return {shard, group_index % shard};
}

std::vector<int64_t> HeldShape(const v1::TensorSpec& t, const RankGrid& g) {
  std::vector<int64_t> held(t.shape().begin(), t.shape().end());
  if (t.partition().has_padding()) {
    const auto& pad = t.partition().padding();
    const int64_t m = SatMul(pad.multiple(), pad.times_tp() ? TpSize(t, g) : 1);
    held[pad.axis()] = RoundUp(held[pad.axis()], m);
  }
  return held;
}

// The tensor-parallel blocks and unit of `t` on its held shape.
std::vector<int64_t> Blocks(const v1::TensorSpec& t, const std::vector<int64_t>& held) {
  const auto& tp = t.partition().tp();
  if (tp.blocks_size() == 0) return {held[tp.axis()]};
  return {tp.blocks().begin(), tp.blocks().end()};
}
int64_t Unit(const v1::TensorSpec& t) {
  return std::max<int64_t>(1, t.partition().tp().granularity());
}

// The local tensor T of rank coordinates `c` (held coordinates per axis).
Pieces LocalTensor(const v1::TensorSpec& t, const RankGrid& g, const Coords& c) {
  const std::vector<int64_t> held = HeldShape(t, g);
  Pieces pieces;
  for (int64_t n : held) pieces.push_back({{0, n}});
  const auto& part = t.partition();
  if (IsExpert(t)) {
    const int ax = part.expert().axis();
    const int64_t experts = t.shape(ax);
    pieces[ax] = {{PartStart(experts, g.ep, c.ep_i), PartSize(experts, g.ep, c.ep_i)}};
  }
  if (part.tp().mode() == v1::TP_SPLIT) {
    const int tsize = TpSize(t, g), i = IsExpert(t) ? c.etp_i : c.tp_i;
    const int64_t u = Unit(t);
    std::vector<Piece>& axis = pieces[part.tp().axis()];
    axis.clear();
    int64_t block_start = 0;
    for (int64_t b : Blocks(t, held)) {
      const int64_t units = b / u;
      if (part.tp().granularity() == 0 || units >= tsize) {  // 0: element-wise, never replicated
        axis.push_back(
            {block_start + u * PartStart(units, tsize, i), u * PartSize(units, tsize, i)});
      } else if (units > 0) {  // units and replication: t / units ranks per unit
        axis.push_back({block_start + u * (int64_t{i} * units / tsize), u});
      }
      block_start += b;
    }
  }
  const auto [groups, gi] = DpGroup(t, g, c);
  const auto& dp = part.dp();
  if (dp.mode() == v1::DP_SPLIT || dp.mode() == v1::DP_CHUNK) {
    std::vector<Piece>& axis = pieces[dp.axis()];
    const int64_t n = Extent(axis);
    if (dp.mode() == v1::DP_SPLIT) {
      const int64_t lo = PartStart(n, groups, gi);
      axis = Slice(axis, lo, lo + PartSize(n, groups, gi));
    } else {
      const int64_t chunk = CeilDiv(n, groups);
      axis = Slice(axis, std::min(gi * chunk, n), std::min((gi + 1) * chunk, n));
    }
  }
  return pieces;
}

// Element ids of `pieces` row-major; positions past the logical shape are padding.
std::vector<int64_t> Enumerate(const Pieces& pieces, const v1::TensorSpec& t) {
  const int ndim = static_cast<int>(pieces.size());
  std::vector<std::vector<int64_t>> coords(ndim);
  for (int d = 0; d < ndim; ++d) {
    for (const Piece& p : pieces[d]) {
      for (int64_t k = p.start; k < p.start + p.size; ++k) {
        coords[d].push_back(k < t.shape(d) ? k : kPadding);
      }
    }
  }
  const int64_t n = Elements(pieces);
  std::vector<int64_t> out;
  out.reserve(n);
  std::vector<size_t> idx(ndim, 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t id = 0;
    for (int d = 0; d < ndim && id != kPadding; ++d) {
      const int64_t x = coords[d][idx[d]];
      id = x == kPadding ? kPadding : id * t.shape(d) + x;
    }
    out.push_back(id);
    for (int d = ndim - 1; d >= 0; --d) {
      if (++idx[d] < coords[d].size()) break;
      idx[d] = 0;
    }
  }
  return out;
}

// The range [k0, k1) of T's row-major elements that rank `c` holds of bucket
// member `ptc.tensors(index)` (docs/partitioning.md, "Buckets").
std::pair<int64_t, int64_t> BucketRange(const v1::Ptc& ptc, int index, const RankGrid& g,
                                        const Coords& c) {
  const v1::TensorSpec& t = ptc.tensors(index);
  const v1::BucketGroup& group = *FindGroup(ptc, t.partition().dp().bucket());
  const int stage = c.pp_i, chunk = ChunkOf(t, g, stage);
  std::vector<int> members;
  for (int j = 0; j < ptc.tensors_size(); ++j) {
    const v1::TensorSpec& m = ptc.tensors(j);
    if (m.partition().dp().mode() == v1::DP_BUCKET && m.partition().dp().bucket() == group.name() &&
        StageHolds(m, g, stage) && ChunkOf(m, g, stage) == chunk) {
      members.push_back(j);
    }
  }
  if (group.reverse_order()) std::reverse(members.begin(), members.end());
  const auto [groups, gi] = DpGroup(t, g, c);
  const int64_t a = std::max<int64_t>(group.param_align(), 1);
  const int64_t q = std::lcm(int64_t{groups}, std::max<int64_t>(group.pad_multiple(), 1));
  int64_t pos = 0, bucket_start = 0, in_bucket = 0, start = -1, n = 0, bucket = -1, padded = 0;
  auto close = [&] {
    const int64_t size = CeilDiv(pos - bucket_start, q) * q;
    if (start >= 0 && bucket < 0) {
      bucket = bucket_start;
      padded = size;
    }
    pos = bucket_start = bucket_start + size;
    in_bucket = 0;
  };
  for (int j : members) {
    pos = CeilDiv(pos, a) * a;
    const int64_t size = Elements(LocalTensor(ptc.tensors(j), g, c));
    if (j == index) {
      start = pos;
      n = size;
    }
    pos += size;
    ++in_bucket;
    if (group.bucket_elements() > 0 && pos - bucket_start >= group.bucket_elements()) close();
  }
  if (in_bucket > 0) close();
  const int64_t lo = bucket + gi * padded / groups, hi = bucket + (gi + 1) * padded / groups;
  return {std::clamp(lo - start, int64_t{0}, n), std::clamp(hi - start, int64_t{0}, n)};
}

}  // namespace

const v1::BucketGroup* FindGroup(const v1::Ptc& ptc, const std::string& name) {
  for (const auto& b : ptc.buckets()) {
    if (b.name() == name) return &b;
  }
  return nullptr;
}

absl::Status CheckTensorInGrid(const v1::TensorSpec& t, const RankGrid& g,
                               const std::string& what) {
  if (t.partition().tp().mode() != v1::TP_SPLIT) return absl::OkStatus();
  const int tsize = TpSize(t, g);
  const std::vector<int64_t> blocks = Blocks(t, HeldShape(t, g));
  for (size_t j = 0; j < blocks.size(); ++j) {
    const int64_t units = blocks[j] / Unit(t);
    if (t.partition().tp().granularity() > 0 && units > 0 && units < tsize && tsize % units != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor \"%s\": %s: tp block %d has %d units, fewer than %s %d and "
                          "not a divisor of it",
                          t.name(), what, j, units, IsExpert(t) ? "expert_tp" : "tp", tsize));
    }
  }
  return absl::OkStatus();
}

int64_t BufferLengthBound(const v1::TensorSpec& t, const RankGrid& g, int r) {
  const Coords c = CoordsOf(g, r);
  if (!StageHolds(t, g, c.pp_i)) return 0;
  const int64_t n = Elements(LocalTensor(t, g, c));
  if (t.partition().dp().mode() != v1::DP_FLAT) return n;
  return CeilDiv(n, DpGroup(t, g, c).first);
}

std::vector<int64_t> TensorBuffer(const v1::Ptc& ptc, int index, const RankGrid& g, int r) {
  const v1::TensorSpec& t = ptc.tensors(index);
  const Coords c = CoordsOf(g, r);
  if (!StageHolds(t, g, c.pp_i)) return {};
  std::vector<int64_t> flat = Enumerate(LocalTensor(t, g, c), t);
  const auto& dp = t.partition().dp();
  if (dp.mode() == v1::DP_FLAT) {
    const int64_t n = static_cast<int64_t>(flat.size());
    const int64_t chunk = CeilDiv(n, DpGroup(t, g, c).first);
    const int64_t gi = DpGroup(t, g, c).second;
    std::vector<int64_t> out(chunk, kPadding);
    for (int64_t k = 0; k < chunk && gi * chunk + k < n; ++k) out[k] = flat[gi * chunk + k];
    return out;
  }
  if (dp.mode() == v1::DP_BUCKET) {
    const auto [k0, k1] = BucketRange(ptc, index, g, c);
    return std::vector<int64_t>(flat.begin() + k0, flat.begin() + std::max(k0, k1));
  }
  return flat;
}

bool MustHoldSomething(const v1::TensorSpec& t, const RankGrid& g, int r) {
  // An empty expert slab too: DP_BUCKET members never need allow_empty.
  return !t.partition().allow_empty() && t.partition().dp().mode() != v1::DP_BUCKET &&
         StageHolds(t, g, CoordsOf(g, r).pp_i);
}

}  // namespace reshard::verifier
