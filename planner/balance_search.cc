#include "planner/balance_search.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <utility>

namespace reshard::planner::balance_search {
namespace {

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

}  // namespace

int64_t Room(int64_t cap, int64_t load, int64_t unit) {
  return cap > load ? (cap - load) / unit * unit : 0;
}

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

std::vector<std::vector<int64_t>> SendGroups(const RemoteSends& s) {
  std::vector<int> parent(s.num_hosts);
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](int h) {
    while (parent[h] != h) h = parent[h] = parent[parent[h]];
    return h;
  };
  int64_t previous = -1;  // the last flexible send joined
  for (int64_t i = 0; i < s.size(); ++i) {
    if (!Flexible(s, i)) continue;
    const int32_t* c = s.CandidatesBegin(i);
    // Sends of a region replicated on many hosts come in runs with the same
    // candidates: joining them again changes no root.
    if (previous >= 0 && s.Candidates(previous) == s.Candidates(i) &&
        std::equal(c, c + s.Candidates(i), s.CandidatesBegin(previous))) {
      continue;
    }
    previous = i;
    for (int k = 1; k < s.Candidates(i); ++k) parent[find(c[k])] = find(c[0]);
  }
  std::vector<std::vector<int64_t>> by_root(s.num_hosts);
  for (int64_t i = 0; i < s.size(); ++i) {
    if (Flexible(s, i)) by_root[find(*s.CandidatesBegin(i))].push_back(i);
  }
  std::vector<std::vector<int64_t>> out;  // in the order of their root host
  for (std::vector<int64_t>& sends : by_root) {
    if (!sends.empty()) out.push_back(std::move(sends));
  }
  return out;
}

void LargestFirst(const std::vector<int64_t>& bytes, std::vector<int64_t>* sends) {
  // Distinct sizes, up to a few per hundred sends; past that, sort.
  const size_t max_sizes = sends->size() / 64 + 16;
  std::vector<int64_t> sizes;
  for (int64_t i : *sends) {
    if (sizes.empty() || sizes.back() != bytes[i]) sizes.push_back(bytes[i]);
    if (sizes.size() > 4 * max_sizes) {
      std::sort(sizes.begin(), sizes.end());
      sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
      if (sizes.size() > max_sizes) {
        std::stable_sort(sends->begin(), sends->end(),
                         [&](int64_t a, int64_t b) { return bytes[a] > bytes[b]; });
        return;
      }
    }
  }
  std::sort(sizes.begin(), sizes.end(), std::greater<int64_t>());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  // A counting sort by the rank of each send's size, stable by construction.
  std::vector<int64_t> begin(sizes.size() + 1, 0);
  std::vector<int32_t> rank(sends->size());
  for (size_t k = 0; k < sends->size(); ++k) {
    const int64_t b = bytes[(*sends)[k]];
    rank[k] = static_cast<int32_t>(std::lower_bound(sizes.begin(), sizes.end(), b,
                                                    std::greater<int64_t>()) -
                                   sizes.begin());
    ++begin[rank[k] + 1];
  }
  std::partial_sum(begin.begin(), begin.end(), begin.begin());
  std::vector<int64_t> out(sends->size());
  for (size_t k = 0; k < sends->size(); ++k) out[begin[rank[k]]++] = (*sends)[k];
  *sends = std::move(out);
}

bool SearchGroup(const RemoteSends& s, std::vector<int64_t> group, std::vector<int64_t>* load,
                 std::vector<int32_t>* chosen, int64_t node_budget) {
  return GroupSearch(s, std::move(group), load, chosen, node_budget).Run();
}

}  // namespace reshard::planner::balance_search
