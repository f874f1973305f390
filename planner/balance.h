// Rule 5 of the plan (docs/partitioning.md, "The plan"): the region a host needs from
// another host crosses once (rules 3-4), from one of the hosts that hold it;
// this file chooses which, so that the busiest sending host (bytes out) is as
// small as possible.
//
// The problem is restricted-assignment makespan (NP-hard in general): every
// remote send has a size and a set of candidate hosts. BalanceSenders() runs
// largest-first greedy, then moves and swaps off the busiest host, then, on
// small groups of sends, an exact branch and bound with a fixed node budget
// (so the result never depends on a clock; planner/balance_search.h). A
// proven lower bound on the optimum (fractional assignment by max flow, and
// the largest send's cheapest host) lets callers report how far a choice is
// from the best achievable.
//
// Pure: no I/O, no clock, no threads. Not thread-safe per object; distinct
// objects are independent.
#pragma once

#include <cstdint>
#include <vector>

namespace reshard::planner {

/// Every remote send of a plan, in planning order: its bytes, its candidate
/// sending hosts (distinct), and the host chosen for it. Consecutive sends
/// with the same candidates (every host needing one region) share one
/// candidate set: a region held on 32 hosts and needed on 32 others keeps its
/// 32 candidates once, not 32 times.
struct RemoteSends {
  int num_hosts = 0;
  std::vector<int64_t> bytes;
  std::vector<int32_t> set;          // send i's candidate set
  std::vector<int64_t> first = {0};  // candidates of set k: hosts[first[k], first[k + 1])
  std::vector<int32_t> hosts;
  std::vector<int32_t> chosen;  // filled by BalanceSenders / ChooseOnline

  int64_t size() const { return static_cast<int64_t>(bytes.size()); }
  int Candidates(int64_t i) const {
    return static_cast<int>(first[set[i] + 1] - first[set[i]]);
  }
  const int32_t* CandidatesBegin(int64_t i) const { return hosts.data() + first[set[i]]; }

  /// Appends a send of `n` bytes whose candidate hosts are [begin, end)
  /// (distinct, at least one).
  void Add(int64_t n, const int32_t* begin, const int32_t* end);
};

/// Rule 5: chooses a host for every send, minimising the busiest sender.
void BalanceSenders(RemoteSends* sends);

/// The policy before BalanceSenders (kept to measure against): each send in
/// planning order goes to the candidate host that has sent least so far
/// (lowest index on ties).
void ChooseOnline(RemoteSends* sends);

/// Bytes out of every host under `sends.chosen`.
std::vector<int64_t> SenderLoads(const RemoteSends& sends);

/// Largest of SenderLoads (0 without sends).
int64_t BusiestSender(const RemoteSends& sends);

/// A proven lower bound on the busiest sender of any choice: the largest of
/// the fractional optimum (sends may be split among their candidates; max
/// flow) and, for every send, its bytes plus the least that any of its
/// candidates must send anyway.
int64_t BusiestSenderLowerBound(const RemoteSends& sends);

/// The smallest busiest sender found by an exhaustive search of `node_budget`
/// nodes per group of sends that share hosts; `exact` when every search
/// finished (then `best` is the optimum), else `best` is an upper bound.
struct BusiestSenderOptimum {
  int64_t best = 0;
  int64_t lower_bound = 0;
  bool exact = false;
};
BusiestSenderOptimum OptimalBusiestSender(const RemoteSends& sends, int64_t node_budget);

}  // namespace reshard::planner
