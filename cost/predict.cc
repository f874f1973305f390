#include "cost/predict.h"

#include <algorithm>

#include "cost/flow_sim.h"
#include "planner/layout.h"

namespace reshard::cost {
namespace {

std::vector<std::string> HostOfRank(const v1::Layout& layout) {
  std::vector<std::string> out;
  for (const v1::DeviceSlot& slot : planner::ExpandPlacement(layout.placement())) {
    out.push_back(slot.host());
  }
  return out;
}

const std::string& At(const std::vector<std::string>& hosts, int rank) {
  static const std::string kNone;
  return rank >= 0 && static_cast<size_t>(rank) < hosts.size() ? hosts[rank] : kNone;
}

double Seconds(int64_t bytes, const Rate& r) {
  return bytes > 0 ? static_cast<double>(bytes) / r.bytes_per_s : 0;
}

}  // namespace

Traffic TrafficOf(const planner::Plan& plan, const v1::Layout& from, const v1::Layout& to) {
  const std::vector<std::string> src_host = HostOfRank(from);
  const std::vector<std::string> dst_host = HostOfRank(to);
  Traffic t;
  planner::ForEachStep(plan, [&](const planner::Plan::Step& s, const planner::ReplicaShift& at) {
    const std::string& src = At(src_host, s.src_rank + at.src);
    for (int32_t d = s.dst_begin; d < s.dst_end; ++d) {
      const std::string& dst = At(dst_host, plan.dsts[d].rank + at.dst);
      t.hosts[dst].written += s.bytes;
      if (!s.cross_host) t.hosts[src].local += s.bytes;
    }
    if (s.cross_host && s.dst_end > s.dst_begin) {
      const std::string& dst = At(dst_host, plan.dsts[s.dst_begin].rank + at.dst);
      t.hosts[src].out += s.bytes;
      t.hosts[dst].in += s.bytes;
      t.pairs[{src, dst}] += s.bytes;
    }
  });
  planner::ForEachFill(plan, [&](const planner::Plan::Fill& f, const planner::ReplicaShift& at) {
    t.hosts[At(dst_host, f.rank + at.dst)].written += f.count * plan.items[f.item].element_bytes;
  });
  return t;
}

v1::CostPrediction Predict(const Traffic& traffic, const CostModel& model,
                           const std::map<std::string, v1::HostProbe>& probes) {
  v1::CostPrediction out;
  bool calibrated = model.OverheadLearned();
  std::vector<std::string> names;
  std::map<std::string, int> index;
  std::vector<HostRates> rates;
  for (const auto& [host, bytes] : traffic.hosts) {
    index[host] = static_cast<int>(names.size());
    names.push_back(host);
    auto probe = probes.find(host);
    rates.push_back(model.RatesOf(host, probe == probes.end() ? nullptr : &probe->second));
  }
  const int n = static_cast<int>(names.size());
  // Resources: host i's NIC out (2i) and in (2i + 1), its local copies
  // (2n + i), then the CPUs of each machine (hosts of one machine id share
  // them; a host without one has its own).
  std::vector<double> capacities;
  std::vector<double> ready;  // a host's transfers start once it set up and reached its peers
  for (int i = 0; i < n; ++i) {
    capacities.push_back(rates[i].send.bytes_per_s);
    capacities.push_back(rates[i].receive.bytes_per_s);
    ready.push_back(Seconds(traffic.hosts.at(names[i]).written, rates[i].setup) +
                    rates[i].prove_seconds);
  }
  for (int i = 0; i < n; ++i) capacities.push_back(rates[i].copy.bytes_per_s);
  std::map<std::string, int> machine_index;
  std::vector<int> cpu_of(n);
  for (int i = 0; i < n; ++i) {
    const std::string key = rates[i].machine.empty() ? "host:" + names[i] : rates[i].machine;
    auto [it, added] = machine_index.emplace(key, static_cast<int>(capacities.size()));
    if (added) capacities.push_back(rates[i].cpus);
    capacities[it->second] = std::max<double>(capacities[it->second], rates[i].cpus);
    cpu_of[i] = it->second;
  }
  // Adds host i's CPU per byte to a flow (nothing while it is not learned).
  auto add_cpu = [&](Flow* f, int i) {
    const double c = rates[i].cpu_seconds_per_byte;
    if (!(c > 0)) return;
    for (size_t k = 0; k < f->resources.size(); ++k) {
      if (f->resources[k] == cpu_of[i]) {
        f->weights[k] += c;
        return;
      }
    }
    f->resources.push_back(cpu_of[i]);
    f->weights.push_back(c);
  };
  std::vector<Flow> flows;
  std::vector<std::pair<int, int>> ends;  // (source, destination); a local copy: (i, i)
  for (const auto& [pair, bytes] : traffic.pairs) {
    const int a = index.at(pair.first), b = index.at(pair.second);
    Flow f{static_cast<double>(bytes), {2 * a, 2 * b + 1}, std::max(ready[a], ready[b]), {1, 1}};
    add_cpu(&f, a);
    add_cpu(&f, b);
    flows.push_back(std::move(f));
    ends.emplace_back(a, b);
  }
  for (int i = 0; i < n; ++i) {
    const int64_t local = traffic.hosts.at(names[i]).local;
    if (local == 0) continue;
    Flow f{static_cast<double>(local), {2 * n + i}, ready[i], {1}};
    add_cpu(&f, i);
    flows.push_back(std::move(f));
    ends.emplace_back(i, i);
  }
  const FlowResult sim = SimulateFlows(capacities, flows);
  // Each machine's CPU-seconds over the whole operation, for the bound label.
  std::map<int, double> machine_cpu;
  for (int i = 0; i < n; ++i) {
    const HostBytes& b = traffic.hosts.at(names[i]);
    machine_cpu[cpu_of[i]] += rates[i].cpu_seconds_per_byte * (b.in + b.out + b.local);
  }
  double critical = -1;
  for (int i = 0; i < n; ++i) {
    const HostBytes& b = traffic.hosts.at(names[i]);
    const HostRates& r = rates[i];
    double end = ready[i];
    bool crosses = false;
    for (size_t f = 0; f < flows.size(); ++f) {
      if (ends[f].first != i && ends[f].second != i) continue;
      end = std::max(end, sim.end[f]);
      crosses = crosses || ends[f].first != ends[f].second;
    }
    v1::HostCost* h = out.add_hosts();
    h->set_host(names[i]);
    h->set_setup_seconds(Seconds(b.written, r.setup));
    h->set_move_seconds(end - ready[i]);
    h->set_verify_seconds(Seconds(b.written, r.verify));
    h->set_seal_seconds(Seconds(b.written, r.seal));
    h->set_total_seconds(ready[i] + h->move_seconds() + h->verify_seconds() + h->seal_seconds());
    h->set_route(r.route);
    h->set_bytes_in(b.in);
    h->set_bytes_out(b.out);
    h->set_bytes_local(b.local);
    h->set_bytes_new(b.written);
    h->set_cpu_seconds(r.cpu_seconds_per_byte * (b.in + b.out + b.local));
    // What alone would take longest: the NIC, the machine's CPUs, the copies.
    const double network = std::max(Seconds(b.in, r.receive), Seconds(b.out, r.send));
    const double cpu = machine_cpu[cpu_of[i]] / capacities[cpu_of[i]];
    const double copy = Seconds(b.local, r.copy);
    h->set_move_bound(b.in + b.out + b.local == 0     ? ""
                      : cpu >= network && cpu >= copy ? "cpu"
                      : network >= copy               ? "network"
                                                      : "copy");
    if (h->total_seconds() > critical) {
      critical = h->total_seconds();
      out.set_critical_host(names[i]);
    }
    if (network > out.bound_seconds() || out.bound_host().empty()) {
      out.set_bound_seconds(network);
      out.set_bound_host(names[i]);
    }
    out.set_load_seconds(std::max(out.load_seconds(), Seconds(b.written, r.copy)));
    // Only the rates this host's task uses must be learned; a NIC rate
    // need not be where the machine's learned CPU cost bounds the move.
    const bool net_ok = !crosses ||
                        ((b.out == 0 || r.send.learned) && (b.in == 0 || r.receive.learned)) ||
                        (r.cpu_seconds_per_byte > 0 && h->move_bound() == "cpu");
    const bool local_ok = b.local == 0 || crosses || r.copy.learned;
    const bool phases_ok =
        b.written == 0 || (r.setup.learned && r.verify.learned && r.seal.learned);
    calibrated = calibrated && net_ok && local_ok && phases_ok;
  }
  // The critical host's transfer that ends last.
  double last = -1;
  const int crit = out.critical_host().empty() ? -1 : index.at(out.critical_host());
  for (size_t f = 0; f < flows.size(); ++f) {
    if (ends[f].first == ends[f].second) continue;  // a local copy
    if (ends[f].first != crit && ends[f].second != crit) continue;
    if (sim.end[f] > last) {
      last = sim.end[f];
      out.set_critical_link(names[ends[f].first] + "->" + names[ends[f].second]);
    }
  }
  out.set_overhead_seconds(model.OverheadSeconds());
  out.set_seconds(out.overhead_seconds() + std::max(0.0, critical));
  out.set_calibrated(calibrated);
  return out;
}

}  // namespace reshard::cost
