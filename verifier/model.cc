#include "verifier/model.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace reshard::verifier {
namespace {

constexpr int64_t kCap = int64_t{1} << 50;  // saturation point of size arithmetic
constexpr int kMaxWorld = 1 << 16;

int64_t SatMul(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  if (a > kCap / b) return kCap;
  return std::min(a * b, kCap);
}
int64_t SatAdd(int64_t a, int64_t b) { return std::min(a + b, kCap); }

// numpy array_split(n, k)[i].
int64_t PartStart(int64_t n, int64_t k, int64_t i) { return i * (n / k) + std::min(i, n % k); }
int64_t PartSize(int64_t n, int64_t k, int64_t i) { return n / k + (i < n % k ? 1 : 0); }

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

absl::Status CheckTensor(const v1::TensorSpec& t, int num_layers) {
  const std::string who = absl::StrCat("tensor \"", t.name(), "\"");
  if (DTypeBytes(t.dtype()) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": unknown dtype ", t.dtype()));
  }
  const int ndim = t.shape_size();
  for (int d = 0; d < ndim; ++d) {
    if (t.shape(d) < 0) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": shape[", d, "] is ", t.shape(d)));
    }
  }
  const auto& p = t.partition();
  if (p.tp().mode() == v1::TP_SPLIT) {
    const int axis = p.tp().axis();
    if (axis < 0 || axis >= ndim) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": tp axis ", axis, " out of range for a rank-", ndim, " tensor"));
    }
    int64_t sum = 0;
    for (int64_t b : p.tp().blocks()) {
      if (b < 0) return absl::InvalidArgumentError(absl::StrCat(who, ": tp block ", b));
      sum = SatAdd(sum, b);
    }
    if (p.tp().blocks_size() > 0 && sum != t.shape(axis)) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": tp blocks sum to ", sum, ", shape[", axis, "] is ", t.shape(axis)));
    }
  } else if (p.tp().mode() != v1::TP_REPLICATED) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": unknown tp mode ", p.tp().mode()));
  }
  switch (p.pipeline().mode()) {
    case v1::PIPELINE_LAYER:
      if (p.pipeline().layer() < 0 || p.pipeline().layer() >= num_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat(who, ": layer ", p.pipeline().layer(), " outside [0, ", num_layers, ")"));
      }
      break;
    case v1::PIPELINE_FIRST_STAGE:
    case v1::PIPELINE_LAST_STAGE:
    case v1::PIPELINE_EVERY_STAGE:
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": pipeline mode ", p.pipeline().mode(), " not allowed"));
  }
  if (p.dp().mode() == v1::DP_SPLIT) {
    if (p.dp().axis() < 0 || p.dp().axis() >= ndim) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": dp axis ", p.dp().axis(),
                                                     " out of range for a rank-", ndim, " tensor"));
    }
  } else if (p.dp().mode() != v1::DP_REPLICATED && p.dp().mode() != v1::DP_FLAT) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": unknown dp mode ", p.dp().mode()));
  }
  return absl::OkStatus();
}

absl::StatusOr<RankGrid> ParseGrid(const v1::Layout& layout, int num_layers,
                                   const std::string& what, std::vector<std::string>* hosts,
                                   std::map<std::string, int>* host_index) {
  const auto& c = layout.config();
  RankGrid g;
  if (c.tp() < 1 || c.pp() < 1 || c.dp() < 1 || c.tp() > kMaxWorld || c.pp() > kMaxWorld ||
      c.dp() > kMaxWorld || int64_t{c.tp()} * c.pp() * c.dp() > kMaxWorld) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: (tp, pp, dp) = (%d, %d, %d) invalid", what, c.tp(), c.pp(), c.dp()));
  }
  if (c.order() != v1::RANK_ORDER_TP_DP_PP && c.order() != v1::RANK_ORDER_TP_PP_DP) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": unknown rank order ", c.order()));
  }
  g.tp = c.tp();
  g.pp = c.pp();
  g.dp = c.dp();
  g.world = g.tp * g.pp * g.dp;
  g.order = c.order();
  g.stage_begin.resize(g.pp + 1);
  if (c.stage_starts_size() == 0) {
    for (int s = 0; s < g.pp; ++s) g.stage_begin[s] = PartStart(num_layers, g.pp, s);
  } else {
    if (c.stage_starts_size() != g.pp || c.stage_starts(0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": stage_starts [", absl::StrJoin(c.stage_starts(), ", "), "] for pp ", g.pp));
    }
    for (int s = 0; s < g.pp; ++s) {
      g.stage_begin[s] = c.stage_starts(s);
      if ((s > 0 && g.stage_begin[s] <= g.stage_begin[s - 1]) || g.stage_begin[s] >= num_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": stage_starts[", s, "] = ", g.stage_begin[s], " invalid"));
      }
    }
  }
  g.stage_begin[g.pp] = num_layers;

  const auto& pl = layout.placement();
  std::vector<std::pair<std::string, int>> slots;
  if (pl.ranks_size() > 0) {
    if (pl.hosts_size() > 0 || pl.ranks_size() != g.world) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": placement has ", pl.ranks_size(),
                                                     " rank slots for world ", g.world));
    }
    for (const auto& s : pl.ranks()) slots.emplace_back(s.host(), s.device());
  } else {
    const int dph = pl.devices_per_host();
    if (dph < 1 || int64_t{pl.hosts_size()} * dph < g.world) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": placement ", pl.hosts_size(),
                                                     " hosts x ", dph,
                                                     " devices is too small for world ", g.world));
    }
    for (int r = 0; r < g.world; ++r) slots.emplace_back(pl.hosts(r / dph), r % dph);
  }
  std::set<std::pair<std::string, int>> seen;
  for (int r = 0; r < g.world; ++r) {
    if (!seen.insert(slots[r]).second || slots[r].second < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: rank %d on (host \"%s\", device %d) which is invalid or taken", what,
                          r, slots[r].first, slots[r].second));
    }
    auto [it, fresh] = host_index->emplace(slots[r].first, static_cast<int>(hosts->size()));
    if (fresh) hosts->push_back(slots[r].first);
    g.host.push_back(it->second);
    g.device.push_back(slots[r].second);
  }
  return g;
}

struct Coords {
  int tp_i, dp_i, pp_i;
};

Coords CoordsOf(const RankGrid& g, int r) {
  Coords c;
  c.tp_i = r % g.tp;
  const int rest = r / g.tp;
  if (g.order == v1::RANK_ORDER_TP_PP_DP) {
    c.pp_i = rest % g.pp;
    c.dp_i = rest / g.pp;
  } else {
    c.dp_i = rest % g.dp;
    c.pp_i = rest / g.dp;
  }
  return c;
}

bool StageHolds(const v1::TensorSpec& t, const RankGrid& g, int stage) {
  switch (t.partition().pipeline().mode()) {
    case v1::PIPELINE_LAYER: {
      const int64_t layer = t.partition().pipeline().layer();
      return g.stage_begin[stage] <= layer && layer < g.stage_begin[stage + 1];
    }
    case v1::PIPELINE_FIRST_STAGE:
      return stage == 0;
    case v1::PIPELINE_LAST_STAGE:
      return stage == g.pp - 1;
    default:
      return true;
  }
}

// Blocks of the tp axis as the doc defines them (empty: one block).
std::vector<int64_t> TpBlocks(const v1::TensorSpec& t) {
  const auto& tp = t.partition().tp();
  if (tp.blocks_size() == 0) return {t.shape(tp.axis())};
  return {tp.blocks().begin(), tp.blocks().end()};
}

// Size of a tp rank's local tensor T, computed arithmetically (for the budget).
std::vector<int64_t> LocalShape(const v1::TensorSpec& t, int tp, int tp_i) {
  std::vector<int64_t> s(t.shape().begin(), t.shape().end());
  if (t.partition().tp().mode() == v1::TP_SPLIT) {
    int64_t n = 0;
    for (int64_t b : TpBlocks(t)) n += PartSize(b, tp, tp_i);
    s[t.partition().tp().axis()] = n;
  }
  return s;
}

int64_t BufferLength(const v1::TensorSpec& t, const RankGrid& g, int r) {
  const Coords c = CoordsOf(g, r);
  if (!StageHolds(t, g, c.pp_i)) return 0;
  std::vector<int64_t> s = LocalShape(t, g.tp, c.tp_i);
  const auto& dp = t.partition().dp();
  if (dp.mode() == v1::DP_SPLIT) s[dp.axis()] = PartSize(s[dp.axis()], g.dp, c.dp_i);
  int64_t n = 1;
  for (int64_t x : s) n = SatMul(n, x);
  if (dp.mode() == v1::DP_FLAT) n = (n + g.dp - 1) / g.dp;
  return n;
}

// Global ids of the elements of the tensor whose coordinates along axis d
// are coords[d], enumerated row-major.
std::vector<int64_t> Enumerate(const std::vector<std::vector<int64_t>>& coords,
                               const std::vector<int64_t>& global_shape) {
  const int ndim = static_cast<int>(coords.size());
  int64_t n = 1;
  for (const auto& c : coords) n *= static_cast<int64_t>(c.size());
  std::vector<int64_t> out;
  out.reserve(n);
  std::vector<size_t> idx(ndim, 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t id = 0;
    for (int d = 0; d < ndim; ++d) id = id * global_shape[d] + coords[d][idx[d]];
    out.push_back(id);
    for (int d = ndim - 1; d >= 0; --d) {
      if (++idx[d] < coords[d].size()) break;
      idx[d] = 0;
    }
  }
  return out;
}

std::vector<int64_t> TensorBuffer(const v1::TensorSpec& t, const RankGrid& g, int r) {
  const Coords c = CoordsOf(g, r);
  if (!StageHolds(t, g, c.pp_i)) return {};
  const int ndim = t.shape_size();
  const std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
  // coords[d]: global coordinate of each local index along axis d.
  std::vector<std::vector<int64_t>> coords(ndim);
  for (int d = 0; d < ndim; ++d) {
    for (int64_t i = 0; i < shape[d]; ++i) coords[d].push_back(i);
  }
  const auto& part = t.partition();
  if (part.tp().mode() == v1::TP_SPLIT) {
    const int axis = part.tp().axis();
    coords[axis].clear();
    int64_t block_start = 0;
    for (int64_t b : TpBlocks(t)) {
      const int64_t start = PartStart(b, g.tp, c.tp_i), size = PartSize(b, g.tp, c.tp_i);
      for (int64_t i = 0; i < size; ++i) coords[axis].push_back(block_start + start + i);
      block_start += b;
    }
  }
  switch (part.dp().mode()) {
    case v1::DP_SPLIT: {
      auto& a = coords[part.dp().axis()];
      const int64_t n = static_cast<int64_t>(a.size());
      const int64_t start = PartStart(n, g.dp, c.dp_i), size = PartSize(n, g.dp, c.dp_i);
      a = std::vector<int64_t>(a.begin() + start, a.begin() + start + size);
      return Enumerate(coords, shape);
    }
    case v1::DP_FLAT: {
      const std::vector<int64_t> flat = Enumerate(coords, shape);
      const int64_t n = static_cast<int64_t>(flat.size());
      const int64_t chunk = (n + g.dp - 1) / g.dp;
      std::vector<int64_t> out(chunk, kPadding);
      for (int64_t k = 0; k < chunk; ++k) {
        const int64_t pos = int64_t{c.dp_i} * chunk + k;
        if (pos < n) out[k] = flat[pos];
      }
      return out;
    }
    default:
      return Enumerate(coords, shape);
  }
}

absl::Status CheckNotEmpty(const v1::TensorSpec& t, const RankGrid& g, int r,
                           const std::vector<int64_t>& buf, const char* what) {
  if (t.partition().allow_empty() || !StageHolds(t, g, CoordsOf(g, r).pp_i)) {
    return absl::OkStatus();
  }
  for (int64_t e : buf) {
    if (e != kPadding) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "tensor \"%s\": %s rank %d holds no element and allow_empty is not set", t.name(), what, r));
}

void IndexHolders(const Model& m, ModelItem* item) {
  item->holder_begin.assign(item->num_ids + 1, 0);
  for (int r = 0; r < m.from.world; ++r) {
    if (m.old_lost[r]) continue;
    for (int64_t e : item->old_buffers[r]) {
      if (e != kPadding) ++item->holder_begin[e + 1];
    }
  }
  for (int64_t e = 0; e < item->num_ids; ++e) item->holder_begin[e + 1] += item->holder_begin[e];
  item->holder_ranks.assign(item->holder_begin[item->num_ids], -1);
  std::vector<int64_t> next(item->holder_begin.begin(), item->holder_begin.end() - 1);
  for (int r = 0; r < m.from.world; ++r) {
    if (m.old_lost[r]) continue;
    for (int64_t e : item->old_buffers[r]) {
      if (e != kPadding) item->holder_ranks[next[e]++] = r;
    }
  }
}

}  // namespace

absl::StatusOr<Model> BuildModel(const v1::Ptc& ptc, const v1::Layout& from, const v1::Layout& to,
                                 const std::vector<std::string>& lost_hosts,
                                 const std::vector<int>& lost_ranks) {
  if (ptc.num_layers() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_layers is ", ptc.num_layers()));
  }
  for (const auto& t : ptc.tensors()) {
    if (absl::Status s = CheckTensor(t, ptc.num_layers()); !s.ok()) return s;
  }
  for (const auto& b : ptc.blobs()) {
    if (b.size_bytes() < 0 ||
        (b.scope() != v1::BLOB_REPLICATED && b.scope() != v1::BLOB_PER_RANK)) {
      return absl::InvalidArgumentError(absl::StrFormat("blob \"%s\": size_bytes %d, scope %d",
                                                        b.name(), b.size_bytes(), b.scope()));
    }
  }
  Model m;
  std::map<std::string, int> host_index;
  absl::StatusOr<RankGrid> g =
      ParseGrid(from, ptc.num_layers(), "source layout", &m.hosts, &host_index);
  if (!g.ok()) return g.status();
  m.from = *std::move(g);
  g = ParseGrid(to, ptc.num_layers(), "target layout", &m.hosts, &host_index);
  if (!g.ok()) return g.status();
  m.to = *std::move(g);

  // Lost ranks and hosts; the target may use neither.
  m.old_lost.assign(m.from.world, false);
  const std::set<std::string> lost_host_set(lost_hosts.begin(), lost_hosts.end());
  for (int r : lost_ranks) {
    if (r < 0 || r >= m.from.world) {
      return absl::InvalidArgumentError(
          absl::StrCat("lost rank ", r, " outside the old world of ", m.from.world));
    }
    m.old_lost[r] = true;
  }
  std::set<std::pair<int, int>> lost_slots;
  for (int r = 0; r < m.from.world; ++r) {
    if (m.old_lost[r]) lost_slots.emplace(m.from.host[r], m.from.device[r]);
    if (lost_host_set.count(m.hosts[m.from.host[r]])) m.old_lost[r] = true;
    if (m.old_lost[r]) m.lost_ranks.push_back(r);
  }
  std::map<std::pair<int, int>, int> old_at;
  for (int r = 0; r < m.from.world; ++r) old_at[{m.from.host[r], m.from.device[r]}] = r;
  for (int r = 0; r < m.to.world; ++r) {
    const std::pair<int, int> slot(m.to.host[r], m.to.device[r]);
    if (lost_host_set.count(m.hosts[slot.first]) || lost_slots.count(slot)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("target rank %d is on (host \"%s\", device %d), which is lost", r,
                          m.hosts[slot.first], slot.second));
    }
    auto it = old_at.find(slot);
    m.same_device_old.push_back(it != old_at.end() && !m.old_lost[it->second] ? it->second : -1);
  }

  // Budget before anything is materialised.
  int64_t total = 0;
  for (const auto& t : ptc.tensors()) {
    int64_t ids = 1;
    for (int64_t x : t.shape()) {
      ids = SatMul(ids, x);
      total = SatAdd(total, x);
    }
    total = SatAdd(total, ids);
    for (int r = 0; r < m.from.world; ++r) total = SatAdd(total, BufferLength(t, m.from, r));
    for (int r = 0; r < m.to.world; ++r) total = SatAdd(total, BufferLength(t, m.to, r));
  }
  for (const auto& b : ptc.blobs()) {
    total = SatAdd(total, SatMul(b.size_bytes(), 2 * m.from.world + m.to.world));
  }
  if (total > kMaxModelElements) {
    return absl::InvalidArgumentError(absl::StrCat("the job has about ", total,
                                                   " elements in all buffers; the verifier "
                                                   "handles at most ",
                                                   kMaxModelElements));
  }

  for (const auto& t : ptc.tensors()) {
    ModelItem item;
    item.name = t.name();
    item.element_bytes = DTypeBytes(t.dtype());
    item.shape.assign(t.shape().begin(), t.shape().end());
    item.num_ids = 1;
    for (int64_t x : t.shape()) item.num_ids *= x;
    for (int r = 0; r < m.from.world; ++r) {
      item.old_buffers.push_back(TensorBuffer(t, m.from, r));
      if (absl::Status s = CheckNotEmpty(t, m.from, r, item.old_buffers.back(), "source");
          !s.ok()) {
        return s;
      }
    }
    for (int r = 0; r < m.to.world; ++r) {
      item.new_buffers.push_back(TensorBuffer(t, m.to, r));
      if (absl::Status s = CheckNotEmpty(t, m.to, r, item.new_buffers.back(), "target"); !s.ok()) {
        return s;
      }
    }
    m.items.push_back(std::move(item));
  }
  for (const auto& b : ptc.blobs()) {
    ModelItem item;
    item.name = b.name();
    item.is_blob = true;
    item.per_rank_blob = b.scope() == v1::BLOB_PER_RANK;
    item.shape = {b.size_bytes()};
    item.num_ids = item.per_rank_blob ? b.size_bytes() * m.from.world : b.size_bytes();
    // Per-rank blobs: old rank k's value is element ids k * size .. k * size + size - 1.
    auto value_of = [&](int k) {
      std::vector<int64_t> v(b.size_bytes());
      for (int64_t i = 0; i < b.size_bytes(); ++i) {
        v[i] = (item.per_rank_blob ? k * b.size_bytes() : 0) + i;
      }
      return v;
    };
    for (int r = 0; r < m.from.world; ++r) item.old_buffers.push_back(value_of(r));
    for (int r = 0; r < m.to.world; ++r) item.new_buffers.push_back(value_of(r % m.from.world));
    m.items.push_back(std::move(item));
  }
  for (auto& item : m.items) IndexHolders(m, &item);
  return m;
}

bool HolderIs(const ModelItem& item, int64_t id, int rank) {
  for (int64_t k = item.holder_begin[id]; k < item.holder_begin[id + 1]; ++k) {
    if (item.holder_ranks[k] == rank) return true;
  }
  return false;
}

bool HeldOnHost(const Model& model, const ModelItem& item, int64_t id, int host) {
  for (int64_t k = item.holder_begin[id]; k < item.holder_begin[id + 1]; ++k) {
    if (model.from.host[item.holder_ranks[k]] == host) return true;
  }
  return false;
}

std::string DescribeElement(const ModelItem& item, int64_t id) {
  if (id == kPadding) return "padding";
  if (id < 0) return "nothing";
  if (item.is_blob) {
    const int64_t size = item.shape[0];
    if (!item.per_rank_blob) return absl::StrCat("byte ", id);
    return absl::StrCat("byte ", id % size, " of old rank ", id / size, "'s value");
  }
  std::vector<int64_t> coord(item.shape.size());
  for (int d = static_cast<int>(item.shape.size()) - 1; d >= 0; --d) {
    coord[d] = id % item.shape[d];
    id /= item.shape[d];
  }
  return absl::StrCat("element [", absl::StrJoin(coord, ", "), "]");
}

}  // namespace reshard::verifier
