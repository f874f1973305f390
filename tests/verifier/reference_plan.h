// A deliberately naive reference planner for the verifier's mutation tests:
// one step per (element, source, destination host), built from the
// verifier's own model (verifier/model.h), so that small plans that use the
// new kinds of issue 13 exist without the real planner. It follows rules 1-4
// of docs/partitioning.md literally: same-device source first, then one on
// the destination's host, else one cross-host step per (element, host) with
// every destination on that host that needs the element.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "reshard/v1/plan.pb.h"
#include "reshard/v1/ptc.pb.h"
#include "verifier/model.h"

namespace reshard::verifier::testing {

namespace internal {

inline void AddFills(const Model& m, int item, v1::TransferPlan* plan) {
  for (int r = 0; r < m.to.world; ++r) {
    const std::vector<int64_t>& buf = m.items[item].new_buffers[r];
    for (size_t p = 0; p < buf.size();) {
      if (buf[p] != kPadding) {
        ++p;
        continue;
      }
      size_t e = p;
      while (e < buf.size() && buf[e] == kPadding) ++e;
      v1::ZeroFill* z = plan->add_zero_fills();
      z->set_item(item);
      z->set_rank(r);
      z->set_offset(static_cast<int64_t>(p));
      z->set_count(static_cast<int64_t>(e - p));
      p = e;
    }
  }
}

// The old rank that new rank `r` takes element `id` from (rules 2 and 5 aside).
inline int ChooseSource(const Model& m, const ModelItem& item, int64_t id, int r) {
  const int same = m.same_device_old[r];
  if (same >= 0 && HolderIs(item, id, same)) return same;
  const int first = item.holder_ranks[item.holder_begin[id]];
  for (int64_t k = item.holder_begin[id]; k < item.holder_begin[id + 1]; ++k) {
    if (m.from.host[item.holder_ranks[k]] == m.to.host[r]) return item.holder_ranks[k];
  }
  return first;
}

inline void SetStats(const Model& m, v1::TransferPlan* plan) {
  std::vector<int64_t> in(m.hosts.size()), out(m.hosts.size()), local(m.hosts.size());
  v1::PlanStats* st = plan->mutable_stats();
  for (const auto& s : plan->steps()) {
    const int dst_host = m.to.host[s.dsts(0).rank()];
    if (s.cross_host()) {
      st->set_bytes_cross_host(st->bytes_cross_host() + s.bytes());
      st->set_cross_host_steps(st->cross_host_steps() + 1);
      in[dst_host] += s.bytes();
      out[m.from.host[s.src_rank()]] += s.bytes();
    } else {
      st->set_bytes_local(st->bytes_local() + s.bytes() * s.dsts_size());
      local[dst_host] += s.bytes() * s.dsts_size();
    }
  }
  for (const auto& z : plan->zero_fills()) {
    st->set_bytes_zero_filled(st->bytes_zero_filled() +
                              z.count() * m.items[z.item()].element_bytes);
  }
  st->set_lower_bound_cross_host(st->bytes_cross_host());  // naive, but at the bound
  st->set_steps(plan->steps_size());
  st->set_zero_fills(plan->zero_fills_size());
  for (size_t h = 0; h < m.hosts.size(); ++h) {
    v1::HostTraffic* t = st->add_hosts();
    t->set_host(m.hosts[h]);
    t->set_bytes_in(in[h]);
    t->set_bytes_out(out[h]);
    t->set_bytes_local(local[h]);
  }
}

}  // namespace internal

/// A correct plan for the transition, built element by element from the
/// verifier's model; InvalidArgument like BuildModel, FailedPrecondition when
/// some needed element has no surviving holder.
inline absl::StatusOr<v1::TransferPlan> ReferencePlan(const v1::Ptc& ptc, const v1::Layout& from,
                                                      const v1::Layout& to,
                                                      const std::vector<std::string>& lost_hosts,
                                                      const std::vector<int>& lost_ranks) {
  absl::StatusOr<Model> model = BuildModel(ptc, from, to, lost_hosts, lost_ranks);
  if (!model.ok()) return model.status();
  const Model& m = *model;
  v1::TransferPlan plan;
  *plan.mutable_source_layout() = from;
  *plan.mutable_target_layout() = to;
  for (int r : m.lost_ranks) plan.add_lost_ranks(r);
  for (const auto& [rank, item] : m.regenerate) {
    v1::Regenerate* g = plan.add_regenerate();
    g->set_rank(rank);
    g->set_item(item);
  }
  for (int i = 0; i < static_cast<int>(m.items.size()); ++i) {
    const ModelItem& item = m.items[i];
    v1::PlanItem* pi = plan.add_items();
    pi->set_name(item.name);
    pi->set_is_blob(item.is_blob);
    pi->set_element_bytes(item.element_bytes);
    // Position of each element in each old rank's buffer.
    std::vector<std::map<int64_t, int64_t>> where(m.from.world);
    for (int r = 0; r < m.from.world; ++r) {
      for (size_t p = 0; p < item.old_buffers[r].size(); ++p) {
        if (item.old_buffers[r][p] != kPadding) where[r][item.old_buffers[r][p]] = p;
      }
    }
    // (destination host, element, source) -> destinations, in a stable order.
    std::map<std::tuple<int, int64_t, int>, std::vector<std::pair<int, int64_t>>> groups;
    for (int r = 0; r < m.to.world; ++r) {
      for (size_t p = 0; p < item.new_buffers[r].size(); ++p) {
        const int64_t id = item.new_buffers[r][p];
        if (id == kPadding) continue;
        if (item.holder_begin[id] == item.holder_begin[id + 1]) {
          return absl::FailedPreconditionError("item \"" + item.name + "\" has a lost element");
        }
        groups[{m.to.host[r], id, internal::ChooseSource(m, item, id, r)}].emplace_back(r, p);
      }
    }
    for (const auto& [key, dsts] : groups) {
      const auto [host, id, src] = key;
      v1::CopyStep* s = plan.add_steps();
      s->set_item(i);
      s->set_src_rank(src);
      s->mutable_src()->set_offset(where[src][id]);
      s->mutable_src()->add_strides(1);
      s->add_shape(1);
      for (const auto& [r, p] : dsts) {
        v1::Destination* d = s->add_dsts();
        d->set_rank(r);
        d->mutable_region()->set_offset(p);
        d->mutable_region()->add_strides(1);
      }
      s->set_bytes(item.element_bytes);
      s->set_cross_host(m.from.host[src] != host);
      s->set_index(plan.steps_size() - 1);
    }
    internal::AddFills(m, i, &plan);
  }
  internal::SetStats(m, &plan);
  return plan;
}

}  // namespace reshard::verifier::testing
