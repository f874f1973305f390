#include "verifier/tensors.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

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

// The data-parallel group size and the rank's index in it.
std::pair<int, int> DpGroup(const v1::TensorSpec& t, const RankGrid& g, const Coords& c) {
  if (IsExpert(t)) return {g.edp, c.edp_i};
  return {g.dp * g.cp, c.cp_i + g.cp * c.dp_i};
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

const v1::BucketGroup* FindGroup(const v1::Ptc& ptc, const std::string& name) {
  for (const auto& b : ptc.buckets()) {
    if (b.name() == name) return &b;
  }
  return nullptr;
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

absl::Status Invalid(const v1::TensorSpec& t, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name(), "\": ", what));
}

absl::Status CheckAxis(const v1::TensorSpec& t, const char* field, int axis) {
  if (axis >= 0 && axis < t.shape_size()) return absl::OkStatus();
  return Invalid(
      t, absl::StrCat(field, " ", axis, " out of range for a rank-", t.shape_size(), " tensor"));
}

absl::Status CheckTp(const v1::TensorSpec& t) {
  const auto& tp = t.partition().tp();
  if (tp.mode() == v1::TP_REPLICATED) return absl::OkStatus();
  if (tp.mode() != v1::TP_SPLIT) return Invalid(t, absl::StrCat("unknown tp mode ", tp.mode()));
  if (absl::Status s = CheckAxis(t, "tp axis", tp.axis()); !s.ok()) return s;
  if (tp.granularity() < 0 || tp.granularity() > kCap) {
    return Invalid(t, absl::StrCat("tp granularity ", tp.granularity()));
  }
  int64_t sum = 0;
  for (int64_t b : tp.blocks()) {
    if (b < 0 || b > kCap) return Invalid(t, absl::StrCat("tp block ", b));
    sum += b;
  }
  if (tp.blocks_size() > 0 && sum != t.shape(tp.axis())) {
    return Invalid(t, absl::StrCat("tp blocks sum to ", sum, ", shape[", tp.axis(), "] is ",
                                   t.shape(tp.axis())));
  }
  const std::vector<int64_t> blocks =
      tp.blocks_size() > 0 ? std::vector<int64_t>(tp.blocks().begin(), tp.blocks().end())
                           : std::vector<int64_t>{t.shape(tp.axis())};
  for (int64_t b : blocks) {
    if (b % Unit(t) != 0) {
      return Invalid(
          t, absl::StrCat("tp block ", b, " is not a multiple of granularity ", tp.granularity()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPaddingAndExpert(const v1::TensorSpec& t) {
  const auto& p = t.partition();
  if (p.has_padding()) {
    if (absl::Status s = CheckAxis(t, "padding axis", p.padding().axis()); !s.ok()) return s;
    if (p.padding().multiple() < 1 || p.padding().multiple() > kCap) {
      return Invalid(t, absl::StrCat("padding multiple ", p.padding().multiple()));
    }
    if (p.tp().blocks_size() > 0 || p.tp().granularity() > 1) {
      return Invalid(t,
                     absl::StrCat("padding with tp blocks [", absl::StrJoin(p.tp().blocks(), ", "),
                                  "] and granularity ", p.tp().granularity()));
    }
  }
  if (p.has_expert()) {
    if (absl::Status s = CheckAxis(t, "expert axis", p.expert().axis()); !s.ok()) return s;
    if (p.tp().mode() == v1::TP_SPLIT && p.tp().axis() == p.expert().axis()) {
      return Invalid(t, absl::StrCat("tp axis ", p.tp().axis(), " is the expert axis"));
    }
    if (p.has_padding() && p.padding().axis() == p.expert().axis()) {
      return Invalid(t, absl::StrCat("padding axis ", p.padding().axis(), " is the expert axis"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPipeline(const v1::TensorSpec& t, int num_layers) {
  const auto& p = t.partition().pipeline();
  switch (p.mode()) {
    case v1::PIPELINE_LAYER:
      if (p.layer() < 0 || p.layer() >= num_layers) {
        return Invalid(t, absl::StrCat("layer ", p.layer(), " outside [0, ", num_layers, ")"));
      }
      return absl::OkStatus();
    case v1::PIPELINE_LAYERS:
      if (p.layers_size() == 0) return Invalid(t, "PIPELINE_LAYERS with no layers");
      for (int layer : p.layers()) {
        if (layer < 0 || layer >= num_layers) {
          return Invalid(t, absl::StrCat("layers has ", layer, " outside [0, ", num_layers, ")"));
        }
      }
      return absl::OkStatus();
    case v1::PIPELINE_FIRST_STAGE:
    case v1::PIPELINE_LAST_STAGE:
    case v1::PIPELINE_EVERY_STAGE:
    case v1::PIPELINE_FIRST_AND_LAST_STAGE:
      return absl::OkStatus();
    default:
      return Invalid(t, absl::StrCat("pipeline mode ", p.mode(), " not allowed"));
  }
}

absl::Status CheckDp(const v1::Ptc& ptc, const v1::TensorSpec& t) {
  const auto& dp = t.partition().dp();
  switch (dp.mode()) {
    case v1::DP_REPLICATED:
    case v1::DP_FLAT:
      return absl::OkStatus();
    case v1::DP_SPLIT:
    case v1::DP_CHUNK:
      return CheckAxis(t, "dp axis", dp.axis());
    case v1::DP_BUCKET:
      if (FindGroup(ptc, dp.bucket()) == nullptr) {
        return Invalid(t, absl::StrCat("dp bucket \"", dp.bucket(), "\" is not in Ptc.buckets"));
      }
      return absl::OkStatus();
    default:
      return Invalid(t, absl::StrCat("unknown dp mode ", dp.mode()));
  }
}

absl::Status CheckGroups(const v1::Ptc& ptc) {
  std::map<std::string, int> expert_members, dense_members;
  for (const auto& t : ptc.tensors()) {
    if (t.partition().dp().mode() != v1::DP_BUCKET) continue;
    ++(IsExpert(t) ? expert_members : dense_members)[t.partition().dp().bucket()];
  }
  std::set<std::string> names;
  for (const auto& b : ptc.buckets()) {
    const std::string who = absl::StrCat("bucket group \"", b.name(), "\"");
    if (b.name().empty() || !names.insert(b.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": name empty or repeated"));
    }
    for (auto [field, v] : {std::make_pair("param_align", b.param_align()),
                            std::make_pair("bucket_elements", b.bucket_elements()),
                            std::make_pair("pad_multiple", b.pad_multiple())}) {
      if (v < 0 || v > kCap) {
        return absl::InvalidArgumentError(absl::StrCat(who, ": ", field, " is ", v));
      }
    }
    if (expert_members[b.name()] > 0 && dense_members[b.name()] > 0) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": has ", dense_members[b.name()],
                                                     " dense and ", expert_members[b.name()],
                                                     " expert members"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int DTypeBytes(int dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT64:
    case v1::DTYPE_INT64:
      return 8;
    case v1::DTYPE_FLOAT32:
    case v1::DTYPE_INT32:
      return 4;
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16:
    case v1::DTYPE_INT16:
      return 2;
    case v1::DTYPE_FLOAT8_E4M3:
    case v1::DTYPE_FLOAT8_E5M2:
    case v1::DTYPE_INT8:
    case v1::DTYPE_UINT8:
    case v1::DTYPE_BOOL:
      return 1;
    default:
      return 0;
  }
}

absl::Status CheckPtcTensors(const v1::Ptc& ptc) {
  for (const auto& t : ptc.tensors()) {
    if (DTypeBytes(t.dtype()) == 0) return Invalid(t, absl::StrCat("unknown dtype ", t.dtype()));
    for (int d = 0; d < t.shape_size(); ++d) {
      if (t.shape(d) < 0 || t.shape(d) > kCap) {
        return Invalid(t, absl::StrCat("shape[", d, "] is ", t.shape(d)));
      }
    }
    for (absl::Status s : {CheckTp(t), CheckPaddingAndExpert(t), CheckPipeline(t, ptc.num_layers()),
                           CheckDp(ptc, t)}) {
      if (!s.ok()) return s;
    }
  }
  return CheckGroups(ptc);
}

absl::Status CheckTensorInGrid(const v1::TensorSpec& t, const RankGrid& g,
                               const std::string& what) {
  if (t.partition().tp().mode() != v1::TP_SPLIT) return absl::OkStatus();
  const int tsize = TpSize(t, g);
  const std::vector<int64_t> blocks = Blocks(t, HeldShape(t, g));
  for (size_t j = 0; j < blocks.size(); ++j) {
    const int64_t units = blocks[j] / Unit(t);
    if (t.partition().tp().granularity() > 0 && units > 0 && units < tsize && tsize % units != 0) {
      return Invalid(t, absl::StrFormat("%s: tp block %d has %d units, fewer than %s %d and not "
                                        "a divisor of it",
                                        what, j, units, IsExpert(t) ? "expert_tp" : "tp", tsize));
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
  return !t.partition().allow_empty() && t.partition().dp().mode() != v1::DP_BUCKET &&
         StageHolds(t, g, CoordsOf(g, r).pp_i);
}

}  // namespace reshard::verifier
