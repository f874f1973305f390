// A plan's predicted time (docs/scheduler.md, "The cost of an operation"):
// its traffic per host and per host pair, its cross-host transfers and each
// host's local copies run through the flow simulator (flow_sim.h) on each
// host's NIC and copy rates and its machine's CPUs (shared by the hosts of
// one machine), and each host's other phases at its rates (model.h). Pure;
// thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "cost/model.h"
#include "planner/planner.h"
#include "reshard/v1/agent.pb.h"
#include "reshard/v1/plan.pb.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::cost {

struct HostBytes {
  int64_t in = 0, out = 0, local = 0;
  int64_t written = 0;  // bytes of the host's new ranks the plan writes (copies and zero fills)
};

/// What a plan moves: per host (by id, ordered) and per (source, destination)
/// host pair across hosts (a cross-host step crosses once, whatever its
/// destinations on the receiving host).
struct Traffic {
  std::map<std::string, HostBytes> hosts;
  std::map<std::pair<std::string, std::string>, int64_t> pairs;
};

Traffic TrafficOf(const planner::Plan& plan, const v1::Layout& from, const v1::Layout& to);

/// The prediction of `traffic` with `model`'s rates; `probes`: each host's
/// registration probe (a host without one takes the defaults).
v1::CostPrediction Predict(const Traffic& traffic, const CostModel& model,
                           const std::map<std::string, v1::HostProbe>& probes);

}  // namespace reshard::cost
