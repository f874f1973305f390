// Jobs run once per item, after its last access and not before, on the
// background thread or in Finish; Stop drops what is queued.
#include "agent/executor/item_checks.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace reshard::agent {
namespace {

using Key = ItemChecks::Key;

TEST(ItemChecksTest, EachItemRunsOnceAfterItsLastAccess) {
  std::mutex mu;
  std::map<Key, int> runs;
  std::map<Key, int64_t> accesses = {{{0, 1, 0}, 3}, {{1, 2, 5}, 1}, {{1, 2, 6}, 0}};
  std::map<Key, int64_t> left = accesses;  // what the test has not reported yet
  std::atomic<bool> early{false};
  ItemChecks checks(accesses, [&](const Key& k) {
    std::lock_guard<std::mutex> l(mu);
    if (left.at(k) != 0) early = true;
    ++runs[k];
  });
  for (int i = 0; i < 3; ++i) {
    for (auto& [k, n] : left) {
      if (n == 0) continue;
      {
        std::lock_guard<std::mutex> l(mu);
        --n;
      }
      checks.Done(k);
    }
  }
  checks.Finish();
  EXPECT_FALSE(early.load());
  std::lock_guard<std::mutex> l(mu);
  EXPECT_EQ(runs, (std::map<Key, int>{{{0, 1, 0}, 1}, {{1, 2, 5}, 1}, {{1, 2, 6}, 1}}));
}

TEST(ItemChecksTest, FinishRunsQueuedJobsOnTheCallingThreadToo) {
  std::mutex mu;
  std::set<std::thread::id> threads;
  int runs = 0;
  std::map<Key, int64_t> accesses;
  for (int i = 0; i < 200; ++i) accesses[{0, 0, i}] = 0;  // all queued at once
  ItemChecks checks(accesses, [&](const Key&) {
    std::lock_guard<std::mutex> l(mu);
    threads.insert(std::this_thread::get_id());
    ++runs;
  });
  checks.Finish();
  // Which thread ran what depends on timing; every job ran by the time
  // Finish returned, on this thread or the background one.
  std::lock_guard<std::mutex> l(mu);
  EXPECT_EQ(runs, 200);
  EXPECT_GE(threads.size(), 1u);
  EXPECT_LE(threads.size(), 2u);
}

TEST(ItemChecksTest, StopDropsJobsNotStartedAndDoneOnUnknownOrFinishedKeysCrashes) {
  std::atomic<int> runs{0};
  ItemChecks checks({{{0, 0, 0}, 1}}, [&](const Key&) { ++runs; });
  checks.Stop();
  checks.Done({0, 0, 0});  // queued after Stop: never runs
  checks.Stop();           // idempotent
  EXPECT_EQ(runs.load(), 0);
  EXPECT_DEATH(checks.Done({0, 0, 0}), "");
  EXPECT_DEATH(checks.Done({7, 7, 7}), "");
}

}  // namespace
}  // namespace reshard::agent
