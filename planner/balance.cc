#include "planner/balance.h"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <utility>

#include "common/log.h"
#include "planner/balance_search.h"

namespace reshard::planner {
namespace {

// The planner's exhaustive search per group of sends sharing hosts: at most
// this many nodes, and this much work (nodes x hosts and class entries
// looked at in each), so a large group costs a few milliseconds.
constexpr int64_t kPlannerNodeBudget = 2000000;
constexpr int64_t kPlannerSearchWork = int64_t{64} << 20;
// Larger groups keep the greedy and local search: many sends of similar size
// already meet the lower bound there, and the search would not finish.
constexpr size_t kPlannerSearchSends = 2000;
// Local search stops after this much work (candidate pairs looked at), so a
// huge plan costs a bounded, deterministic amount.
constexpr int64_t kLocalSearchWork = int64_t{20} << 20;

using balance_search::CountBound;
using balance_search::Flexible;
using balance_search::LargestFirst;
using balance_search::Room;
using balance_search::SearchGroup;
using balance_search::SendGroups;

bool IsCandidate(const RemoteSends& s, int64_t i, int host) {
  const int32_t* b = s.CandidatesBegin(i);
  return std::find(b, b + s.Candidates(i), host) != b + s.Candidates(i);
}

// Bytes each host must send because it is the only holder.
std::vector<int64_t> FixedLoads(const RemoteSends& s) {
  std::vector<int64_t> load(s.num_hosts, 0);
  for (int64_t i = 0; i < s.size(); ++i) {
    if (!Flexible(s, i)) load[*s.CandidatesBegin(i)] += s.bytes[i];
  }
  return load;
}

int64_t MaxOf(const std::vector<int64_t>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

// Moves and swaps sends off the busiest host while that lowers it below the
// busiest load without lifting another host to it.
class LocalSearch {
 public:
  LocalSearch(const RemoteSends& s, std::vector<int64_t>* load, std::vector<int32_t>* chosen)
      : s_(s), load_(*load), chosen_(*chosen), on_host_(s.num_hosts), pos_(s.size(), -1) {
    for (int64_t i = 0; i < s.size(); ++i) {
      if (Flexible(s, i)) Place(i, chosen_[i]);
    }
  }

  void Run() {
    while (work_ < kLocalSearchWork) {
      const int busiest =
          static_cast<int>(std::max_element(load_.begin(), load_.end()) - load_.begin());
      if (!Move(busiest) && !Swap(busiest)) return;
    }
  }

 private:
  void Place(int64_t i, int host) {
    chosen_[i] = host;
    pos_[i] = static_cast<int64_t>(on_host_[host].size());
    on_host_[host].push_back(i);
  }
  void Unplace(int64_t i) {
    std::vector<int64_t>& v = on_host_[chosen_[i]];
    pos_[v.back()] = pos_[i];
    v[pos_[i]] = v.back();
    v.pop_back();
  }
  void Reassign(int64_t i, int host) {
    load_[chosen_[i]] -= s_.bytes[i];
    Unplace(i);
    Place(i, host);
    load_[host] += s_.bytes[i];
  }

  bool Move(int from) {
    const int64_t top = load_[from];
    int64_t best_value = top, best_send = -1;
    int best_host = -1;
    for (int64_t i : on_host_[from]) {
      const int64_t b = s_.bytes[i];
      const int32_t* c = s_.CandidatesBegin(i);
      for (int k = 0; k < s_.Candidates(i); ++k, ++work_) {
        const int h = c[k];
        if (h == from || load_[h] + b >= top) continue;
        const int64_t value = std::max(top - b, load_[h] + b);
        if (value < best_value) {
          best_value = value;
          best_send = i;
          best_host = h;
        }
      }
    }
    if (best_send < 0) return false;
    Reassign(best_send, best_host);
    return true;
  }

  bool Swap(int from) {
    const int64_t top = load_[from];
    int64_t best_value = top, best_i = -1, best_j = -1;
    for (int64_t i : on_host_[from]) {
      const int64_t b = s_.bytes[i];
      const int32_t* c = s_.CandidatesBegin(i);
      for (int k = 0; k < s_.Candidates(i); ++k) {
        const int h = c[k];
        if (h == from || load_[h] >= top) continue;
        for (int64_t j : on_host_[h]) {
          ++work_;
          const int64_t d = b - s_.bytes[j];
          if (d <= 0 || load_[h] + d >= top || !IsCandidate(s_, j, from)) continue;
          const int64_t value = std::max(top - d, load_[h] + d);
          if (value < best_value) {
            best_value = value;
            best_i = i;
            best_j = j;
          }
        }
        if (work_ >= kLocalSearchWork) break;
      }
    }
    if (best_i < 0) return false;
    const int to = chosen_[best_j];
    Reassign(best_i, to);
    Reassign(best_j, from);
    return true;
  }

  const RemoteSends& s_;
  std::vector<int64_t>& load_;
  std::vector<int32_t>& chosen_;
  std::vector<std::vector<int64_t>> on_host_;
  std::vector<int64_t> pos_;
  int64_t work_ = 0;
};

// Max flow (Dinic) on a small graph: whether sends split among their
// candidates fit under `cap` bytes per host.
class Flow {
 public:
  explicit Flow(int n) : adj_(n), level_(n), it_(n) {}
  void Edge(int a, int b, int64_t cap) {
    adj_[a].push_back(static_cast<int>(e_.size()));
    e_.push_back({b, cap});
    adj_[b].push_back(static_cast<int>(e_.size()));
    e_.push_back({a, 0});
  }
  int64_t Max(int src, int dst) {
    int64_t total = 0;
    while (Levels(src, dst)) {
      std::fill(it_.begin(), it_.end(), 0);
      while (int64_t f = Push(src, dst, std::numeric_limits<int64_t>::max())) total += f;
    }
    return total;
  }

 private:
  struct E {
    int to;
    int64_t cap;
  };
  bool Levels(int src, int dst) {
    std::fill(level_.begin(), level_.end(), -1);
    std::vector<int> queue = {src};
    level_[src] = 0;
    for (size_t q = 0; q < queue.size(); ++q) {
      for (int id : adj_[queue[q]]) {
        if (e_[id].cap > 0 && level_[e_[id].to] < 0) {
          level_[e_[id].to] = level_[queue[q]] + 1;
          queue.push_back(e_[id].to);
        }
      }
    }
    return level_[dst] >= 0;
  }
  int64_t Push(int v, int dst, int64_t f) {
    if (v == dst) return f;
    for (int& k = it_[v]; k < static_cast<int>(adj_[v].size()); ++k) {
      E& e = e_[adj_[v][k]];
      if (e.cap <= 0 || level_[e.to] != level_[v] + 1) continue;
      if (int64_t got = Push(e.to, dst, std::min(f, e.cap))) {
        e.cap -= got;
        e_[adj_[v][k] ^ 1].cap += got;
        return got;
      }
    }
    return 0;
  }
  std::vector<std::vector<int>> adj_;
  std::vector<E> e_;
  std::vector<int> level_, it_;
};

// Greedy (largest first, to the candidate with the least load), then local
// search; returns the loads.
std::vector<int64_t> Heuristic(RemoteSends* s) {
  std::vector<int64_t> load = FixedLoads(*s);
  s->chosen.assign(s->size(), -1);
  std::vector<int64_t> order;
  for (int64_t i = 0; i < s->size(); ++i) {
    if (Flexible(*s, i)) {
      order.push_back(i);
    } else {
      s->chosen[i] = *s->CandidatesBegin(i);
    }
  }
  LargestFirst(s->bytes, &order);
  for (int64_t i : order) {
    const int32_t* c = s->CandidatesBegin(i);
    int best = c[0];
    for (int k = 1; k < s->Candidates(i); ++k) {
      if (load[c[k]] < load[best] || (load[c[k]] == load[best] && c[k] < best)) best = c[k];
    }
    s->chosen[i] = best;
    load[best] += s->bytes[i];
  }
  LocalSearch(*s, &load, &s->chosen).Run();
  return load;
}

}  // namespace

void RemoteSends::Add(int64_t n, const int32_t* begin, const int32_t* end) {
  RESHARD_CHECK(end > begin) << "a remote send needs a candidate host";
  bytes.push_back(n);
  const int64_t last = static_cast<int64_t>(first.size()) - 2;  // the newest set, if any
  if (last >= 0 && first[last + 1] - first[last] == end - begin &&
      std::equal(begin, end, hosts.begin() + first[last])) {
    set.push_back(static_cast<int32_t>(last));
    return;
  }
  if (end - begin == 1) {
    hosts.push_back(*begin);  // most sends: one holding host, and cheaper than insert
  } else {
    hosts.insert(hosts.end(), begin, end);
  }
  set.push_back(static_cast<int32_t>(first.size() - 1));
  first.push_back(static_cast<int64_t>(hosts.size()));
}

void BalanceSenders(RemoteSends* sends) {
  std::vector<int64_t> load = Heuristic(sends);
  // Only the group that holds the busiest sender can lower it: search that
  // one, and go on while the busiest sender moves to another group.
  std::vector<std::vector<int64_t>> groups = SendGroups(*sends);
  std::vector<std::vector<int32_t>> group_hosts(groups.size());
  std::vector<int32_t> group_of_host(sends->num_hosts, -1);
  for (size_t g = 0; g < groups.size(); ++g) {
    int32_t last_set = -1;
    for (int64_t i : groups[g]) {
      if (sends->set[i] == last_set) continue;  // the same hosts again
      last_set = sends->set[i];
      const int32_t* c = sends->CandidatesBegin(i);
      for (int k = 0; k < sends->Candidates(i); ++k) {
        if (group_of_host[c[k]] < 0) {
          group_of_host[c[k]] = static_cast<int32_t>(g);
          group_hosts[g].push_back(c[k]);
        }
      }
    }
  }
  auto group_top = [&](size_t g) {
    int64_t top = 0;
    for (int h : group_hosts[g]) top = std::max(top, load[h]);
    return top;
  };
  std::vector<char> searched(groups.size(), 0);
  for (;;) {
    const int64_t top = MaxOf(load);
    size_t g = 0;
    while (g < groups.size() && (searched[g] || group_top(g) < top)) ++g;
    if (g == groups.size() || groups[g].size() > kPlannerSearchSends) return;
    searched[g] = 1;
    const int64_t cost = static_cast<int64_t>(group_hosts[g].size() * 2 + groups[g].size() / 8 + 1);
    SearchGroup(*sends, std::move(groups[g]), &load, &sends->chosen,
                std::min(kPlannerNodeBudget, kPlannerSearchWork / cost));
    if (group_top(g) == top) return;  // the busiest sender cannot go lower
  }
}

void ChooseOnline(RemoteSends* sends) {
  std::vector<int64_t> load(sends->num_hosts, 0);
  sends->chosen.assign(sends->size(), -1);
  for (int64_t i = 0; i < sends->size(); ++i) {
    const int32_t* c = sends->CandidatesBegin(i);
    int best = c[0];
    for (int k = 1; k < sends->Candidates(i); ++k) {
      if (load[c[k]] < load[best] || (load[c[k]] == load[best] && c[k] < best)) best = c[k];
    }
    sends->chosen[i] = best;
    load[best] += sends->bytes[i];
  }
}

std::vector<int64_t> SenderLoads(const RemoteSends& sends) {
  std::vector<int64_t> load(sends.num_hosts, 0);
  for (int64_t i = 0; i < sends.size(); ++i) load[sends.chosen[i]] += sends.bytes[i];
  return load;
}

int64_t BusiestSender(const RemoteSends& sends) { return MaxOf(SenderLoads(sends)); }

int64_t BusiestSenderLowerBound(const RemoteSends& sends) {
  const std::vector<int64_t> fixed = FixedLoads(sends);
  int64_t lower = MaxOf(fixed);
  // Sends with the same candidates form one class of the flow.
  struct Class {
    int64_t bytes = 0, count = 0, min = std::numeric_limits<int64_t>::max();
  };
  std::map<std::vector<int32_t>, Class> classes;
  int64_t flexible = 0, unit = 0;
  for (int64_t i = 0; i < sends.size(); ++i) {
    if (!Flexible(sends, i)) continue;
    const int32_t* c = sends.CandidatesBegin(i);
    int64_t cheapest = std::numeric_limits<int64_t>::max();
    for (int k = 0; k < sends.Candidates(i); ++k) cheapest = std::min(cheapest, fixed[c[k]]);
    lower = std::max(lower, cheapest + sends.bytes[i]);
    std::vector<int32_t> key(c, c + sends.Candidates(i));
    std::sort(key.begin(), key.end());
    Class& cl = classes[std::move(key)];
    cl.bytes += sends.bytes[i];
    cl.count += 1;
    cl.min = std::min(cl.min, sends.bytes[i]);
    flexible += sends.bytes[i];
    unit = std::gcd(unit, sends.bytes[i]);
  }
  if (flexible == 0) return lower;
  if (unit == 0) unit = 1;
  for (const auto& [hosts, cl] : classes) {
    if (cl.min > 0) lower = std::max(lower, CountBound(fixed, hosts, cl.count, cl.min));
  }
  // Smallest cap under which the split sends fit: binary search, max flow.
  const int n_classes = static_cast<int>(classes.size());
  auto fits = [&](int64_t cap) {
    const int src = 0, dst = 1 + n_classes + sends.num_hosts;
    Flow flow(dst + 1);
    int c = 1;
    for (const auto& [hosts, cl] : classes) {
      flow.Edge(src, c, cl.bytes);
      for (int h : hosts) flow.Edge(c, 1 + n_classes + h, cl.bytes);
      ++c;
    }
    for (int h = 0; h < sends.num_hosts; ++h) {
      flow.Edge(1 + n_classes + h, dst, Room(cap, fixed[h], unit));
    }
    return flow.Max(src, dst) == flexible;
  };
  int64_t lo = lower, hi = lower + flexible;  // hi always fits
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

BusiestSenderOptimum OptimalBusiestSender(const RemoteSends& sends, int64_t node_budget) {
  RemoteSends s = sends;
  std::vector<int64_t> load = Heuristic(&s);
  BusiestSenderOptimum out;
  out.exact = true;
  for (std::vector<int64_t>& group : SendGroups(s)) {
    out.exact &= SearchGroup(s, std::move(group), &load, &s.chosen, node_budget);
  }
  out.best = MaxOf(load);
  out.lower_bound = BusiestSenderLowerBound(sends);
  if (out.best == out.lower_bound) out.exact = true;
  return out;
}

}  // namespace reshard::planner
