// Plan -> TransferPlan. Every step costs a handful of allocations (the step,
// its source region, its destinations and their regions, four repeated
// fields): sizes are reserved up front so that nothing grows twice, and the
// arena overload lets a caller allocate all of it from one arena (and free it
// at once).
#include <google/protobuf/arena.h>

#include "planner/planner.h"

namespace reshard::planner {
namespace {

void FillStats(const Plan& plan, v1::PlanStats* st) {
  st->set_bytes_local(plan.bytes_local);
  st->set_bytes_cross_host(plan.bytes_cross_host);
  st->set_lower_bound_cross_host(plan.lower_bound_cross_host);
  st->set_bytes_zero_filled(plan.bytes_zero_filled);
  st->set_steps(plan.TotalSteps());
  st->set_cross_host_steps(plan.cross_host_steps);
  st->set_zero_fills(plan.TotalFills());
  for (const Plan::HostStats& h : plan.hosts) {
    v1::HostTraffic* ht = st->add_hosts();
    ht->set_host(h.host);
    ht->set_bytes_in(h.bytes_in);
    ht->set_bytes_out(h.bytes_out);
    ht->set_bytes_local(h.bytes_local);
  }
}

void FillProto(const Plan& plan, const v1::Layout& from, const v1::Layout& to,
               v1::TransferPlan* out) {
  *out->mutable_source_layout() = from;
  *out->mutable_target_layout() = to;
  out->mutable_items()->Reserve(static_cast<int>(plan.items.size()));
  for (const Plan::Item& it : plan.items) {
    v1::PlanItem* pi = out->add_items();
    pi->set_name(it.name);
    pi->set_is_blob(it.is_blob);
    pi->set_element_bytes(it.element_bytes);
  }
  auto* steps = out->mutable_steps();
  steps->Reserve(static_cast<int>(plan.steps.size()));
  int64_t index = 0;
  for (const Plan::Step& s : plan.steps) {
    v1::CopyStep* cs = steps->Add();
    cs->set_item(s.item);
    cs->set_src_rank(s.src_rank);
    v1::StridedRegion* src = cs->mutable_src();
    src->set_offset(s.src_offset);
    const int64_t* src_stride = plan.StridesOf(s.src_strides);
    auto* shape = cs->mutable_shape();
    auto* src_strides = src->mutable_strides();
    shape->Reserve(s.ndim);
    src_strides->Reserve(s.ndim);
    const int64_t* step_shape = plan.ShapeOf(s);
    for (int d = 0; d < s.ndim; ++d) {
      shape->AddAlreadyReserved(step_shape[d]);
      src_strides->AddAlreadyReserved(src_stride[d]);
    }
    auto* dsts = cs->mutable_dsts();
    dsts->Reserve(s.dst_end - s.dst_begin);
    for (int i = s.dst_begin; i < s.dst_end; ++i) {
      const Plan::Dst& pd = plan.dsts[i];
      v1::Destination* dst = dsts->Add();
      dst->set_rank(pd.rank);
      v1::StridedRegion* region = dst->mutable_region();
      region->set_offset(pd.offset);
      const int64_t* dst_stride = plan.StridesOf(pd.strides);
      auto* strides = region->mutable_strides();
      strides->Reserve(s.ndim);
      for (int d = 0; d < s.ndim; ++d) strides->AddAlreadyReserved(dst_stride[d]);
    }
    cs->set_bytes(s.bytes);
    cs->set_cross_host(s.cross_host);
    cs->set_index(index++);
  }
  auto* fills = out->mutable_zero_fills();
  fills->Reserve(static_cast<int>(plan.fills.size()));
  for (const Plan::Fill& f : plan.fills) {
    v1::ZeroFill* z = fills->Add();
    z->set_item(f.item);
    z->set_rank(f.rank);
    z->set_offset(f.offset);
    z->set_count(f.count);
  }
  out->mutable_lost_ranks()->Reserve(static_cast<int>(plan.lost_ranks.size()));
  for (int r : plan.lost_ranks) out->add_lost_ranks(r);
  for (const auto& [rank, item] : plan.regenerate) {
    v1::Regenerate* g = out->add_regenerate();
    g->set_rank(rank);
    g->set_item(item);
  }
  if (plan.replicas.count > 1) {
    v1::ReplicaRepeat* r = out->mutable_replicas();
    r->set_count(plan.replicas.count);
    r->set_src_rank_stride(plan.replicas.src_stride);
    r->set_dst_rank_stride(plan.replicas.dst_stride);
  }
  FillStats(plan, out->mutable_stats());
}

}  // namespace

v1::PlanStats StatsOf(const Plan& plan) {
  v1::PlanStats stats;
  FillStats(plan, &stats);
  return stats;
}

v1::TransferPlan ToProto(const Plan& plan, const v1::Layout& from, const v1::Layout& to) {
  v1::TransferPlan out;
  FillProto(plan, from, to, &out);
  return out;
}

v1::TransferPlan* ToProto(const Plan& plan, const v1::Layout& from, const v1::Layout& to,
                          google::protobuf::Arena* arena) {
  v1::TransferPlan* out = google::protobuf::Arena::CreateMessage<v1::TransferPlan>(arena);
  FillProto(plan, from, to, out);
  return out;
}

}  // namespace reshard::planner
