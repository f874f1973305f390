// The transfer planner: old generation + new layout (+ lost ranks or hosts)
// -> a plan obeying the five rules of docs/partitioning.md, "The plan".
//
// Pure: no I/O, no clock, no threads. Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/arena.h"
#include "planner/balance.h"
#include "planner/geometry.h"
#include "planner/plan_steps.h"
#include "reshard/v1/plan.pb.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::planner {

/// Old ranks or hosts whose bytes are gone.
struct LostSet {
  std::vector<std::string> hosts;
  std::vector<int> ranks;  // ranks of the old generation
};

/// The plan in the planner's compact form (what the benchmark measures);
/// ToProto() turns it into the API's TransferPlan.
struct Plan {
  struct Item {
    std::string name;
    bool is_blob = false;
    int element_bytes = 1;
    int ndim = 1;
  };
  /// The strides of a region in a rank's buffer. A plan has millions of
  /// regions and few distinct strides: steps and destinations name theirs by
  /// index into `strides` (each distinct set once), which keeps them small.
  struct Strides {
    int64_t v[kMaxDims] = {};
  };
  /// A step's shape (zero past its ndim), kept once per distinct shape in
  /// `shapes` for the same reason.
  struct Shape {
    int64_t v[kMaxDims] = {};
  };
  /// The region of destination rank `rank`: at `offset` with strides
  /// `strides[this->strides]` (View{offset, strides}).
  struct Dst {
    int32_t rank;
    int32_t strides;
    int64_t offset;
  };
  struct Step {
    int32_t item;
    int32_t src_rank;
    int32_t dst_begin;  // [dst_begin, dst_end) in `dsts`
    int32_t dst_end;
    int32_t src_strides;  // the source region: at src_offset with strides[src_strides]
    int32_t shape;        // shapes[shape]
    bool cross_host;
    int8_t ndim;    // dimensions of the region (may be fewer than the item's)
    int64_t bytes;  // of one destination's copy
    int64_t src_offset;
  };
  struct Fill {
    int32_t item;
    int32_t rank;
    int64_t offset;
    int64_t count;
  };
  struct HostStats {
    std::string host;
    int64_t bytes_in = 0, bytes_out = 0, bytes_local = 0;
  };

  /// When the job's replicas plan alone (replicas.h): `steps`, `dsts`,
  /// `fills` and `regenerate` are replica 0's, and replica k's are the same
  /// with every source rank plus k * src_stride and every destination rank
  /// plus k * dst_stride. The totals, `hosts` and `cross_host_steps` are the
  /// whole plan's; `remote_sends` is replica 0's (its own host indices).
  struct Replicas {
    int32_t count = 1;
    int32_t src_stride = 0;
    int32_t dst_stride = 0;
  };

  std::vector<Item> items;
  Replicas replicas;
  std::vector<Step> steps;
  std::vector<Dst> dsts;
  std::vector<Strides> strides;  // distinct
  const int64_t* StridesOf(int32_t index) const { return strides[index].v; }
  std::vector<Shape> shapes;  // distinct
  const int64_t* ShapeOf(const Step& s) const { return shapes[s.shape].v; }
  std::vector<Fill> fills;
  std::vector<int> lost_ranks;
  // (new rank, item) of regenerable blobs without a surviving holder,
  // ascending: zero-filled, the worker regenerates them.
  std::vector<std::pair<int32_t, int32_t>> regenerate;

  int64_t bytes_local = 0;
  int64_t bytes_cross_host = 0;
  int64_t lower_bound_cross_host = 0;
  int64_t bytes_zero_filled = 0;
  int64_t cross_host_steps = 0;
  std::vector<HostStats> hosts;
  /// Steps of the whole plan (every replica's).
  int64_t TotalSteps() const { return static_cast<int64_t>(steps.size()) * replicas.count; }
  int64_t TotalFills() const { return static_cast<int64_t>(fills.size()) * replicas.count; }
  // Every cross-host send, its candidate hosts and the one chosen (rule 5).
  RemoteSends remote_sends;
};

/// Calls fn(step, shift) for every step of the whole plan, replica by
/// replica (Plan::replicas): the step's source rank plus shift.src and its
/// destinations' ranks plus shift.dst are its ranks there.
template <typename Fn>
void ForEachStep(const Plan& plan, Fn&& fn) {
  for (int k = 0; k < plan.replicas.count; ++k) {
    const ReplicaShift shift{k * plan.replicas.src_stride, k * plan.replicas.dst_stride,
                             static_cast<int64_t>(k) * static_cast<int64_t>(plan.steps.size())};
    for (const Plan::Step& step : plan.steps) fn(step, shift);
  }
}

/// The same for every zero fill: its rank plus shift.dst.
template <typename Fn>
void ForEachFill(const Plan& plan, Fn&& fn) {
  for (int k = 0; k < plan.replicas.count; ++k) {
    const ReplicaShift shift{k * plan.replicas.src_stride, k * plan.replicas.dst_stride, 0};
    for (const Plan::Fill& fill : plan.fills) fn(fill, shift);
  }
}

/// Plans `from` -> `to` for `ptc`. Validates its inputs (InvalidArgument);
/// FailedPrecondition, listing every tensor and region, when some needed
/// bytes have no surviving holder.
[[nodiscard]] absl::StatusOr<Plan> MakePlan(const v1::Ptc& ptc, const v1::Layout& from,
                                            const v1::Layout& to, const LostSet& lost);

v1::TransferPlan ToProto(const Plan& plan, const v1::Layout& from, const v1::Layout& to);

/// The plan's totals (TransferPlan.stats, PreviewPlan's stats).
v1::PlanStats StatsOf(const Plan& plan);

/// The same message allocated on `arena` (owned by it): several times fewer
/// heap allocations for a large plan, and freed with the arena at once.
v1::TransferPlan* ToProto(const Plan& plan, const v1::Layout& from, const v1::Layout& to,
                          google::protobuf::Arena* arena);

/// MakePlan + ToProto.
[[nodiscard]] absl::StatusOr<v1::TransferPlan> PlanTransfer(const v1::Ptc& ptc,
                                                            const v1::Layout& from,
                                                            const v1::Layout& to,
                                                            const LostSet& lost);

}  // namespace reshard::planner
