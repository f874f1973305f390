// The scale simulator (docs/scheduler.md, "At scale"): a plan's moves on a
// topology (topology.h), GPU by GPU, with max-min fair sharing of every link
// (flow_sim.h). Two data planes:
//
//  - kDirect, the physical bound: the state stays in GPU memory; a copy
//    within a host crosses NVLink (the source GPU's out, the destination's
//    in; within one GPU its memory), a copy across hosts leaves by the NIC
//    of the source's rail and arrives on the destination's (rail network,
//    the two on different rails: half of it over NVLink first to the
//    source host's GPU on the destination's rail, as NCCL's PXN does, half
//    over the source's rail and NVLink last, so no byte crosses rails;
//    fat-tree: through the leaves' oversubscribed uplinks); a step's further destinations on the
//    receiving host are NVLink copies from the first.
//  - kHostStaged, today's agents: each old rank's bytes the plan reads go
//    to host memory over its PCIe link (publish), the agents move them
//    host to host over all of a host's NICs and copy within a host in its
//    memory, every byte sent or received costing cpu_per_byte and every
//    byte copied cpu_per_local_byte on the host's agent cores, then each new rank reads its bytes
//    over PCIe (load). Between the move and the load every new byte is checked (hashed at `hash`
//    per agent core), and the operation's overhead comes on top. The phases follow one another, as
//    in a stop-the-world operation.
//  - kHostMemory, today's agents on a job whose state is in host memory (a
//    CPU job, or the emulated cluster): kHostStaged without the publish
//    and the load.
//
// Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "cost/topology.h"
#include "planner/planner.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::cost {

enum class DataPlane { kDirect, kHostStaged, kHostMemory };

/// One phase: its simulated seconds, the lower bound set by its busiest
/// resource alone (its bytes over its capacity) and that resource's name
/// ("host-3 nic1 out", "host-0 cpu", "host-2 gpu5 pcie in", ...).
struct PhaseTime {
  double seconds = 0;
  double bound_seconds = 0;
  std::string critical;
};

struct ScaleResult {
  PhaseTime publish, move, check, load;  // kDirect: only move
  double overhead_seconds = 0;           // kDirect: 0
  double total_seconds = 0;              // the phases' and the overhead
  int64_t bytes_cross_host = 0;          // each cross-host step once
  int64_t bytes_local = 0;               // copies within a host (each destination)
  int flows = 0;                         // of the move, after merging equal routes
  int64_t events = 0;                    // rate allocations of the move's simulation
  bool cut_short = false;                // FlowResult::cut_short of any phase
};

/// Simulates `plan` (from `from` to `to`) on `topology` with `plane`.
/// Hosts are the layouts' host names in sorted order, mapped to the
/// topology's hosts 0..n-1; INVALID_ARGUMENT when the layouts name more
/// hosts than it has or a device at or beyond gpus_per_host.
absl::StatusOr<ScaleResult> SimulateScale(const planner::Plan& plan, const v1::Layout& from,
                                          const v1::Layout& to, const Topology& topology,
                                          DataPlane plane);

}  // namespace reshard::cost
