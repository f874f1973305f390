#include "planner/plan_steps.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace reshard::planner {

int ReplicaCount(const v1::TransferPlan& plan) {
  return plan.replicas().count() > 1 ? plan.replicas().count() : 1;
}

ReplicaShift ShiftOf(const v1::TransferPlan& plan, int k) {
  if (k == 0 || ReplicaCount(plan) == 1) return {};
  const v1::ReplicaRepeat& r = plan.replicas();
  return ReplicaShift{k * r.src_rank_stride(), k * r.dst_rank_stride(),
                      static_cast<int64_t>(k) * plan.steps_size()};
}

std::vector<int> ReplicasNaming(const v1::TransferPlan& plan, const std::vector<int>& old_ranks,
                                const std::vector<int>& new_ranks) {
  const int n = ReplicaCount(plan);
  if (n == 1) return {0};
  // The ranks replica 0's entries name, as sources and as destinations.
  std::vector<bool> src, dst;
  auto mark = [](std::vector<bool>* set, int rank) {
    if (rank < 0) return;
    if (static_cast<size_t>(rank) >= set->size()) set->resize(rank + 1, false);
    (*set)[rank] = true;
  };
  auto has = [](const std::vector<bool>& set, int64_t rank) {
    return rank >= 0 && static_cast<size_t>(rank) < set.size() && set[rank];
  };
  for (const v1::CopyStep& step : plan.steps()) {
    mark(&src, step.src_rank());
    for (const v1::Destination& d : step.dsts()) mark(&dst, d.rank());
  }
  for (const v1::ZeroFill& f : plan.zero_fills()) mark(&dst, f.rank());
  for (const v1::Regenerate& g : plan.regenerate()) mark(&dst, g.rank());
  std::vector<int> out;
  for (int k = 0; k < n; ++k) {
    const ReplicaShift shift = ShiftOf(plan, k);
    bool names = false;
    for (int r : old_ranks) names = names || has(src, int64_t{r} - shift.src);
    for (int r : new_ranks) names = names || has(dst, int64_t{r} - shift.dst);
    if (names) out.push_back(k);
  }
  return out;
}

void AddShifted(const v1::CopyStep& step, const ReplicaShift& shift,
                google::protobuf::RepeatedPtrField<v1::CopyStep>* out) {
  v1::CopyStep* s = out->Add();
  *s = step;
  s->set_src_rank(step.src_rank() + shift.src);
  for (v1::Destination& d : *s->mutable_dsts()) d.set_rank(d.rank() + shift.dst);
  s->set_index(step.index() + shift.index);
}

void AddShifted(const v1::ZeroFill& fill, const ReplicaShift& shift,
                google::protobuf::RepeatedPtrField<v1::ZeroFill>* out) {
  v1::ZeroFill* f = out->Add();
  *f = fill;
  f->set_rank(fill.rank() + shift.dst);
}

void AddShifted(const v1::Regenerate& g, const ReplicaShift& shift,
                google::protobuf::RepeatedPtrField<v1::Regenerate>* out) {
  v1::Regenerate* r = out->Add();
  *r = g;
  r->set_rank(g.rank() + shift.dst);
}

void SortRegenerate(google::protobuf::RepeatedPtrField<v1::Regenerate>* list) {
  std::sort(list->begin(), list->end(), [](const v1::Regenerate& a, const v1::Regenerate& b) {
    return std::make_pair(a.rank(), a.item()) < std::make_pair(b.rank(), b.item());
  });
}

v1::TransferPlan ExpandReplicas(const v1::TransferPlan& plan) {
  if (ReplicaCount(plan) == 1) return plan;
  v1::TransferPlan out;
  *out.mutable_source_layout() = plan.source_layout();
  *out.mutable_target_layout() = plan.target_layout();
  *out.mutable_items() = plan.items();
  *out.mutable_stats() = plan.stats();
  *out.mutable_lost_ranks() = plan.lost_ranks();
  const int n = ReplicaCount(plan);
  out.mutable_steps()->Reserve(static_cast<int>(
      std::min<int64_t>(int64_t{plan.steps_size()} * n, std::numeric_limits<int>::max())));
  ForEachStep(plan, [&](const v1::CopyStep& s, const ReplicaShift& sh) {
    AddShifted(s, sh, out.mutable_steps());
  });
  ForEachZeroFill(plan, [&](const v1::ZeroFill& f, const ReplicaShift& sh) {
    AddShifted(f, sh, out.mutable_zero_fills());
  });
  ForEachRegenerate(plan, [&](const v1::Regenerate& g, const ReplicaShift& sh) {
    AddShifted(g, sh, out.mutable_regenerate());
  });
  SortRegenerate(out.mutable_regenerate());
  return out;
}

}  // namespace reshard::planner
