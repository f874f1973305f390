// Rule 5's exact part (planner/balance.h): remote sends that share candidate
// hosts form groups that balance independently, and an exhaustive branch and
// bound over one group's sends, with a fixed node budget (so the result never
// depends on a clock), finds its smallest busiest sender. Internal to the
// planner's balancing (BalanceSenders, OptimalBusiestSender).
//
// Pure: no I/O, no clock, no threads.
#pragma once

#include <cstdint>
#include <vector>

#include "planner/balance.h"

namespace reshard::planner::balance_search {

/// True when send `i` has a choice of host.
inline bool Flexible(const RemoteSends& s, int64_t i) { return s.Candidates(i) > 1; }

/// `sends` (indices of `bytes`) largest first, in their given order among
/// equal sizes: std::stable_sort by size, descending, in linear time when the
/// sizes take few distinct values (a plan's sends do: a few per tensor shape).
void LargestFirst(const std::vector<int64_t>& bytes, std::vector<int64_t>* sends);

/// What a host at `load` can still take under `cap` when every send it could
/// take is a multiple of `unit` bytes.
int64_t Room(int64_t cap, int64_t load, int64_t unit);

/// The smallest cap under which `count` sends of at least `size` bytes each
/// fit on `hosts` (already at `load`): a host takes one per `size` of room.
int64_t CountBound(const std::vector<int64_t>& load, const std::vector<int32_t>& hosts,
                   int64_t count, int64_t size);

/// Hosts linked by flexible sends (union-find): the flexible sends of each
/// group, groups in the order of their root host.
std::vector<std::vector<int64_t>> SendGroups(const RemoteSends& s);

/// Searches the choices of the sends `group` (one of SendGroups) for a busiest
/// sender below the group's current one, looking at most at `node_budget`
/// nodes. `load` (every host's bytes out) and `chosen` hold the current
/// choice on entry and the best found on return. True when the search
/// finished: the result is then the group's optimum.
bool SearchGroup(const RemoteSends& s, std::vector<int64_t> group, std::vector<int64_t>* load,
                 std::vector<int32_t>* chosen, int64_t node_budget);

}  // namespace reshard::planner::balance_search
