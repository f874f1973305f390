// The accesses a task run counts per item before any byte moves
// (item_accesses.h): the counts ItemChecks waits for, so an item is checked
// exactly once its last read or write is over.
#include "agent/executor/item_accesses.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <vector>

namespace reshard::agent {
namespace {

v1::CopyStep Step(int item, int src_rank, std::vector<int> dst_ranks, int64_t elements) {
  v1::CopyStep s;
  s.set_item(item);
  s.set_src_rank(src_rank);
  s.add_shape(elements);
  for (int r : dst_ranks) s.add_dsts()->set_rank(r);
  return s;
}

// New ranks 0 and 1 with three items each (old rank 5 is the source):
//  - a zero fill of rank 1 item 1,
//  - a local step of item 0 from rank 5 to ranks 0 and 1,
//  - a send of item 1 of rank 5 in 3 chunks,
//  - a receive into item 1 of rank 0 in 2 chunks.
// Item 2 of both new ranks is touched by nothing: counted 0.
TEST(ItemAccessesTest, ChunksLocalStepsAndFillsEachCountOnce) {
  const v1::CopyStep local = Step(0, 5, {0, 1}, 8);
  const v1::CopyStep send = Step(1, 5, {7}, 30);
  const v1::CopyStep receive = Step(1, 9, {0}, 20);
  v1::ZeroFill fill;
  fill.set_rank(1);
  fill.set_item(1);
  fill.set_count(8);
  HostSteps hs;
  hs.new_ranks = {0, 1};
  hs.new_item_bytes = {{8, 8, 8}, {8, 8, 8}};
  hs.new_index = {{0, 0}, {1, 1}};
  hs.locals = {&local};
  hs.remotes = {RemoteStep{&send, true, "h1"}, RemoteStep{&receive, false, "h2"}};
  hs.fills = {&fill};
  std::vector<StepChunks> chunks;
  chunks.emplace_back(std::vector<int64_t>{30}, 1, 10);
  chunks.emplace_back(std::vector<int64_t>{20}, 1, 10);
  ASSERT_EQ(chunks[0].count(), 3);
  ASSERT_EQ(chunks[1].count(), 2);

  const std::map<ItemChecks::Key, int64_t> want{
      {{kSourceItem, 5, 0}, 1},  // the local step's read
      {{kSourceItem, 5, 1}, 3},  // one per chunk sent
      {{kNewItem, 0, 0}, 1},     // the local step's write
      {{kNewItem, 0, 1}, 2},     // one per chunk received
      {{kNewItem, 0, 2}, 0},     // untouched
      {{kNewItem, 1, 0}, 1},     // the local step's second destination
      {{kNewItem, 1, 1}, 1},     // the zero fill
      {{kNewItem, 1, 2}, 0},     // untouched
  };
  EXPECT_EQ(CountItemAccesses(hs, chunks), want);
}

// The counts drive ItemChecks: each item's job runs once, after the last of
// its counted accesses, and untouched items at once.
TEST(ItemAccessesTest, ItemChecksRunEachJobAfterTheLastCountedAccess) {
  const v1::CopyStep receive = Step(0, 9, {0}, 20);
  HostSteps hs;
  hs.new_ranks = {0};
  hs.new_item_bytes = {{20, 4}};
  hs.new_index = {{0, 0}};
  hs.remotes = {RemoteStep{&receive, false, "h2"}};
  std::vector<StepChunks> chunks;
  chunks.emplace_back(std::vector<int64_t>{20}, 1, 10);
  ASSERT_EQ(chunks[0].count(), 2);

  std::mutex mu;
  std::map<ItemChecks::Key, int> ran;
  {
    ItemChecks checks(CountItemAccesses(hs, chunks), [&](const ItemChecks::Key& k) {
      std::lock_guard<std::mutex> l(mu);
      ++ran[k];
    });
    checks.Done({kNewItem, 0, 0});
    {
      std::lock_guard<std::mutex> l(mu);
      EXPECT_EQ(ran.count({kNewItem, 0, 0}), 0u) << "checked before its second chunk landed";
    }
    checks.Done({kNewItem, 0, 0});
    checks.Finish();
  }
  const std::map<ItemChecks::Key, int> want{{{kNewItem, 0, 0}, 1}, {{kNewItem, 0, 1}, 1}};
  EXPECT_EQ(ran, want);
}

}  // namespace
}  // namespace reshard::agent
