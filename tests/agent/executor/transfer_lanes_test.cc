// The issue order of cross-host chunks: lanes interleave, each keeps step
// order, windows hold per lane and in total, every chunk is issued once.
#include "agent/executor/transfer_lanes.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace reshard::agent {
namespace {

using Step = TransferLanes::Step;
using Chunk = TransferLanes::Chunk;

// Issues everything, completing the oldest chunk in flight whenever Next has
// nothing; returns the chunks in issue order and checks the windows.
std::vector<Chunk> Drain(TransferLanes* lanes, int64_t lane_window, int64_t total_window) {
  std::vector<Chunk> order, inflight;
  std::map<size_t, int64_t> lane_bytes;
  int64_t total = 0;
  for (;;) {
    while (auto c = lanes->Next()) {
      EXPECT_TRUE(lane_bytes[c->lane] == 0 || lane_bytes[c->lane] + c->bytes <= lane_window);
      EXPECT_TRUE(lane_bytes[c->lane] == 0 || total + c->bytes <= total_window);
      lane_bytes[c->lane] += c->bytes;
      total += c->bytes;
      order.push_back(*c);
      inflight.push_back(*c);
    }
    if (inflight.empty()) break;
    lanes->Done(inflight.front());
    lane_bytes[inflight.front().lane] -= inflight.front().bytes;
    total -= inflight.front().bytes;
    inflight.erase(inflight.begin());
  }
  return order;
}

TEST(TransferLanesTest, PeersInterleaveInsteadOfPlanOrder) {
  // Plan order: three steps to h1, then three to h2, then three to h3.
  std::vector<Step> steps;
  for (const char* peer : {"h1", "h2", "h3"}) {
    for (int i = 0; i < 3; ++i) steps.push_back(Step{peer, true, {10}});
  }
  TransferLanes lanes(steps, 1000, 1000);
  ASSERT_EQ(lanes.lane_count(), 3u);
  const std::vector<Chunk> order = Drain(&lanes, 1000, 1000);
  ASSERT_EQ(order.size(), 9u);
  std::vector<std::string> peers;
  for (const Chunk& c : order) peers.push_back(steps[c.step].peer);
  EXPECT_EQ(peers,
            (std::vector<std::string>{"h1", "h2", "h3", "h1", "h2", "h3", "h1", "h2", "h3"}));
}

TEST(TransferLanesTest, EachLaneKeepsStepAndChunkOrderAndEveryChunkIsIssuedOnce) {
  std::vector<Step> steps = {{"h1", true, {5, 5, 4}}, {"h1", false, {7}}, {"h2", true, {}},
                             {"h2", true, {3, 3}},    {"h1", true, {9}},  {"h1", false, {1, 1}}};
  TransferLanes lanes(steps, 8, 20);
  EXPECT_EQ(lanes.chunk_count(), 9);
  EXPECT_EQ(lanes.lane_count(), 3u);  // (h1, send), (h1, receive), (h2, send)
  const std::vector<Chunk> order = Drain(&lanes, 8, 20);
  std::set<std::pair<size_t, int64_t>> seen;
  std::map<size_t, std::pair<size_t, int64_t>> last;  // lane -> (step, chunk) issued last
  for (const Chunk& c : order) {
    EXPECT_TRUE(seen.emplace(c.step, c.chunk).second) << "step " << c.step << " chunk " << c.chunk;
    EXPECT_EQ(c.bytes, steps[c.step].chunk_bytes[c.chunk]);
    EXPECT_EQ(lanes.lane_peer(c.lane), steps[c.step].peer);
    EXPECT_EQ(lanes.lane_is_send(c.lane), steps[c.step].is_send);
    auto it = last.find(c.lane);
    if (it != last.end()) {
      EXPECT_LT(it->second, std::make_pair(c.step, c.chunk));
    }
    last[c.lane] = {c.step, c.chunk};
  }
  EXPECT_EQ(seen.size(), 9u);
}

TEST(TransferLanesTest, AFullLaneWaitsWhileOthersGoOn) {
  std::vector<Step> steps = {{"h1", true, {6, 6, 6}}, {"h2", true, {6, 6, 6}}};
  TransferLanes lanes(steps, 10, 100);
  auto a = lanes.Next();
  auto b = lanes.Next();
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->lane, b->lane);
  EXPECT_FALSE(lanes.Next());  // both lanes at their window (6 + 6 > 10)
  lanes.Done(*a);
  auto c = lanes.Next();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->lane, a->lane);
  EXPECT_EQ(c->chunk, 1);
  EXPECT_FALSE(lanes.Next());
}

TEST(TransferLanesTest, TheTotalWindowHoldsBusyLanesButNeverAnIdleOne) {
  std::vector<Step> steps = {{"h1", true, {50, 5}}, {"h2", true, {5, 5}}, {"h3", false, {5}}};
  TransferLanes lanes(steps, 100, 8);
  auto a = lanes.Next();  // larger than the total window, but the lane is idle
  ASSERT_TRUE(a);
  EXPECT_EQ(a->bytes, 50);
  // Idle lanes still issue (a host waiting on another's receives must not
  // keep a third waiting on it), busy ones wait for the total.
  auto b = lanes.Next();
  auto c = lanes.Next();
  ASSERT_TRUE(b && c);
  EXPECT_EQ(steps[b->step].peer, "h2");
  EXPECT_EQ(steps[c->step].peer, "h3");
  EXPECT_FALSE(lanes.Next());  // h1 and h2 busy, 60 + 5 > 8
  lanes.Done(*a);
  lanes.Done(*c);
  auto d = lanes.Next();  // h1's second chunk: 5 + 5 <= 8
  ASSERT_TRUE(d);
  EXPECT_EQ(steps[d->step].peer, "h1");
  EXPECT_FALSE(lanes.Next());  // h2: 10 + 5 > 8
  lanes.Done(*b);
  EXPECT_TRUE(lanes.Next());   // h2 idle again
  EXPECT_FALSE(lanes.Next());  // finished
}

}  // namespace
}  // namespace reshard::agent
