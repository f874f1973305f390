#include "planner/balance.h"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <utility>

#include "common/log.h"

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

bool Flexible(const RemoteSends& s, int64_t i) { return s.Candidates(i) > 1; }

bool IsCandidate(const RemoteSends& s, int64_t i, int host) {
  const int32_t* b = s.CandidatesBegin(i);
  return std::find(b, b + s.Candidates(i), host) != b + s.Candidates(i);
}

// Bytes each host must send because it is the only holder.
std::vector<int64_t> FixedLoads(const RemoteSends& s) {
  std::vector<int64_t> load(s.num_hosts, 0);
  for (int64_t i = 0; i < s.size(); ++i) {
    if (!Flexible(s, i)) load[s.hosts[s.first[i]]] += s.bytes[i];
  }
  return load;
}

// What a host at `load` can still take under `cap` when every send it could
// take is a multiple of `unit` bytes.
int64_t Room(int64_t cap, int64_t load, int64_t unit) {
  return cap > load ? (cap - load) / unit * unit : 0;
}

// The smallest cap under which `count` sends of at least `size` bytes each
// fit on `hosts` (already at `load`): a host takes one per `size` of room.
int64_t CountBound(const std::vector<int64_t>& load, const std::vector<int32_t>& hosts,
                   int64_t count, int64_t size) {
  int64_t lo = 0, hi = 0;
  for (int h : hosts) hi = std::max(hi, load[h]);
  hi += count * size;  // fits on any one host
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    int64_t fit = 0;
    for (int h : hosts) fit += mid > load[h] ? (mid - load[h]) / size : 0;
    if (fit >= count) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
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

// Hosts linked by flexible sends (union-find), and the flexible sends of each
// group.
std::vector<std::vector<int64_t>> Groups(const RemoteSends& s) {
  std::vector<int> parent(s.num_hosts);
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](int h) {
    while (parent[h] != h) h = parent[h] = parent[parent[h]];
    return h;
  };
  for (int64_t i = 0; i < s.size(); ++i) {
    const int32_t* c = s.CandidatesBegin(i);
    for (int k = 1; k < s.Candidates(i); ++k) parent[find(c[k])] = find(c[0]);
  }
  std::map<int, std::vector<int64_t>> groups;
  for (int64_t i = 0; i < s.size(); ++i) {
    if (Flexible(s, i)) groups[find(s.hosts[s.first[i]])].push_back(i);
  }
  std::vector<std::vector<int64_t>> out;
  for (auto& [root, sends] : groups) out.push_back(std::move(sends));
  return out;
}

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

// Exhaustive search over one group's sends for a busiest sender below the
// group's current one; keeps the best found. Largest sends first; equal
// sends with equal candidates take candidates in non-decreasing order.
class GroupSearch {
 public:
  GroupSearch(const RemoteSends& s, std::vector<int64_t> sends, std::vector<int64_t>* load,
              std::vector<int32_t>* chosen, int64_t budget)
      : s_(s), sends_(std::move(sends)), load_(*load), chosen_(*chosen), budget_(budget) {
    std::stable_sort(sends_.begin(), sends_.end(), [&](int64_t a, int64_t b) {
      if (s_.bytes[a] != s_.bytes[b]) return s_.bytes[a] > s_.bytes[b];
      return std::lexicographical_compare(
          s_.CandidatesBegin(a), s_.CandidatesBegin(a) + s_.Candidates(a), s_.CandidatesBegin(b),
          s_.CandidatesBegin(b) + s_.Candidates(b));
    });
    for (int64_t i : sends_) {
      const int32_t* c = s_.CandidatesBegin(i);
      for (int k = 0; k < s_.Candidates(i); ++k) {
        if (std::find(hosts_.begin(), hosts_.end(), c[k]) == hosts_.end()) hosts_.push_back(c[k]);
      }
    }
    for (int h : hosts_) best_ = std::max(best_, load_[h]);     // the current choice
    for (int64_t i : sends_) load_[chosen_[i]] -= s_.bytes[i];  // back to the fixed loads
    int64_t fixed_top = 0, total = 0;
    for (int h : hosts_) {
      fixed_top = std::max(fixed_top, load_[h]);
      total += load_[h];
    }
    lower_ = fixed_top_ = fixed_top;
    for (int64_t i : sends_) {
      total += s_.bytes[i];
      int64_t cheapest = std::numeric_limits<int64_t>::max();
      const int32_t* c = s_.CandidatesBegin(i);
      for (int k = 0; k < s_.Candidates(i); ++k) cheapest = std::min(cheapest, load_[c[k]]);
      lower_ = std::max(lower_, cheapest + s_.bytes[i]);
    }
    // Loads move in multiples of the sends' common divisor: the smallest cap
    // whose room holds every send bounds the optimum.
    for (int64_t i : sends_) unit_ = std::gcd(unit_, s_.bytes[i]);
    if (unit_ == 0) unit_ = 1;
    int64_t flexible = 0;
    for (int64_t i : sends_) flexible += s_.bytes[i];
    int64_t lo = lower_, hi = lower_ + flexible;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      int64_t room = 0;
      for (int h : hosts_) room += Room(mid, load_[h], unit_);
      if (room >= flexible) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    lower_ = lo;
    (void)total;
    best_choice_.resize(sends_.size());
    for (size_t k = 0; k < sends_.size(); ++k) best_choice_[k] = chosen_[sends_[k]];
    remaining_.assign(sends_.size() + 1, 0);
    for (size_t k = sends_.size(); k-- > 0;)
      remaining_[k] = remaining_[k + 1] + s_.bytes[sends_[k]];
    choice_pos_.assign(sends_.size(), 0);
    order_.resize(sends_.size());
    // Sends with the same candidates form a class; each class's remaining
    // bytes must fit under the best on its hosts.
    std::map<std::vector<int32_t>, int> ids;
    for (int64_t i : sends_) {
      std::vector<int32_t> key(s_.CandidatesBegin(i), s_.CandidatesBegin(i) + s_.Candidates(i));
      auto [it, inserted] = ids.try_emplace(std::move(key), static_cast<int>(ids.size()));
      class_of_.push_back(it->second);
      if (inserted) {
        class_hosts_.push_back(it->first);
        class_left_.push_back(0);
        class_count_.push_back(0);
        class_min_.push_back(s_.bytes[i]);
      }
      class_left_[it->second] += s_.bytes[i];
      class_count_[it->second] += 1;
      class_min_[it->second] = std::min(class_min_[it->second], s_.bytes[i]);
    }
    // However the bytes split, each class's sends are whole.
    for (size_t c = 0; c < class_hosts_.size(); ++c) {
      if (class_min_[c] > 0) {
        lower_ =
            std::max(lower_, CountBound(load_, class_hosts_[c], class_count_[c], class_min_[c]));
      }
    }
  }

  // Returns true when the search finished (the result is this group's
  // optimum). Leaves the best choice in `chosen` and its loads in `load`.
  bool Run() {
    bool finished = true;
    if (best_ > lower_) finished = Search(0, fixed_top_);
    for (size_t k = 0; k < sends_.size(); ++k) {
      chosen_[sends_[k]] = best_choice_[k];
      load_[best_choice_[k]] += s_.bytes[sends_[k]];
    }
    return finished;
  }
  int64_t best() const { return best_; }
  int64_t lower() const { return lower_; }

 private:
  // False when the budget ran out.
  bool Search(size_t k, int64_t top) {
    if (++nodes_ > budget_) return false;
    if (top >= best_) return true;  // the best improved since this path began
    if (k == sends_.size()) {
      best_ = top;
      for (size_t q = 0; q < sends_.size(); ++q) best_choice_[q] = chosen_[sends_[q]];
      return true;
    }
    int64_t room = 0;
    for (int h : hosts_) room += Room(best_ - 1, load_[h], unit_);
    if (room < remaining_[k]) return true;
    for (size_t c = 0; c < class_hosts_.size(); ++c) {
      if (class_left_[c] == 0) continue;
      int64_t class_room = 0, class_fit = 0;
      for (int h : class_hosts_[c]) {
        const int64_t room = Room(best_ - 1, load_[h], unit_);
        class_room += room;
        if (class_min_[c] > 0) class_fit += room / class_min_[c];
      }
      if (class_room < class_left_[c]) return true;
      if (class_min_[c] > 0 && class_fit < class_count_[c]) return true;
    }
    const int64_t i = sends_[k];
    const int64_t b = s_.bytes[i];
    const int32_t* c = s_.CandidatesBegin(i);
    int start = 0;
    if (k > 0 && Same(sends_[k - 1], i)) start = choice_pos_[k - 1];
    // Least-loaded candidates first.
    std::vector<int>& order = order_[k];
    order.clear();
    for (int q = start; q < s_.Candidates(i); ++q) order.push_back(q);
    std::sort(order.begin(), order.end(), [&](int x, int y) {
      return load_[c[x]] != load_[c[y]] ? load_[c[x]] < load_[c[y]] : x < y;
    });
    for (size_t t = 0; t < order.size(); ++t) {
      const int h = c[order[t]];
      if (load_[h] + b >= best_) continue;
      load_[h] += b;
      class_left_[class_of_[k]] -= b;
      class_count_[class_of_[k]] -= 1;
      chosen_[i] = h;
      choice_pos_[k] = order[t];
      const bool ok = Search(k + 1, std::max(top, load_[h]));
      class_left_[class_of_[k]] += b;
      class_count_[class_of_[k]] += 1;
      load_[h] -= b;
      if (!ok) return false;
      if (best_ <= lower_) return true;
    }
    return true;
  }

  bool Same(int64_t a, int64_t b) const {
    return s_.bytes[a] == s_.bytes[b] && s_.Candidates(a) == s_.Candidates(b) &&
           std::equal(s_.CandidatesBegin(a), s_.CandidatesBegin(a) + s_.Candidates(a),
                      s_.CandidatesBegin(b));
  }

  const RemoteSends& s_;
  std::vector<int64_t> sends_;
  std::vector<int64_t>& load_;
  std::vector<int32_t>& chosen_;
  int64_t budget_;
  int64_t nodes_ = 0;
  std::vector<int> hosts_;
  std::vector<int32_t> best_choice_;
  std::vector<int> choice_pos_;
  std::vector<std::vector<int>> order_;  // candidate order at each depth
  std::vector<int> class_of_;            // per position in sends_
  std::vector<std::vector<int32_t>> class_hosts_;
  std::vector<int64_t> class_left_;   // bytes of the class not yet placed
  std::vector<int64_t> class_count_;  // sends of the class not yet placed
  std::vector<int64_t> class_min_;    // its smallest send
  std::vector<int64_t> remaining_;
  int64_t best_ = 0, lower_ = 0;
  int64_t unit_ = 0;  // gcd of the group's sends
  int64_t fixed_top_ = 0;
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
      s->chosen[i] = s->hosts[s->first[i]];
    }
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return s->bytes[a] > s->bytes[b]; });
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
  hosts.insert(hosts.end(), begin, end);
  first.push_back(static_cast<int32_t>(hosts.size()));
}

void BalanceSenders(RemoteSends* sends) {
  std::vector<int64_t> load = Heuristic(sends);
  // Only the group that holds the busiest sender can lower it: search that
  // one, and go on while the busiest sender moves to another group.
  std::vector<std::vector<int64_t>> groups = Groups(*sends);
  std::vector<std::vector<int32_t>> group_hosts(groups.size());
  std::vector<int32_t> group_of_host(sends->num_hosts, -1);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int64_t i : groups[g]) {
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
    GroupSearch(*sends, std::move(groups[g]), &load, &sends->chosen,
                std::min(kPlannerNodeBudget, kPlannerSearchWork / cost))
        .Run();
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
  for (std::vector<int64_t>& group : Groups(s)) {
    GroupSearch search(s, std::move(group), &load, &s.chosen, node_budget);
    out.exact &= search.Run();
  }
  out.best = MaxOf(load);
  out.lower_bound = BusiestSenderLowerBound(sends);
  if (out.best == out.lower_bound) out.exact = true;
  return out;
}

}  // namespace reshard::planner
