#include "cost/flow_sim.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace reshard::cost {

std::vector<double> MaxMinRates(const std::vector<double>& capacities,
                                const std::vector<Flow>& flows, const std::vector<int>& active) {
  std::vector<double> rate(active.size(), 0);
  std::vector<double> left = capacities;
  std::vector<double> load(capacities.size(), 0);  // weight per unit of rate, unfrozen flows
  // Unfrozen flows per resource: a resource none uses any more is out of
  // the search even when rounding leaves its load a hair above 0.
  std::vector<int> users(capacities.size(), 0);
  std::vector<bool> frozen(active.size(), false);
  size_t unfrozen = 0;
  for (size_t i = 0; i < active.size(); ++i) {
    const Flow& f = flows[active[i]];
    if (f.resources.empty()) {
      frozen[i] = true;  // unconstrained: SimulateFlows ends it at once
      continue;
    }
    ++unfrozen;
    for (size_t k = 0; k < f.resources.size(); ++k) {
      load[f.resources[k]] += f.WeightAt(k);
      ++users[f.resources[k]];
    }
  }
  while (unfrozen > 0) {
    // The largest equal raise every resource in use can still take.
    double share = std::numeric_limits<double>::infinity();
    size_t full_at = left.size();  // the resource that sets the share
    for (size_t r = 0; r < left.size(); ++r) {
      if (users[r] > 0 && load[r] > 0 && left[r] / load[r] < share) {
        share = left[r] / load[r];
        full_at = r;
      }
    }
    if (share == std::numeric_limits<double>::infinity()) {
      // What is left takes nothing of any resource: unconstrained.
      for (size_t i = 0; i < active.size(); ++i) {
        if (!frozen[i]) rate[i] = share;
      }
      break;
    }
    share = std::max(share, 0.0);
    for (size_t i = 0; i < active.size(); ++i) {
      if (!frozen[i]) rate[i] += share;
    }
    for (size_t r = 0; r < left.size(); ++r) {
      if (users[r] > 0) left[r] -= share * load[r];
    }
    left[full_at] = 0;  // full by definition, whatever rounding left
    // Freeze the flows of every resource now full (at least full_at's: each
    // pass freezes some flow, so the loop ends).
    for (size_t i = 0; i < active.size(); ++i) {
      if (frozen[i]) continue;
      const Flow& f = flows[active[i]];
      bool full = false;
      for (size_t k = 0; k < f.resources.size(); ++k) {
        const int r = f.resources[k];
        full = full || static_cast<size_t>(r) == full_at ||
               (f.WeightAt(k) > 0 && left[r] <= capacities[r] * 1e-12);
      }
      if (!full) continue;
      frozen[i] = true;
      --unfrozen;
      for (size_t k = 0; k < f.resources.size(); ++k) {
        const int r = f.resources[k];
        load[r] = --users[r] == 0 ? 0 : load[r] - f.WeightAt(k);
      }
    }
  }
  return rate;
}

FlowResult SimulateFlows(const std::vector<double>& capacities, const std::vector<Flow>& flows) {
  FlowResult out;
  out.end.assign(flows.size(), 0);
  std::vector<double> left(flows.size());
  std::vector<int> pending;  // not started, by start time
  for (size_t i = 0; i < flows.size(); ++i) {
    left[i] = flows[i].bytes;
    pending.push_back(static_cast<int>(i));
  }
  std::sort(pending.begin(), pending.end(), [&](int a, int b) {
    return flows[a].start != flows[b].start ? flows[a].start > flows[b].start : a > b;
  });
  std::vector<int> active;
  double now = 0;
  const int64_t max_events = 2 * static_cast<int64_t>(flows.size()) + 2;
  while (!active.empty() || !pending.empty()) {
    if (active.empty()) now = std::max(now, flows[pending.back()].start);
    while (!pending.empty() && flows[pending.back()].start <= now) {
      const int f = pending.back();
      pending.pop_back();
      if (left[f] <= 0 || flows[f].resources.empty()) {
        out.end[f] = now;
        continue;
      }
      active.push_back(f);
    }
    if (active.empty()) continue;
    const std::vector<double> rate = MaxMinRates(capacities, flows, active);
    if (++out.events > max_events) {
      out.cut_short = true;
      for (size_t i = 0; i < active.size(); ++i) {
        const int f = active[i];
        out.end[f] = rate[i] > 0 && std::isfinite(rate[i]) ? now + left[f] / rate[i] : now;
      }
      for (int f : pending) out.end[f] = flows[f].start;
      break;
    }
    // Advance to the first end, or to the next start, whichever comes first.
    double step = std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < active.size(); ++i) {
      if (rate[i] > 0) step = std::min(step, left[active[i]] / rate[i]);
    }
    if (!pending.empty()) step = std::min(step, flows[pending.back()].start - now);
    if (step == std::numeric_limits<double>::infinity()) break;  // no capacity: never ends
    now += step;
    std::vector<int> still;
    for (size_t i = 0; i < active.size(); ++i) {
      const int f = active[i];
      left[f] = std::isinf(rate[i]) ? 0 : left[f] - rate[i] * step;
      if (left[f] <= flows[f].bytes * 1e-12) {
        out.end[f] = now;
      } else {
        still.push_back(f);
      }
    }
    active.swap(still);
  }
  for (double e : out.end) out.makespan = std::max(out.makespan, e);
  return out;
}

}  // namespace reshard::cost
