// HostRuns: the planner's index of a region's holders by host.
#include "planner/host_runs.h"

#include <vector>

#include "gtest/gtest.h"

namespace reshard::planner {
namespace {

std::vector<int32_t> On(const HostRuns& runs, int host) {
  return std::vector<int32_t>(runs.On(host), runs.On(host) + runs.Count(host));
}

TEST(HostRunsTest, GroupsEntriesByHostInTheirOrder) {
  HostRuns runs(5);
  const std::vector<int> hosts = {3, 1, 3, 0, 1, 3};
  runs.Index(static_cast<int32_t>(hosts.size()), [&](int32_t i) { return hosts[i]; });
  EXPECT_EQ(runs.hosts(), (std::vector<int32_t>{3, 1, 0}));
  EXPECT_EQ(On(runs, 3), (std::vector<int32_t>{0, 2, 5}));
  EXPECT_EQ(On(runs, 1), (std::vector<int32_t>{1, 4}));
  EXPECT_EQ(On(runs, 0), (std::vector<int32_t>{3}));
  EXPECT_EQ(runs.Count(2), 0);
  EXPECT_EQ(runs.Count(4), 0);
}

TEST(HostRunsTest, AnotherListForgetsTheLastOne) {
  HostRuns runs(4);
  const std::vector<int> first = {0, 1, 1, 2};
  runs.Index(4, [&](int32_t i) { return first[i]; });
  const std::vector<int> second = {2, 3};
  runs.Index(2, [&](int32_t i) { return second[i]; });
  EXPECT_EQ(runs.hosts(), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(runs.Count(0), 0);
  EXPECT_EQ(runs.Count(1), 0);
  EXPECT_EQ(On(runs, 2), (std::vector<int32_t>{0}));
  EXPECT_EQ(On(runs, 3), (std::vector<int32_t>{1}));
  runs.Index(0, [&](int32_t i) { return first[i]; });
  EXPECT_TRUE(runs.hosts().empty());
  EXPECT_EQ(runs.Count(2), 0);
}

}  // namespace
}  // namespace reshard::planner
