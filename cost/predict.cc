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
  for (const planner::Plan::Step& s : plan.steps) {
    const std::string& src = At(src_host, s.src_rank);
    for (int32_t d = s.dst_begin; d < s.dst_end; ++d) {
      const std::string& dst = At(dst_host, plan.dsts[d].rank);
      t.hosts[dst].written += s.bytes;
      if (!s.cross_host) t.hosts[src].local += s.bytes;
    }
    if (s.cross_host && s.dst_end > s.dst_begin) {
      const std::string& dst = At(dst_host, plan.dsts[s.dst_begin].rank);
      t.hosts[src].out += s.bytes;
      t.hosts[dst].in += s.bytes;
      t.pairs[{src, dst}] += s.bytes;
    }
  }
  for (const planner::Plan::Fill& f : plan.fills) {
    t.hosts[At(dst_host, f.rank)].written += f.count * plan.items[f.item].element_bytes;
  }
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
  // Each host's NIC: resource 2i out, 2i + 1 in. A transfer starts once both
  // of its ends set up their task and reached their peers.
  std::vector<double> capacities;
  std::vector<double> ready;
  for (size_t i = 0; i < names.size(); ++i) {
    const HostBytes& b = traffic.hosts.at(names[i]);
    capacities.push_back(rates[i].send.bytes_per_s);
    capacities.push_back(rates[i].receive.bytes_per_s);
    ready.push_back(Seconds(b.written, rates[i].setup) + rates[i].prove_seconds);
  }
  std::vector<Flow> flows;
  std::vector<std::pair<int, int>> ends;
  for (const auto& [pair, bytes] : traffic.pairs) {
    const int a = index.at(pair.first), b = index.at(pair.second);
    flows.push_back(
        Flow{static_cast<double>(bytes), {2 * a, 2 * b + 1}, std::max(ready[a], ready[b])});
    ends.emplace_back(a, b);
  }
  const FlowResult sim = SimulateFlows(capacities, flows);
  double critical = -1;
  for (size_t i = 0; i < names.size(); ++i) {
    const HostBytes& b = traffic.hosts.at(names[i]);
    const HostRates& r = rates[i];
    double net_end = ready[i];
    bool crosses = false;
    for (size_t f = 0; f < flows.size(); ++f) {
      if (ends[f].first != static_cast<int>(i) && ends[f].second != static_cast<int>(i)) continue;
      net_end = std::max(net_end, sim.end[f]);
      crosses = true;
    }
    const double local = Seconds(b.local, r.copy);
    v1::HostCost* h = out.add_hosts();
    h->set_host(names[i]);
    h->set_setup_seconds(Seconds(b.written, r.setup));
    h->set_move_seconds(std::max(net_end - ready[i], local));
    h->set_verify_seconds(Seconds(b.written, r.verify));
    h->set_seal_seconds(Seconds(b.written, r.seal));
    h->set_total_seconds(ready[i] + h->move_seconds() + h->verify_seconds() + h->seal_seconds());
    h->set_route(r.route);
    h->set_bytes_in(b.in);
    h->set_bytes_out(b.out);
    h->set_bytes_local(b.local);
    h->set_bytes_new(b.written);
    if (h->total_seconds() > critical) {
      critical = h->total_seconds();
      out.set_critical_host(names[i]);
    }
    const double bound = std::max(Seconds(b.in, r.receive), Seconds(b.out, r.send));
    if (bound > out.bound_seconds() || out.bound_host().empty()) {
      out.set_bound_seconds(bound);
      out.set_bound_host(names[i]);
    }
    out.set_load_seconds(std::max(out.load_seconds(), Seconds(b.written, r.copy)));
    // Only the rates this host's task uses must be learned.
    const bool net_ok =
        !crosses || ((b.out == 0 || r.send.learned) && (b.in == 0 || r.receive.learned));
    const bool local_ok = b.local == 0 || crosses || r.copy.learned;
    const bool phases_ok =
        b.written == 0 || (r.setup.learned && r.verify.learned && r.seal.learned);
    calibrated = calibrated && net_ok && local_ok && phases_ok;
  }
  // The critical host's transfer that ends last.
  double last = -1;
  const int crit = out.critical_host().empty() ? -1 : index.at(out.critical_host());
  for (size_t f = 0; f < flows.size(); ++f) {
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

TaskObservation ObservationOf(const Traffic& traffic, const std::string& host,
                              const std::string& route, const v1::TaskTimings& timings) {
  TaskObservation o;
  o.host = host;
  o.route = route;
  o.timings = timings;
  auto it = traffic.hosts.find(host);
  if (it != traffic.hosts.end()) {
    o.bytes_in = it->second.in;
    o.bytes_out = it->second.out;
    o.bytes_local = it->second.local;
    o.bytes_new = it->second.written;
  }
  return o;
}

double LongestTask(const std::vector<v1::TaskTimings>& timings) {
  double longest = 0;
  for (const v1::TaskTimings& t : timings) longest = std::max(longest, t.total_seconds());
  return longest;
}

}  // namespace reshard::cost
