// Flow-level simulation of bulk transfers with max-min fair sharing: every
// flow crosses a set of resources (a host's NIC out, a host's NIC in, a
// network link, a machine's CPUs), each with a capacity, and takes a weight
// of each per byte (1 for a NIC: bytes per second); at every moment the
// flows' rates are the max-min fair allocation (progressive filling: raise
// every unfrozen flow's rate alike until a resource is full, freeze its
// flows, repeat), and the simulation advances from one flow's end to the
// next. What the cost model predicts a plan's cross-host moves with, and
// what the scale simulator runs on a topology (docs/scheduler.md). Pure;
// thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace reshard::cost {

struct Flow {
  double bytes = 0;
  std::vector<int> resources;  // indexes into FlowSim's capacities
  double start = 0;            // seconds; the flow joins at this time
  // What a byte of the flow takes of each resource (parallel to
  // `resources`; empty: 1 of each). A CPU, for one, gives CPU-seconds per
  // second and a flow takes its CPU-seconds per byte of it.
  std::vector<double> weights = {};
  double WeightAt(size_t i) const { return weights.empty() ? 1.0 : weights[i]; }
};

struct FlowResult {
  std::vector<double> end;  // per flow: when its last byte arrived (its start when empty)
  double makespan = 0;      // the latest end (0 without flows)
  int64_t events = 0;       // rate allocations computed
  // Every event ends a flow or reaches a start, so a run takes at most two
  // per flow; past that bound (rounding that never lets a flow end) the
  // flows still running end at their current rates and this is set. A
  // prediction must never hold up the planning it comes with.
  bool cut_short = false;
};

/// Runs `flows` over resources of `capacities` (bytes per second, > 0).
/// A flow without resources, or with no bytes, ends when it starts.
FlowResult SimulateFlows(const std::vector<double>& capacities, const std::vector<Flow>& flows);

/// The max-min fair rates of `active` flows (indexes into `flows`) on
/// `capacities`: one allocation step of SimulateFlows, exposed for tests.
std::vector<double> MaxMinRates(const std::vector<double>& capacities,
                                const std::vector<Flow>& flows, const std::vector<int>& active);

}  // namespace reshard::cost
