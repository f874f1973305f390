// What a run holds and reports, as pure code (run_resources.h): the wait it
// describes to its `waiting` callback, and the reuse of staging buffers.
#include "agent/executor/run_resources.h"

#include <gtest/gtest.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace reshard::agent {
namespace {

InFlight Chunk(size_t remote) {
  InFlight f;
  f.remote = remote;
  return f;
}

// The earliest chunk still in flight names the wait, whatever its position
// in the map; with none, the local copies, then nothing.
TEST(RunResourcesTest, TheWaitIsTheEarliestChunkInFlight) {
  v1::CopyStep send, receive;
  send.set_index(17);
  receive.set_index(4);
  const std::vector<RemoteStep> remotes{{&send, true, "h1"}, {&receive, false, "h2"}};
  std::unordered_map<uint64_t, InFlight> inflight;
  for (uint64_t seq : {9, 3, 12}) inflight.emplace(seq, Chunk(seq == 3 ? 1 : 0));
  EXPECT_EQ(DescribeWait(inflight, remotes, true), "step 4 (receive from host \"h2\")");
  inflight.erase(3);
  EXPECT_EQ(DescribeWait(inflight, remotes, false), "step 17 (send to host \"h1\")");
  inflight.clear();
  EXPECT_EQ(DescribeWait(inflight, remotes, true), "local copies");
  EXPECT_EQ(DescribeWait(inflight, remotes, false), "");
}

// A buffer given back is taken again by a chunk it holds; a larger chunk gets
// a new one; a new buffer is at least the chunk size.
TEST(RunResourcesTest, StagingBuffersAreReusedWhenLargeEnough) {
  StagingPool pool(64);
  StagingPtr a = pool.Take(10);
  EXPECT_EQ(a->capacity, 64);
  const Staging* first = a.get();
  pool.Give(std::move(a));
  StagingPtr b = pool.Take(64);
  EXPECT_EQ(b.get(), first);
  pool.Give(std::move(b));
  StagingPtr c = pool.Take(100);
  EXPECT_NE(c.get(), first);
  EXPECT_EQ(c->capacity, 100);
  StagingPtr d = pool.Take(1);
  EXPECT_EQ(d.get(), first);
  pool.Give(nullptr);  // nothing to give back: ignored
  EXPECT_NE(pool.Take(1).get(), first);
}

}  // namespace
}  // namespace reshard::agent
