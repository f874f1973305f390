#include "planner/planner.h"

namespace reshard::planner {

v1::TransferPlan ToProto(const Plan& plan, const v1::Layout& from, const v1::Layout& to) {
  v1::TransferPlan out;
  *out.mutable_source_layout() = from;
  *out.mutable_target_layout() = to;
  for (const Plan::Item& it : plan.items) {
    v1::PlanItem* pi = out.add_items();
    pi->set_name(it.name);
    pi->set_is_blob(it.is_blob);
    pi->set_element_bytes(it.element_bytes);
  }
  out.mutable_steps()->Reserve(static_cast<int>(plan.steps.size()));
  for (const Plan::Step& s : plan.steps) {
    v1::CopyStep* cs = out.add_steps();
    cs->set_item(s.item);
    cs->set_src_rank(s.src_rank);
    cs->mutable_src()->set_offset(s.src.offset);
    for (int d = 0; d < s.ndim; ++d) {
      cs->add_shape(s.shape[d]);
      cs->mutable_src()->add_strides(s.src.strides[d]);
    }
    for (int i = s.dst_begin; i < s.dst_end; ++i) {
      v1::Destination* dst = cs->add_dsts();
      dst->set_rank(plan.dsts[i].rank);
      dst->mutable_region()->set_offset(plan.dsts[i].view.offset);
      for (int d = 0; d < s.ndim; ++d)
        dst->mutable_region()->add_strides(plan.dsts[i].view.strides[d]);
    }
    cs->set_bytes(s.bytes);
    cs->set_cross_host(s.cross_host);
    cs->set_index(out.steps_size() - 1);
  }
  for (const Plan::Fill& f : plan.fills) {
    v1::ZeroFill* z = out.add_zero_fills();
    z->set_item(f.item);
    z->set_rank(f.rank);
    z->set_offset(f.offset);
    z->set_count(f.count);
  }
  for (int r : plan.lost_ranks) out.add_lost_ranks(r);
  for (const auto& [rank, item] : plan.regenerate) {
    v1::Regenerate* g = out.add_regenerate();
    g->set_rank(rank);
    g->set_item(item);
  }
  v1::PlanStats* st = out.mutable_stats();
  st->set_bytes_local(plan.bytes_local);
  st->set_bytes_cross_host(plan.bytes_cross_host);
  st->set_lower_bound_cross_host(plan.lower_bound_cross_host);
  st->set_bytes_zero_filled(plan.bytes_zero_filled);
  st->set_steps(static_cast<int64_t>(plan.steps.size()));
  st->set_cross_host_steps(plan.cross_host_steps);
  st->set_zero_fills(static_cast<int64_t>(plan.fills.size()));
  for (const Plan::HostStats& h : plan.hosts) {
    v1::HostTraffic* ht = st->add_hosts();
    ht->set_host(h.host);
    ht->set_bytes_in(h.bytes_in);
    ht->set_bytes_out(h.bytes_out);
    ht->set_bytes_local(h.bytes_local);
  }
  return out;
}

}  // namespace reshard::planner
