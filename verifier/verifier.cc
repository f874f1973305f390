#include "verifier/verifier.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/message_differencer.h"
#include "verifier/model.h"

namespace reshard::verifier {
namespace {

// Value of a new buffer position that nothing has written yet.
constexpr int64_t kUnwritten = -2;

absl::Status Violation(const std::string& msg) {
  return absl::FailedPreconditionError(absl::StrCat("plan rejected by verifier: ", msg));
}

std::string ItemLabel(const Model& m, int item) {
  return absl::StrFormat("item %d (%s \"%s\")", item, m.items[item].is_blob ? "blob" : "tensor",
                         m.items[item].name);
}

// What the plan did, tallied while it is applied.
struct Tally {
  int64_t bytes_local = 0, bytes_cross_host = 0, bytes_zero_filled = 0, cross_host_steps = 0;
  std::vector<int64_t> in, out, local;  // per host index
  /// Per item: host * num_ids + element id -> the step that brought the
  /// element across to that host (rule 3: once per host).
  std::vector<std::unordered_map<int64_t, int>> crossed;
};

using Buffers = std::vector<std::vector<std::vector<int64_t>>>;  // [item][new rank][pos]

// TransferPlan.regenerate lists exactly the model's (rank, item) pairs, in order.
absl::Status CheckRegenerate(const Model& m, const v1::TransferPlan& plan) {
  const int n = plan.regenerate_size(), want = static_cast<int>(m.regenerate.size());
  for (int k = 0; k < std::max(n, want); ++k) {
    if (k < n && k < want && plan.regenerate(k).rank() == m.regenerate[k].first &&
        plan.regenerate(k).item() == m.regenerate[k].second) {
      continue;
    }
    if (k < want) {
      const auto [rank, item] = m.regenerate[k];
      return Violation(absl::StrFormat(
          "%s: new rank %d, positions [0, %d), has no surviving holder of its value and must be "
          "entry %d of regenerate (ascending by rank, then item)%s",
          ItemLabel(m, item), rank, m.items[item].new_buffers[rank].size(), k,
          k < n ? absl::StrFormat("; the plan lists (rank %d, item %d) there",
                                  plan.regenerate(k).rank(), plan.regenerate(k).item())
                : ""));
    }
    const int rank = plan.regenerate(k).rank(), item = plan.regenerate(k).item();
    const bool known = item >= 0 && item < static_cast<int>(m.items.size());
    return Violation(absl::StrFormat(
        "regenerate entry %d names new rank %d, %s, which is not a regenerable blob without a "
        "surviving holder",
        k, rank, known ? ItemLabel(m, item) : absl::StrCat("item ", item)));
  }
  return absl::OkStatus();
}

absl::Status CheckHeader(const Model& m, const v1::Layout& from, const v1::Layout& to,
                         const v1::TransferPlan& plan) {
  if (plan.items_size() != static_cast<int>(m.items.size())) {
    return Violation(absl::StrCat("plan has ", plan.items_size(), " items, the PTC ",
                                  m.items.size(), " (tensors, then blobs)"));
  }
  for (int i = 0; i < plan.items_size(); ++i) {
    const auto& got = plan.items(i);
    const ModelItem& want = m.items[i];
    if (got.name() != want.name || got.is_blob() != want.is_blob ||
        got.element_bytes() != want.element_bytes) {
      return Violation(absl::StrFormat(
          "item %d is (\"%s\", is_blob %d, element_bytes %d), expected (\"%s\", %d, %d)", i,
          got.name(), got.is_blob(), got.element_bytes(), want.name, want.is_blob,
          want.element_bytes));
    }
  }
  using google::protobuf::util::MessageDifferencer;
  if (!MessageDifferencer::Equals(plan.source_layout(), from)) {
    return Violation("source_layout differs from the layout planned from");
  }
  if (!MessageDifferencer::Equals(plan.target_layout(), to)) {
    return Violation("target_layout differs from the layout planned to");
  }
  std::vector<int> lost(plan.lost_ranks().begin(), plan.lost_ranks().end());
  std::sort(lost.begin(), lost.end());
  lost.erase(std::unique(lost.begin(), lost.end()), lost.end());
  if (lost != m.lost_ranks) {
    return Violation(absl::StrCat("lost_ranks [", absl::StrJoin(plan.lost_ranks(), ", "),
                                  "], expected [", absl::StrJoin(m.lost_ranks, ", "), "]"));
  }
  return CheckRegenerate(m, plan);
}

// Rule 2 for one element copied from `src` to new rank `dst`.
absl::Status CheckSourceChoice(const Model& m, const ModelItem& item, int64_t id, int src, int dst,
                               int64_t pos, const std::string& where) {
  const int same_device = m.same_device_old[dst];
  if (same_device >= 0 && HolderIs(item, id, same_device)) {
    if (src == same_device) return absl::OkStatus();
    return Violation(absl::StrFormat(
        "%s: new rank %d gets %s (position %d) from old rank %d, but old rank %d on its own "
        "device holds it",
        where, dst, DescribeElement(item, id), pos, src, same_device));
  }
  const int host = m.to.host[dst];
  if (m.from.host[src] != host && HeldOnHost(m, item, id, host)) {
    return Violation(absl::StrFormat(
        "%s: new rank %d gets %s (position %d) across hosts from old rank %d, but a surviving "
        "old rank on its host \"%s\" holds it",
        where, dst, DescribeElement(item, id), pos, src, m.hosts[host]));
  }
  return absl::OkStatus();
}

// What ApplyStep checks before it copies an element: the step's source,
// destinations, shape, bytes and cross_host flag against the model.
struct StepShape {
  int64_t count = 0;  // elements copied to each destination
  int dst_host = -1;
  bool cross = false;
};

absl::StatusOr<StepShape> CheckStepShape(const Model& m, const v1::CopyStep& st,
                                         const ModelItem& item, const Buffers& bufs,
                                         const std::string& where) {
  const int src = st.src_rank();
  if (src < 0 || src >= m.from.world) {
    return Violation(
        absl::StrFormat("%s: src rank %d outside the old world of %d", where, src, m.from.world));
  }
  if (m.old_lost[src]) {
    return Violation(absl::StrFormat("%s: src rank %d is lost (or on a lost host)", where, src));
  }
  const int ndim = st.shape_size();
  if (st.src().strides_size() != ndim) {
    return Violation(absl::StrFormat("%s: src has %d strides for a rank-%d shape", where,
                                     st.src().strides_size(), ndim));
  }
  if (st.dsts_size() == 0) return Violation(absl::StrCat(where, ": no destinations"));
  int64_t count = 1;
  for (int d = 0; d < ndim; ++d) {
    if (st.shape(d) < 0) {
      return Violation(absl::StrFormat("%s: shape[%d] is %d", where, d, st.shape(d)));
    }
    count = st.shape(d) == 0 || count <= kMaxModelElements / st.shape(d) ? count * st.shape(d)
                                                                         : kMaxModelElements + 1;
  }
  const int dst_host =
      st.dsts(0).rank() >= 0 && st.dsts(0).rank() < m.to.world ? m.to.host[st.dsts(0).rank()] : -1;
  for (const auto& dst : st.dsts()) {
    if (dst.rank() < 0 || dst.rank() >= m.to.world) {
      return Violation(absl::StrFormat("%s: dst rank %d outside the new world of %d", where,
                                       dst.rank(), m.to.world));
    }
    if (dst.region().strides_size() != ndim) {
      return Violation(absl::StrFormat("%s: dst rank %d has %d strides for a rank-%d shape", where,
                                       dst.rank(), dst.region().strides_size(), ndim));
    }
    if (m.to.host[dst.rank()] != dst_host) {
      return Violation(absl::StrFormat("%s: destinations span hosts \"%s\" and \"%s\"", where,
                                       m.hosts[dst_host], m.hosts[m.to.host[dst.rank()]]));
    }
    const int64_t len = static_cast<int64_t>(bufs[st.item()][dst.rank()].size());
    if (count > len) {
      return Violation(absl::StrFormat("%s: copies %d elements into new rank %d's buffer of %d",
                                       where, count, dst.rank(), len));
    }
  }
  if (st.bytes() != count * item.element_bytes) {
    return Violation(absl::StrFormat("%s: bytes %d, expected %d elements x %d bytes", where,
                                     st.bytes(), count, item.element_bytes));
  }
  const bool cross = m.from.host[src] != dst_host;
  if (st.cross_host() != cross) {
    return Violation(
        absl::StrFormat("%s: cross_host %d, but src rank %d is on \"%s\" and the "
                        "destinations on \"%s\"",
                        where, st.cross_host(), src, m.hosts[m.from.host[src]], m.hosts[dst_host]));
  }
  return StepShape{count, dst_host, cross};
}

absl::Status ApplyStep(const Model& m, const v1::TransferPlan& plan, int s, Buffers* bufs,
                       Tally* tally) {
  const v1::CopyStep& st = plan.steps(s);
  if (st.item() < 0 || st.item() >= static_cast<int>(m.items.size())) {
    return Violation(absl::StrFormat("step %d: item %d out of range", s, st.item()));
  }
  const ModelItem& item = m.items[st.item()];
  const std::string where = absl::StrFormat("step %d, %s", s, ItemLabel(m, st.item()));
  absl::StatusOr<StepShape> shape = CheckStepShape(m, st, item, *bufs, where);
  if (!shape.ok()) return shape.status();
  const auto [count, dst_host, cross] = *shape;
  const int src = st.src_rank();
  const int ndim = st.shape_size();
  const std::vector<int64_t>& old_buf = item.old_buffers[src];
  std::vector<int64_t> idx(ndim, 0);
  for (int64_t k = 0; k < count; ++k) {
    int64_t sp = st.src().offset();
    for (int d = 0; d < ndim; ++d) sp += idx[d] * st.src().strides(d);
    if (sp < 0 || sp >= static_cast<int64_t>(old_buf.size())) {
      return Violation(absl::StrFormat("%s: reads position %d outside old rank %d's buffer of %d",
                                       where, sp, src, old_buf.size()));
    }
    const int64_t id = old_buf[sp];
    if (id == kPadding) {
      return Violation(
          absl::StrFormat("%s: reads padding at position %d of old rank %d", where, sp, src));
    }
    for (const auto& dst : st.dsts()) {
      std::vector<int64_t>& buf = (*bufs)[st.item()][dst.rank()];
      int64_t dp = dst.region().offset();
      for (int d = 0; d < ndim; ++d) dp += idx[d] * dst.region().strides(d);
      if (dp < 0 || dp >= static_cast<int64_t>(buf.size())) {
        return Violation(
            absl::StrFormat("%s: writes position %d outside new rank %d's buffer "
                            "of %d",
                            where, dp, dst.rank(), buf.size()));
      }
      if (buf[dp] != kUnwritten) {
        return Violation(absl::StrFormat("%s: writes position %d of new rank %d a second time",
                                         where, dp, dst.rank()));
      }
      buf[dp] = id;
      if (cross) {
        const auto [it, fresh] =
            tally->crossed[st.item()].emplace(int64_t{dst_host} * item.num_ids + id, s);
        if (!fresh && it->second != s) {
          return Violation(absl::StrFormat(
              "%s: %s crosses to host \"%s\" (new rank %d, position %d) a second time, after "
              "step %d: above the cross-host lower bound (rules 3 and 4)",
              where, DescribeElement(item, id), m.hosts[dst_host], dst.rank(), dp, it->second));
        }
      }
      if (absl::Status st2 = CheckSourceChoice(m, item, id, src, dst.rank(), dp, where);
          !st2.ok()) {
        return st2;
      }
    }
    for (int d = ndim - 1; d >= 0; --d) {
      if (++idx[d] < st.shape(d)) break;
      idx[d] = 0;
    }
  }
  if (cross) {
    tally->bytes_cross_host += st.bytes();
    tally->cross_host_steps += 1;
    tally->in[dst_host] += st.bytes();
    tally->out[m.from.host[src]] += st.bytes();
  } else {
    tally->bytes_local += st.bytes() * st.dsts_size();
    tally->local[dst_host] += st.bytes() * st.dsts_size();
  }
  return absl::OkStatus();
}

absl::Status ApplyFill(const Model& m, const v1::TransferPlan& plan, int f, Buffers* bufs,
                       Tally* tally) {
  const v1::ZeroFill& z = plan.zero_fills(f);
  if (z.item() < 0 || z.item() >= static_cast<int>(m.items.size())) {
    return Violation(absl::StrFormat("zero fill %d: item %d out of range", f, z.item()));
  }
  const std::string where = absl::StrFormat("zero fill %d, %s", f, ItemLabel(m, z.item()));
  if (z.rank() < 0 || z.rank() >= m.to.world) {
    return Violation(
        absl::StrFormat("%s: rank %d outside the new world of %d", where, z.rank(), m.to.world));
  }
  std::vector<int64_t>& buf = (*bufs)[z.item()][z.rank()];
  const int64_t len = static_cast<int64_t>(buf.size());
  if (z.offset() < 0 || z.count() < 0 || z.offset() > len || z.count() > len - z.offset()) {
    return Violation(absl::StrFormat("%s: [%d, +%d) outside new rank %d's buffer of %d", where,
                                     z.offset(), z.count(), z.rank(), len));
  }
  for (int64_t p = z.offset(); p < z.offset() + z.count(); ++p) {
    if (buf[p] != kUnwritten) {
      return Violation(absl::StrFormat("%s: writes position %d of new rank %d a second time", where,
                                       p, z.rank()));
    }
    buf[p] = kPadding;
  }
  tally->bytes_zero_filled += z.count() * m.items[z.item()].element_bytes;
  return absl::OkStatus();
}

absl::Status CheckContent(const Model& m, const Buffers& bufs) {
  for (size_t i = 0; i < m.items.size(); ++i) {
    const ModelItem& item = m.items[i];
    for (int r = 0; r < m.to.world; ++r) {
      const std::vector<int64_t>& want = item.new_buffers[r];
      const std::vector<int64_t>& got = bufs[i][r];
      for (size_t p = 0; p < want.size(); ++p) {
        if (got[p] == want[p]) continue;
        if (got[p] == kUnwritten) {
          return Violation(
              absl::StrFormat("%s: position %d of new rank %d is never written "
                              "(it should hold %s)",
                              ItemLabel(m, i), p, r, DescribeElement(item, want[p])));
        }
        return Violation(absl::StrFormat("%s: position %d of new rank %d holds %s, expected %s",
                                         ItemLabel(m, i), p, r, DescribeElement(item, got[p]),
                                         DescribeElement(item, want[p])));
      }
    }
  }
  return absl::OkStatus();
}

// Rule 4's lower bound per host: bytes of the distinct elements new ranks on
// the host need that no surviving old rank on the host holds.
std::vector<int64_t> LowerBound(const Model& m) {
  std::vector<std::vector<int>> new_ranks_on(m.hosts.size());
  for (int r = 0; r < m.to.world; ++r) new_ranks_on[m.to.host[r]].push_back(r);
  std::vector<int64_t> bound(m.hosts.size(), 0);
  for (const ModelItem& item : m.items) {
    std::vector<int> seen_on(item.num_ids, -1);
    for (size_t h = 0; h < m.hosts.size(); ++h) {
      for (int r : new_ranks_on[h]) {
        for (int64_t id : item.new_buffers[r]) {
          if (id == kPadding || seen_on[id] == static_cast<int>(h)) continue;
          seen_on[id] = static_cast<int>(h);
          if (!HeldOnHost(m, item, id, static_cast<int>(h))) bound[h] += item.element_bytes;
        }
      }
    }
  }
  return bound;
}

absl::Status CheckStat(const char* field, int64_t got, int64_t want) {
  if (got == want) return absl::OkStatus();
  return Violation(absl::StrFormat("stats.%s is %d, expected %d", field, got, want));
}

absl::Status CheckStats(const Model& m, const v1::TransferPlan& plan, const Tally& t,
                        const std::vector<int64_t>& bound) {
  for (size_t h = 0; h < m.hosts.size(); ++h) {
    if (t.in[h] != bound[h]) {
      return Violation(
          absl::StrFormat("host \"%s\" receives %d cross-host bytes; the lower bound for it is %d",
                          m.hosts[h], t.in[h], bound[h]));
    }
  }
  int64_t total_bound = 0;
  for (int64_t b : bound) total_bound += b;
  const v1::PlanStats& s = plan.stats();
  for (auto [field, got, want] :
       {std::make_tuple("bytes_local", s.bytes_local(), t.bytes_local),
        std::make_tuple("bytes_cross_host", s.bytes_cross_host(), t.bytes_cross_host),
        std::make_tuple("lower_bound_cross_host", s.lower_bound_cross_host(), total_bound),
        std::make_tuple("bytes_zero_filled", s.bytes_zero_filled(), t.bytes_zero_filled),
        std::make_tuple("steps", s.steps(), int64_t{plan.steps_size()}),
        std::make_tuple("cross_host_steps", s.cross_host_steps(), t.cross_host_steps),
        std::make_tuple("zero_fills", s.zero_fills(), int64_t{plan.zero_fills_size()})}) {
    if (absl::Status st = CheckStat(field, got, want); !st.ok()) return st;
  }
  // Per host: hosts with no traffic may be listed (with zeros) or left out.
  std::map<std::string, const v1::HostTraffic*> listed;
  for (const auto& h : s.hosts()) {
    if (!listed.emplace(h.host(), &h).second) {
      return Violation(absl::StrFormat("stats.hosts lists \"%s\" twice", h.host()));
    }
  }
  for (size_t h = 0; h < m.hosts.size(); ++h) {
    auto it = listed.find(m.hosts[h]);
    const int64_t in = it == listed.end() ? 0 : it->second->bytes_in();
    const int64_t out = it == listed.end() ? 0 : it->second->bytes_out();
    const int64_t local = it == listed.end() ? 0 : it->second->bytes_local();
    if (in != t.in[h] || out != t.out[h] || local != t.local[h]) {
      return Violation(absl::StrFormat(
          "stats.hosts[\"%s\"] (in, out, local) = (%d, %d, %d), expected (%d, %d, %d)", m.hosts[h],
          in, out, local, t.in[h], t.out[h], t.local[h]));
    }
    if (it != listed.end()) listed.erase(it);
  }
  for (const auto& [host, traffic] : listed) {
    if (traffic->bytes_in() != 0 || traffic->bytes_out() != 0 || traffic->bytes_local() != 0) {
      return Violation(
          absl::StrFormat("stats.hosts lists \"%s\", which is in neither placement", host));
    }
  }
  return absl::OkStatus();
}

// The slots a layout's placement gives (either form): its ranks.
int64_t ExpandedWorld(const v1::Layout& l) {
  const v1::Placement& p = l.placement();
  return p.ranks_size() > 0 ? p.ranks_size() : int64_t{p.hosts_size()} * p.devices_per_host();
}

// Every replica's steps, fills and regenerated blobs of a plan whose
// replicas repeat: replica k's are replica 0's with source ranks plus
// k * src_rank_stride, destination ranks plus k * dst_rank_stride and step
// indexes plus k * (replica 0's steps).
v1::TransferPlan WriteOutReplicas(const v1::TransferPlan& plan) {
  v1::TransferPlan out = plan;
  out.clear_replicas();
  out.clear_steps();
  out.clear_zero_fills();
  out.clear_regenerate();
  const v1::ReplicaRepeat& r = plan.replicas();
  for (int k = 0; k < r.count(); ++k) {
    for (const v1::CopyStep& step : plan.steps()) {
      v1::CopyStep* s = out.add_steps();
      *s = step;
      s->set_src_rank(static_cast<int32_t>(step.src_rank() + int64_t{k} * r.src_rank_stride()));
      for (v1::Destination& d : *s->mutable_dsts()) {
        d.set_rank(static_cast<int32_t>(d.rank() + int64_t{k} * r.dst_rank_stride()));
      }
      s->set_index(step.index() + int64_t{k} * plan.steps_size());
    }
    for (const v1::ZeroFill& fill : plan.zero_fills()) {
      v1::ZeroFill* f = out.add_zero_fills();
      *f = fill;
      f->set_rank(static_cast<int32_t>(fill.rank() + int64_t{k} * r.dst_rank_stride()));
    }
    for (const v1::Regenerate& g : plan.regenerate()) {
      v1::Regenerate* e = out.add_regenerate();
      *e = g;
      e->set_rank(static_cast<int32_t>(g.rank() + int64_t{k} * r.dst_rank_stride()));
    }
  }
  std::sort(out.mutable_regenerate()->begin(), out.mutable_regenerate()->end(),
            [](const v1::Regenerate& a, const v1::Regenerate& b) {
              return std::make_pair(a.rank(), a.item()) < std::make_pair(b.rank(), b.item());
            });
  return out;
}

}  // namespace

absl::Status VerifyPlan(const v1::Ptc& ptc, const v1::Layout& from, const v1::Layout& to,
                        const std::vector<std::string>& lost_hosts,
                        const std::vector<int>& lost_ranks, const v1::TransferPlan& compact) {
  // A plan whose replicas repeat is checked written out (its own reading of
  // TransferPlan.replicas, not the planner's).
  // Replica k's ranks must stay ranks of the layouts: k * stride (k <
  // count) fits in each world, so that writing the plan out stays bounded.
  const v1::ReplicaRepeat& repeat = compact.replicas();
  const int64_t old_world = ExpandedWorld(compact.source_layout());
  const int64_t new_world = ExpandedWorld(compact.target_layout());
  if (repeat.count() < 0 || repeat.count() > std::max<int64_t>(new_world, 1) ||
      (repeat.count() > 1 &&
       (repeat.src_rank_stride() < 0 || repeat.dst_rank_stride() < 0 ||
        int64_t{repeat.count() - 1} * repeat.src_rank_stride() >= std::max<int64_t>(old_world, 1) ||
        int64_t{repeat.count() - 1} * repeat.dst_rank_stride() >=
            std::max<int64_t>(new_world, 1)))) {
    return absl::FailedPreconditionError(
        absl::StrCat("replicas: count ", repeat.count(), ", strides ", repeat.src_rank_stride(),
                     " and ", repeat.dst_rank_stride(), " reach beyond the worlds of ", old_world,
                     " and ", new_world, " ranks"));
  }
  const v1::TransferPlan written_out =
      compact.replicas().count() > 1 ? WriteOutReplicas(compact) : v1::TransferPlan();
  const v1::TransferPlan& plan = compact.replicas().count() > 1 ? written_out : compact;
  absl::StatusOr<Model> model = BuildModel(ptc, from, to, lost_hosts, lost_ranks);
  if (!model.ok()) return model.status();
  const Model& m = *model;
  if (absl::Status s = CheckHeader(m, from, to, plan); !s.ok()) return s;

  Buffers bufs(m.items.size());
  for (size_t i = 0; i < m.items.size(); ++i) {
    for (int r = 0; r < m.to.world; ++r) {
      bufs[i].emplace_back(m.items[i].new_buffers[r].size(), kUnwritten);
    }
  }
  Tally tally;
  tally.in.assign(m.hosts.size(), 0);
  tally.out.assign(m.hosts.size(), 0);
  tally.local.assign(m.hosts.size(), 0);
  tally.crossed.resize(m.items.size());
  for (int s = 0; s < plan.steps_size(); ++s) {
    if (absl::Status st = ApplyStep(m, plan, s, &bufs, &tally); !st.ok()) return st;
  }
  for (int f = 0; f < plan.zero_fills_size(); ++f) {
    if (absl::Status st = ApplyFill(m, plan, f, &bufs, &tally); !st.ok()) return st;
  }
  if (absl::Status s = CheckContent(m, bufs); !s.ok()) return s;
  return CheckStats(m, plan, tally, LowerBound(m));
}

absl::StatusOr<std::vector<std::string>> UnrecoverableItems(
    const v1::Ptc& ptc, const v1::Layout& from, const v1::Layout& to,
    const std::vector<std::string>& lost_hosts, const std::vector<int>& lost_ranks) {
  absl::StatusOr<Model> model = BuildModel(ptc, from, to, lost_hosts, lost_ranks);
  if (!model.ok()) return model.status();
  std::vector<std::string> names;
  for (const ModelItem& item : model->items) {
    bool lost = false;
    for (int r = 0; r < model->to.world && !lost; ++r) {
      for (int64_t id : item.new_buffers[r]) {
        if (id != kPadding && item.holder_begin[id] == item.holder_begin[id + 1]) {
          lost = true;
          break;
        }
      }
    }
    if (lost) names.push_back(item.name);
  }
  return names;
}

}  // namespace reshard::verifier
