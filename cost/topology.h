// A cluster's hardware for the scale simulator (scale_sim.h,
// docs/scheduler.md "At scale"): hosts of GPUs joined by NVLink, each GPU's
// PCIe link to its host, NICs per host on a rail-optimised or fat-tree
// network, and what today's data plane costs per byte on a host's CPUs.
// Read from a small text file, one `key value` per line (`#` comments):
//
//   hosts 129
//   gpus_per_host 8
//   nvlink 450GB/s          # per GPU, each direction
//   pcie 50GB/s             # per GPU, each direction
//   hbm 1600GB/s            # a copy within one GPU's memory
//   nics_per_host 8
//   nic 400Gb/s             # per NIC, each direction
//   network rail            # rail | fat-tree
//   oversubscription 1      # fat-tree: leaf uplinks = hosts_per_leaf x NICs / this
//   hosts_per_leaf 16       # fat-tree only
//   agent_cores 16          # CPUs a host's agent may use (may be a fraction)
//   cpu_per_byte 1.4s/GB    # agents' CPU per byte sent or received
//   cpu_per_local_byte 0.25s/GB  # agents' CPU per byte copied within a host
//   host_copy 20GB/s        # a copy within a host's memory
//   hash 4GB/s              # a core checking new bytes (verify and seal)
//   overhead 0.5s           # an operation beyond its hosts' work
//
// Rates take a unit: Gb/s, GB/s, Mb/s, MB/s (decimal). Pure; thread-safe.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace reshard::cost {

enum class Network { kRail, kFatTree };

struct Topology {
  int hosts = 0;
  int gpus_per_host = 8;
  // Bytes per second, each direction where a link has two.
  double nvlink = 450e9;
  double pcie = 50e9;
  double hbm = 1600e9;
  int nics_per_host = 8;
  double nic = 50e9;
  Network network = Network::kRail;
  double oversubscription = 1;
  int hosts_per_leaf = 16;
  // Today's data plane: host memory, through the agents.
  double agent_cores = 16;
  double cpu_seconds_per_byte = 1.4e-9;
  double cpu_seconds_per_local_byte = 0.25e-9;
  double host_copy = 20e9;
  double hash = 4e9;
  double overhead_seconds = 0.5;
};

/// The topology in `text` (the format above); keys left out keep the
/// defaults above except `hosts`, which is required. INVALID_ARGUMENT names
/// the line, the key and the value of the first fault.
absl::StatusOr<Topology> ParseTopology(const std::string& text);

/// "h100-rail: 129 hosts x 8 GPUs, 8 x 400 Gb/s NICs, rail" style summary.
std::string Describe(const Topology& t);

}  // namespace reshard::cost
