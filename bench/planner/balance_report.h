// Rule 5 measured: the busiest sending host of a plan under the balanced
// choice (BalanceSenders, what the planner does) and under the previous online
// choice (ChooseOnline), each divided by the optimum (exhaustive search) or,
// where the search was cut off, by a proven lower bound. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/planner.h"

namespace reshard::bench {

struct BalanceSample {
  int64_t sends = 0;     // cross-host sends
  int64_t choices = 0;   // of them, sends that more than one host can make
  int64_t balanced = 0;  // busiest sender, bytes out: the plan's
  int64_t online = 0;    // ... under the previous policy
  int64_t optimum = 0;   // the optimum when `exact`, else the lower bound
  bool exact = false;
  bool plan_agrees = true;  // the plan's HostStats show `balanced` as busiest
  double balance_ms = 0;    // BalanceSenders on these sends again (its share of MakePlan)
  double BalancedRatio() const { return optimum ? double(balanced) / optimum : 1.0; }
  double OnlineRatio() const { return optimum ? double(online) / optimum : 1.0; }
};

/// Measures `plan` (made by planner::MakePlan). `node_budget` bounds the
/// exhaustive search per group of sends that share hosts.
BalanceSample MeasureBalance(const planner::Plan& plan, int64_t node_budget);

/// A named transition measured on its own.
struct BalanceCase {
  std::string name;
  const v1::Ptc* ptc;
  v1::Layout from, to;
};

/// Prints, side by side, busiest sender / optimum before (online policy) and
/// after (the planner's), as a distribution over the property-test
/// population (`per_mix` seeds per mix) and for each of `cases`. Returns the
/// number of failures (a ratio above 1.05, a plan whose stats disagree).
int ReportBalance(int per_mix, const std::vector<BalanceCase>& cases);

/// min / median / p95 / max of `values` as one line of text.
std::string Distribution(std::vector<double> values);

}  // namespace reshard::bench
