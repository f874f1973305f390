#include "cost/scale_sim.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cost/flow_sim.h"
#include "planner/layout.h"

namespace reshard::cost {
namespace {

// A GPU: its host (index into the sorted host names) and device.
struct Gpu {
  int host = 0;
  int device = 0;
};

// Every resource of a topology, numbered by formula: per GPU NVLink out and
// in, PCIe out and in, its memory; per rail port (a GPU's NICs) out and in;
// per host all its NICs out and in, its agent cores, its memory copies; per
// leaf its uplinks up and down.
class Resources {
 public:
  Resources(const Topology& t, int hosts, const std::vector<std::string>& names)
      : t_(t), names_(names) {
    ports_ = std::min(t.nics_per_host, t.gpus_per_host);
    leaves_ = (hosts + t.hosts_per_leaf - 1) / t.hosts_per_leaf;
    const int gpus = hosts * t.gpus_per_host;
    nvlink_ = 0;
    pcie_ = nvlink_ + 2 * gpus;
    hbm_ = pcie_ + 2 * gpus;
    port_ = hbm_ + gpus;
    host_nic_ = port_ + 2 * hosts * ports_;
    cpu_ = host_nic_ + 2 * hosts;
    copy_ = cpu_ + hosts;
    leaf_ = copy_ + hosts;
    const int total = leaf_ + 2 * leaves_;
    capacity_.assign(total, 0);
    const double port_rate = t.nic * t.nics_per_host / ports_;
    const double uplink =
        static_cast<double>(t.hosts_per_leaf) * t.nics_per_host * t.nic / t.oversubscription;
    for (int g = 0; g < gpus; ++g) {
      capacity_[nvlink_ + 2 * g] = capacity_[nvlink_ + 2 * g + 1] = t.nvlink;
      capacity_[pcie_ + 2 * g] = capacity_[pcie_ + 2 * g + 1] = t.pcie;
      capacity_[hbm_ + g] = t.hbm;
    }
    for (int p = 0; p < hosts * ports_; ++p) {
      capacity_[port_ + 2 * p] = capacity_[port_ + 2 * p + 1] = port_rate;
    }
    for (int h = 0; h < hosts; ++h) {
      capacity_[host_nic_ + 2 * h] = capacity_[host_nic_ + 2 * h + 1] = t.nic * t.nics_per_host;
      capacity_[cpu_ + h] = t.agent_cores;
      capacity_[copy_ + h] = t.host_copy;
    }
    for (int l = 0; l < leaves_; ++l)
      capacity_[leaf_ + 2 * l] = capacity_[leaf_ + 2 * l + 1] = uplink;
  }

  const std::vector<double>& capacities() const { return capacity_; }

  int Gid(const Gpu& g) const { return g.host * t_.gpus_per_host + g.device; }
  int NvlinkOut(const Gpu& g) const { return nvlink_ + 2 * Gid(g); }
  int NvlinkIn(const Gpu& g) const { return nvlink_ + 2 * Gid(g) + 1; }
  int PcieOut(const Gpu& g) const { return pcie_ + 2 * Gid(g); }
  int PcieIn(const Gpu& g) const { return pcie_ + 2 * Gid(g) + 1; }
  int Hbm(const Gpu& g) const { return hbm_ + Gid(g); }
  // The rail port of a device: the NIC(s) of its PCIe switch.
  int PortOf(int device) const { return device * ports_ / t_.gpus_per_host; }
  int PortOut(int host, int port) const { return port_ + 2 * (host * ports_ + port); }
  int PortIn(int host, int port) const { return PortOut(host, port) + 1; }
  int HostNicOut(int host) const { return host_nic_ + 2 * host; }
  int HostNicIn(int host) const { return host_nic_ + 2 * host + 1; }
  int Cpu(int host) const { return cpu_ + host; }
  int Copy(int host) const { return copy_ + host; }
  int LeafOf(int host) const { return host / t_.hosts_per_leaf; }
  int LeafUp(int leaf) const { return leaf_ + 2 * leaf; }
  int LeafDown(int leaf) const { return leaf_ + 2 * leaf + 1; }
  std::string Name(int r) const {
    const auto gpu = [&](int base, const char* what, int per) {
      const int g = (r - base) / per;
      return absl::StrCat(names_[g / t_.gpus_per_host], " gpu", g % t_.gpus_per_host, " ", what,
                          per == 2 ? ((r - base) % 2 == 0 ? " out" : " in") : "");
    };
    if (r < pcie_) return gpu(nvlink_, "nvlink", 2);
    if (r < hbm_) return gpu(pcie_, "pcie", 2);
    if (r < port_) return gpu(hbm_, "memory", 1);
    if (r < host_nic_) {
      const int p = (r - port_) / 2;
      return absl::StrCat(names_[p / ports_], " nic", p % ports_,
                          (r - port_) % 2 == 0 ? " out" : " in");
    }
    if (r < cpu_) {
      return absl::StrCat(names_[(r - host_nic_) / 2], " nics",
                          (r - host_nic_) % 2 == 0 ? " out" : " in");
    }
    if (r < copy_) return absl::StrCat(names_[r - cpu_], " agent cores");
    if (r < leaf_) return absl::StrCat(names_[r - copy_], " memory copies");
    return absl::StrCat("leaf ", (r - leaf_) / 2, (r - leaf_) % 2 == 0 ? " uplink" : " downlink");
  }

 private:
  const Topology& t_;
  const std::vector<std::string>& names_;
  int ports_ = 1, leaves_ = 1;
  int nvlink_ = 0, pcie_ = 0, hbm_ = 0, port_ = 0, host_nic_ = 0, cpu_ = 0, copy_ = 0, leaf_ = 0;
  std::vector<double> capacity_;
};

// Flows keyed by their route (resources and weights): equal routes merge.
class FlowSet {
 public:
  void Add(std::vector<int> resources, std::vector<double> weights, int64_t bytes) {
    if (bytes <= 0) return;
    auto [it, fresh] = index_.try_emplace({resources, weights}, flows_.size());
    if (fresh) {
      flows_.push_back(Flow{0, std::move(resources), 0, std::move(weights)});
    }
    flows_[it->second].bytes += static_cast<double>(bytes);
  }
  const std::vector<Flow>& flows() const { return flows_; }

 private:
  std::map<std::pair<std::vector<int>, std::vector<double>>, size_t> index_;
  std::vector<Flow> flows_;
};

PhaseTime Run(const Resources& res, const FlowSet& set, ScaleResult* out, bool count) {
  PhaseTime p;
  const std::vector<double>& cap = res.capacities();
  std::vector<double> load(cap.size(), 0);
  for (const Flow& f : set.flows()) {
    for (size_t k = 0; k < f.resources.size(); ++k) {
      load[f.resources[k]] += f.bytes * f.WeightAt(k);
    }
  }
  for (size_t r = 0; r < cap.size(); ++r) {
    if (load[r] > 0 && load[r] / cap[r] > p.bound_seconds) {
      p.bound_seconds = load[r] / cap[r];
      p.critical = res.Name(static_cast<int>(r));
    }
  }
  const FlowResult sim = SimulateFlows(cap, set.flows());
  p.seconds = sim.makespan;
  out->cut_short = out->cut_short || sim.cut_short;
  if (count) {
    out->flows = static_cast<int>(set.flows().size());
    out->events = sim.events;
  }
  return p;
}

}  // namespace

absl::StatusOr<ScaleResult> SimulateScale(const planner::Plan& plan, const v1::Layout& from,
                                          const v1::Layout& to, const Topology& topology,
                                          DataPlane plane) {
  const std::vector<v1::DeviceSlot> src_slots = planner::ExpandPlacement(from.placement());
  const std::vector<v1::DeviceSlot> dst_slots = planner::ExpandPlacement(to.placement());
  std::vector<std::string> names;
  for (const auto* slots : {&src_slots, &dst_slots}) {
    for (const v1::DeviceSlot& s : *slots) names.push_back(s.host());
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  if (static_cast<int>(names.size()) > topology.hosts) {
    return absl::InvalidArgumentError(absl::StrCat("the layouts use ", names.size(),
                                                   " hosts; the topology has ", topology.hosts));
  }
  std::unordered_map<std::string, int> host_index;
  for (size_t i = 0; i < names.size(); ++i) host_index[names[i]] = static_cast<int>(i);
  const auto gpus_of = [&](const std::vector<v1::DeviceSlot>& slots,
                           std::vector<Gpu>* out) -> absl::Status {
    for (const v1::DeviceSlot& s : slots) {
      if (s.device() < 0 || s.device() >= topology.gpus_per_host) {
        return absl::InvalidArgumentError(absl::StrCat("host ", s.host(), " device ", s.device(),
                                                       ": the topology has gpus_per_host ",
                                                       topology.gpus_per_host));
      }
      out->push_back(Gpu{host_index.at(s.host()), s.device()});
    }
    return absl::OkStatus();
  };
  std::vector<Gpu> src, dst;
  if (absl::Status s = gpus_of(src_slots, &src); !s.ok()) return s;
  if (absl::Status s = gpus_of(dst_slots, &dst); !s.ok()) return s;

  const Resources res(topology, static_cast<int>(names.size()), names);
  ScaleResult out;
  // Bytes per GPU pair (a cross-host step once, to its first destination;
  // its other destinations copy from that one), per old rank read and per
  // new rank written.
  std::map<std::pair<int, int>, int64_t> cross, local;  // (src gid, dst gid)
  std::vector<int64_t> read(src.size(), 0), written(dst.size(), 0);
  planner::ForEachStep(plan, [&](const planner::Plan::Step& s, const planner::ReplicaShift& at) {
    if (s.dst_end <= s.dst_begin) return;
    const int from_rank = s.src_rank + at.src;
    const Gpu& a = src[from_rank];
    read[from_rank] += s.bytes;
    const int first = plan.dsts[s.dst_begin].rank + at.dst;
    for (int32_t d = s.dst_begin; d < s.dst_end; ++d)
      written[plan.dsts[d].rank + at.dst] += s.bytes;
    if (s.cross_host) {
      out.bytes_cross_host += s.bytes;
      cross[{res.Gid(a), res.Gid(dst[first])}] += s.bytes;
      for (int32_t d = s.dst_begin + 1; d < s.dst_end; ++d) {
        out.bytes_local += s.bytes;
        local[{res.Gid(dst[first]), res.Gid(dst[plan.dsts[d].rank + at.dst])}] += s.bytes;
      }
    } else {
      for (int32_t d = s.dst_begin; d < s.dst_end; ++d) {
        out.bytes_local += s.bytes;
        local[{res.Gid(a), res.Gid(dst[plan.dsts[d].rank + at.dst])}] += s.bytes;
      }
    }
  });
  planner::ForEachFill(plan, [&](const planner::Plan::Fill& f, const planner::ReplicaShift& at) {
    written[f.rank + at.dst] += f.count * plan.items[f.item].element_bytes;
  });
  const int per = topology.gpus_per_host;
  const auto gpu = [per](int gid) { return Gpu{gid / per, gid % per}; };

  FlowSet move;
  if (plane == DataPlane::kDirect) {
    for (const auto& [pair, bytes] : cross) {
      const Gpu a = gpu(pair.first), b = gpu(pair.second);
      std::vector<int> route;
      if (topology.network == Network::kRail) {
        const int port = res.PortOf(b.device), own = res.PortOf(a.device);
        if (own != port) {
          // Half over the destination's rail, to the source host's GPU on
          // it over NVLink first (NCCL's PXN); half over the source's rail,
          // to the destination over NVLink last: no byte crosses rails.
          const Gpu there{a.host, b.device}, here{b.host, a.device};
          move.Add({res.NvlinkOut(a), res.NvlinkIn(there), res.PortOut(a.host, port),
                    res.PortIn(b.host, port)},
                   {}, bytes / 2);
          move.Add({res.PortOut(a.host, own), res.PortIn(b.host, own), res.NvlinkOut(here),
                    res.NvlinkIn(b)},
                   {}, bytes - bytes / 2);
          continue;
        }
        route = {res.PortOut(a.host, port), res.PortIn(b.host, port)};
      } else {
        route = {res.PortOut(a.host, res.PortOf(a.device))};
        if (res.LeafOf(a.host) != res.LeafOf(b.host)) {
          route.push_back(res.LeafUp(res.LeafOf(a.host)));
          route.push_back(res.LeafDown(res.LeafOf(b.host)));
        }
        route.push_back(res.PortIn(b.host, res.PortOf(b.device)));
      }
      move.Add(std::move(route), {}, bytes);
    }
    for (const auto& [pair, bytes] : local) {
      const Gpu a = gpu(pair.first), b = gpu(pair.second);
      if (pair.first == pair.second) {
        move.Add({res.Hbm(a)}, {2.0}, bytes);  // read and written in one memory
      } else {
        move.Add({res.NvlinkOut(a), res.NvlinkIn(b)}, {}, bytes);
      }
    }
    out.move = Run(res, move, &out, true);
    out.total_seconds = out.move.seconds;
    return out;
  }

  // Today's agents: publish over PCIe, move in host memory, check, load
  // over PCIe.
  FlowSet publish, check, load;
  std::vector<int64_t> host_written(names.size(), 0);
  for (size_t r = 0; r < dst.size(); ++r) host_written[dst[r].host] += written[r];
  if (plane == DataPlane::kHostStaged) {
    for (size_t r = 0; r < src.size(); ++r) publish.Add({res.PcieOut(src[r])}, {}, read[r]);
    for (size_t r = 0; r < dst.size(); ++r) load.Add({res.PcieIn(dst[r])}, {}, written[r]);
  }
  for (size_t h = 0; h < host_written.size(); ++h) {
    check.Add({res.Cpu(static_cast<int>(h))}, {1 / topology.hash}, host_written[h]);
  }
  const double cpu = topology.cpu_seconds_per_byte;
  std::map<std::pair<int, int>, int64_t> host_pairs;
  std::vector<int64_t> host_local(names.size(), 0);
  for (const auto& [pair, bytes] : cross)
    host_pairs[{pair.first / per, pair.second / per}] += bytes;
  for (const auto& [pair, bytes] : local) host_local[pair.first / per] += bytes;
  for (const auto& [pair, bytes] : host_pairs) {
    const auto [a, b] = pair;
    std::vector<int> route = {res.HostNicOut(a), res.Cpu(a)};
    std::vector<double> weights = {1.0, cpu};
    if (topology.network == Network::kFatTree && res.LeafOf(a) != res.LeafOf(b)) {
      route.insert(route.end(), {res.LeafUp(res.LeafOf(a)), res.LeafDown(res.LeafOf(b))});
      weights.insert(weights.end(), {1.0, 1.0});
    }
    route.insert(route.end(), {res.HostNicIn(b), res.Cpu(b)});
    weights.insert(weights.end(), {1.0, cpu});
    move.Add(std::move(route), std::move(weights), bytes);
  }
  for (size_t h = 0; h < host_local.size(); ++h) {
    const int host = static_cast<int>(h);
    move.Add({res.Copy(host), res.Cpu(host)}, {1.0, topology.cpu_seconds_per_local_byte},
             host_local[h]);
  }
  out.publish = Run(res, publish, &out, false);
  out.move = Run(res, move, &out, true);
  out.check = Run(res, check, &out, false);
  out.load = Run(res, load, &out, false);
  out.overhead_seconds = topology.overhead_seconds;
  out.total_seconds = out.publish.seconds + out.move.seconds + out.check.seconds +
                      out.load.seconds + out.overhead_seconds;
  return out;
}

}  // namespace reshard::cost
