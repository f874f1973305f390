#include "verifier/model.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "verifier/grid.h"
#include "verifier/tensors.h"

namespace reshard::verifier {
namespace {

int64_t SatAdd(int64_t a, int64_t b) { return std::min(a + b, kCap); }
int64_t SatMul(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  if (a > kCap / b) return kCap;
  return std::min(a * b, kCap);
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

// Lost ranks and hosts; the target may use neither.
absl::Status ResolveLost(const std::vector<std::string>& lost_hosts,
                         const std::vector<int>& lost_ranks, Model* m) {
  m->old_lost.assign(m->from.world, false);
  const std::set<std::string> lost_host_set(lost_hosts.begin(), lost_hosts.end());
  for (int r : lost_ranks) {
    if (r < 0 || r >= m->from.world) {
      return absl::InvalidArgumentError(
          absl::StrCat("lost rank ", r, " outside the old world of ", m->from.world));
    }
    m->old_lost[r] = true;
  }
  std::set<std::pair<int, int>> lost_slots;
  for (int r = 0; r < m->from.world; ++r) {
    if (m->old_lost[r]) lost_slots.emplace(m->from.host[r], m->from.device[r]);
    if (lost_host_set.count(m->hosts[m->from.host[r]])) m->old_lost[r] = true;
    if (m->old_lost[r]) m->lost_ranks.push_back(r);
  }
  std::map<std::pair<int, int>, int> old_at;
  for (int r = 0; r < m->from.world; ++r) old_at[{m->from.host[r], m->from.device[r]}] = r;
  for (int r = 0; r < m->to.world; ++r) {
    const std::pair<int, int> slot(m->to.host[r], m->to.device[r]);
    if (lost_host_set.count(m->hosts[slot.first]) || lost_slots.count(slot)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("target rank %d is on (host \"%s\", device %d), which is lost", r,
                          m->hosts[slot.first], slot.second));
    }
    auto it = old_at.find(slot);
    m->same_device_old.push_back(it != old_at.end() && !m->old_lost[it->second] ? it->second : -1);
  }
  return absl::OkStatus();
}

// Elements of all buffers of both layouts, bounded above, before anything is
// materialised.
absl::Status CheckBudget(const v1::Ptc& ptc, const Model& m) {
  int64_t total = 0;
  for (const auto& t : ptc.tensors()) {
    int64_t ids = 1;
    for (int64_t x : t.shape()) ids = SatMul(ids, x);
    total = SatAdd(total, ids);
    for (int r = 0; r < m.from.world; ++r) total = SatAdd(total, BufferLengthBound(t, m.from, r));
    for (int r = 0; r < m.to.world; ++r) total = SatAdd(total, BufferLengthBound(t, m.to, r));
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
  return absl::OkStatus();
}

absl::Status CheckNotEmpty(const v1::TensorSpec& t, const RankGrid& g, int r,
                           const std::vector<int64_t>& buf, const char* what) {
  if (!MustHoldSomething(t, g, r)) return absl::OkStatus();
  for (int64_t e : buf) {
    if (e != kPadding) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "tensor \"%s\": %s rank %d holds no element and allow_empty is not set", t.name(), what, r));
}

absl::StatusOr<ModelItem> TensorItem(const v1::Ptc& ptc, int index, const Model& m) {
  const v1::TensorSpec& t = ptc.tensors(index);
  ModelItem item;
  item.name = t.name();
  item.element_bytes = DTypeBytes(t.dtype());
  item.shape.assign(t.shape().begin(), t.shape().end());
  item.num_ids = 1;
  for (int64_t x : t.shape()) item.num_ids *= x;
  for (int r = 0; r < m.from.world; ++r) {
    item.old_buffers.push_back(TensorBuffer(ptc, index, m.from, r));
    if (absl::Status s = CheckNotEmpty(t, m.from, r, item.old_buffers.back(), "source"); !s.ok()) {
      return s;
    }
  }
  for (int r = 0; r < m.to.world; ++r) {
    item.new_buffers.push_back(TensorBuffer(ptc, index, m.to, r));
    if (absl::Status s = CheckNotEmpty(t, m.to, r, item.new_buffers.back(), "target"); !s.ok()) {
      return s;
    }
  }
  return item;
}

ModelItem BlobItem(const v1::BlobSpec& b, const Model& m) {
  ModelItem item;
  item.name = b.name();
  item.is_blob = true;
  item.per_rank_blob = b.scope() == v1::BLOB_PER_RANK;
  item.regenerable = b.regenerable();
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
  return item;
}

// Regenerable blobs whose value has no surviving holder become padding.
void MarkRegenerated(Model* m) {
  for (int r = 0; r < m->to.world; ++r) {
    for (size_t i = 0; i < m->items.size(); ++i) {
      ModelItem& item = m->items[i];
      if (!item.regenerable || item.new_buffers[r].empty()) continue;
      const int64_t id = item.new_buffers[r][0];  // a value's bytes share their holders
      if (item.holder_begin[id] != item.holder_begin[id + 1]) continue;
      std::fill(item.new_buffers[r].begin(), item.new_buffers[r].end(), kPadding);
      m->regenerate.emplace_back(r, static_cast<int>(i));
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
  if (absl::Status s = CheckPtcTensors(ptc); !s.ok()) return s;
  for (const auto& b : ptc.blobs()) {
    if (b.size_bytes() < 0 || b.size_bytes() > kCap ||
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
  for (const auto& t : ptc.tensors()) {
    for (absl::Status s : {CheckTensorInGrid(t, m.from, "source layout"),
                           CheckTensorInGrid(t, m.to, "target layout")}) {
      if (!s.ok()) return s;
    }
  }
  if (absl::Status s = ResolveLost(lost_hosts, lost_ranks, &m); !s.ok()) return s;
  if (absl::Status s = CheckBudget(ptc, m); !s.ok()) return s;

  for (int i = 0; i < ptc.tensors_size(); ++i) {
    absl::StatusOr<ModelItem> item = TensorItem(ptc, i, m);
    if (!item.ok()) return item.status();
    m.items.push_back(*std::move(item));
  }
  for (const auto& b : ptc.blobs()) m.items.push_back(BlobItem(b, m));
  for (auto& item : m.items) IndexHolders(m, &item);
  MarkRegenerated(&m);
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
