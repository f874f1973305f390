// Reading a whole TransferPlan whose replicas repeat (TransferPlan.replicas,
// planner/replicas.h): every consumer of a job's whole plan walks it here,
// so that replica k's steps are replica 0's with its ranks shifted.
//
// Pure: no I/O, no clock, no threads.
#pragma once

#include <cstdint>
#include <vector>

#include "reshard/v1/plan.pb.h"

namespace reshard::planner {

/// Where replica k's copy of a step, fill or regenerated blob is: its
/// source ranks plus `src`, its destination ranks plus `dst`, its step index
/// plus `index`. All zero for replica 0 and for a plan that does not repeat.
struct ReplicaShift {
  int32_t src = 0;
  int32_t dst = 0;
  int64_t index = 0;
};

/// The plan's replicas: 1 when it does not repeat.
int ReplicaCount(const v1::TransferPlan& plan);

/// Replica k's shift.
ReplicaShift ShiftOf(const v1::TransferPlan& plan, int k);

/// Calls fn(entry, shift) for every entry of `field` (the plan's steps,
/// zero fills or regenerated blobs) in the whole plan, replica by replica:
/// the entry's ranks plus the shift's are its ranks there.
template <typename T, typename Fn>
void ForEachInPlan(const v1::TransferPlan& plan, const google::protobuf::RepeatedPtrField<T>& field,
                   Fn&& fn) {
  const int n = ReplicaCount(plan);
  for (int k = 0; k < n; ++k) {
    const ReplicaShift shift = ShiftOf(plan, k);
    for (const T& entry : field) fn(entry, shift);
  }
}

template <typename Fn>
void ForEachStep(const v1::TransferPlan& plan, Fn&& fn) {
  ForEachInPlan(plan, plan.steps(), fn);
}
template <typename Fn>
void ForEachZeroFill(const v1::TransferPlan& plan, Fn&& fn) {
  ForEachInPlan(plan, plan.zero_fills(), fn);
}
template <typename Fn>
void ForEachRegenerate(const v1::TransferPlan& plan, Fn&& fn) {
  ForEachInPlan(plan, plan.regenerate(), fn);
}

/// The replicas (ascending) whose steps, fills or regenerated blobs may
/// name one of `old_ranks` (as a source) or `new_ranks` (as a destination):
/// replica k when such a rank less k's shift is one replica 0's entries
/// name. {0} for a plan that does not repeat. What a host's slice reads.
std::vector<int> ReplicasNaming(const v1::TransferPlan& plan, const std::vector<int>& old_ranks,
                                const std::vector<int>& new_ranks);

/// Replica k's copies, as its own plan would have them.
void AddShifted(const v1::CopyStep& step, const ReplicaShift& shift,
                google::protobuf::RepeatedPtrField<v1::CopyStep>* out);
void AddShifted(const v1::ZeroFill& fill, const ReplicaShift& shift,
                google::protobuf::RepeatedPtrField<v1::ZeroFill>* out);
void AddShifted(const v1::Regenerate& g, const ReplicaShift& shift,
                google::protobuf::RepeatedPtrField<v1::Regenerate>* out);

/// Ascending by (rank, item), as the planner lists them.
void SortRegenerate(google::protobuf::RepeatedPtrField<v1::Regenerate>* list);

/// The whole plan written out: every replica's steps, fills and
/// regenerated blobs, `replicas` cleared. A plan that does not repeat comes
/// back as it is.
v1::TransferPlan ExpandReplicas(const v1::TransferPlan& plan);

}  // namespace reshard::planner
