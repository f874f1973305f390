#include "cost/flow_sim.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace reshard::cost {
namespace {

TEST(FlowSimTest, FlowsSharingAResourceSplitItEvenly) {
  // Two flows out of one 100 B/s NIC: 50 B/s each; the 100 B flow ends at 2 s,
  // then the 200 B flow has the NIC alone: 100 B left at 100 B/s, ending at 3 s.
  const FlowResult r = SimulateFlows({100, 1000, 1000}, {Flow{100, {0, 1}}, Flow{200, {0, 2}}});
  ASSERT_EQ(r.end.size(), 2u);
  EXPECT_DOUBLE_EQ(r.end[0], 2.0);
  EXPECT_DOUBLE_EQ(r.end[1], 3.0);
  EXPECT_DOUBLE_EQ(r.makespan, 3.0);
  EXPECT_EQ(r.events, 2);
}

TEST(FlowSimTest, MaxMinGivesWhatABottleneckLeavesToTheOthers) {
  // Resource 0 (10) is shared by flows a and b; resource 1 (100) by b and c.
  // Max-min: a = b = 5 (resource 0 full), c takes the 95 that b leaves.
  const std::vector<Flow> flows = {Flow{1, {0}}, Flow{1, {0, 1}}, Flow{1, {1}}};
  const std::vector<double> rates = MaxMinRates({10, 100}, flows, {0, 1, 2});
  ASSERT_EQ(rates.size(), 3u);
  EXPECT_DOUBLE_EQ(rates[0], 5);
  EXPECT_DOUBLE_EQ(rates[1], 5);
  EXPECT_DOUBLE_EQ(rates[2], 95);
}

TEST(FlowSimTest, AFlowJoinsAtItsStartAndEmptyFlowsEndAtOnce) {
  // The first flow runs alone at 10 B/s for 1 s (10 of 30 B), then shares
  // with the second (5 B/s each): the second's 10 B end at 3 s, when the
  // first has 10 B left, which it then moves alone by 4 s.
  const FlowResult r = SimulateFlows(
      {10}, {Flow{30, {0}, 0}, Flow{10, {0}, 1}, Flow{0, {0}, 0.5}, Flow{5, {}, 0.25}});
  EXPECT_DOUBLE_EQ(r.end[0], 4.0);
  EXPECT_DOUBLE_EQ(r.end[1], 3.0);
  EXPECT_DOUBLE_EQ(r.end[2], 0.5);
  EXPECT_DOUBLE_EQ(r.end[3], 0.25);
  EXPECT_DOUBLE_EQ(r.makespan, 4.0);
}

TEST(FlowSimTest, WeightedResourcesShareWhatEachByteTakes) {
  // A CPU of 10 CPU-seconds per second; flow a takes 1 per byte, flow b 3:
  // equal rates r with 4r = 10.
  const std::vector<Flow> flows = {Flow{1, {0}, 0, {1}}, Flow{1, {0}, 0, {3}}};
  const std::vector<double> rates = MaxMinRates({10}, flows, {0, 1});
  EXPECT_DOUBLE_EQ(rates[0], 2.5);
  EXPECT_DOUBLE_EQ(rates[1], 2.5);
  // Two flows of 100 B at 0.01 CPU-s per byte on 2 CPUs: 1 s each; on 1: 2 s.
  const std::vector<Flow> two = {Flow{100, {0}, 0, {0.01}}, Flow{100, {0}, 0, {0.01}}};
  EXPECT_DOUBLE_EQ(SimulateFlows({2}, two).makespan, 1.0);
  EXPECT_DOUBLE_EQ(SimulateFlows({1}, two).makespan, 2.0);
  // A flow that takes nothing of its resources is not held back by them.
  const FlowResult free = SimulateFlows({1}, {Flow{100, {0}, 0.5, {0}}});
  EXPECT_DOUBLE_EQ(free.end[0], 0.5);
}

TEST(FlowSimTest, RandomSharesEndAndNeverOverfillAResource) {
  // Each pass of the progressive filling freezes at least one flow, whatever
  // rounding leaves in a resource's load (a soak once found a set of CPU
  // weights that looped forever). 500 random sets of 1..12 flows over
  // 1..8 resources with capacities and weights over nine decades.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> decade(0, 9);
  for (int round = 0; round < 500; ++round) {
    const int n_res = 1 + static_cast<int>(rng() % 8);
    std::vector<double> caps;
    for (int r = 0; r < n_res; ++r) caps.push_back(std::pow(10.0, decade(rng) - 2));
    std::vector<Flow> flows;
    std::vector<int> active;
    const int n_flows = 1 + static_cast<int>(rng() % 12);
    for (int f = 0; f < n_flows; ++f) {
      Flow flow{1};
      for (int r = 0; r < n_res; ++r) {
        if (rng() % 2 == 0) continue;
        flow.resources.push_back(r);
        flow.weights.push_back(std::pow(10.0, -decade(rng)));
      }
      if (flow.resources.empty()) flow.resources = {0}, flow.weights = {1};
      flows.push_back(flow);
      active.push_back(f);
    }
    const std::vector<double> rates = MaxMinRates(caps, flows, active);
    std::vector<double> used(n_res, 0);
    for (int f = 0; f < n_flows; ++f) {
      ASSERT_TRUE(std::isfinite(rates[f]) && rates[f] > 0) << "round " << round << " flow " << f;
      for (size_t k = 0; k < flows[f].resources.size(); ++k) {
        used[flows[f].resources[k]] += flows[f].weights[k] * rates[f];
      }
    }
    for (int r = 0; r < n_res; ++r) {
      EXPECT_LE(used[r], caps[r] * (1 + 1e-6)) << "round " << round << " resource " << r;
    }
  }
}

TEST(FlowSimTest, RandomRunsTakeAtMostTwoEventsPerFlow) {
  // Each event ends a flow or reaches the next start: the bound that cuts a
  // run short is never reached by a run that makes progress. 300 random
  // runs of 1..40 flows, staggered starts, sizes and capacities over six
  // decades.
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> decade(0, 6);
  for (int round = 0; round < 300; ++round) {
    const int n_res = 1 + static_cast<int>(rng() % 10);
    std::vector<double> caps;
    for (int r = 0; r < n_res; ++r) caps.push_back(std::pow(10.0, decade(rng) + 3));
    std::vector<Flow> flows;
    const int n_flows = 1 + static_cast<int>(rng() % 40);
    for (int f = 0; f < n_flows; ++f) {
      Flow flow{std::pow(10.0, decade(rng) + 3)};
      flow.start = (rng() % 4) * 0.5;
      flow.resources.push_back(static_cast<int>(rng() % n_res));
      if (rng() % 2 == 0) flow.resources.push_back(static_cast<int>(rng() % n_res));
      if (flow.resources.size() == 2 && flow.resources[0] == flow.resources[1]) {
        flow.resources.pop_back();
      }
      flows.push_back(flow);
    }
    const FlowResult r = SimulateFlows(caps, flows);
    EXPECT_FALSE(r.cut_short) << "round " << round;
    EXPECT_LE(r.events, 2 * n_flows) << "round " << round;
    for (int f = 0; f < n_flows; ++f) {
      EXPECT_GE(r.end[f], flows[f].start) << "round " << round << " flow " << f;
      EXPECT_TRUE(std::isfinite(r.end[f])) << "round " << round << " flow " << f;
    }
  }
}

TEST(FlowSimTest, NoFlowsTakeNoTime) {
  const FlowResult r = SimulateFlows({1}, {});
  EXPECT_TRUE(r.end.empty());
  EXPECT_DOUBLE_EQ(r.makespan, 0);
  EXPECT_EQ(r.events, 0);
}

}  // namespace
}  // namespace reshard::cost
