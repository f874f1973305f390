// The worker service's job cache (agent/process/job_cache.h): what it keeps,
// what it forgets when the shard store drops a generation or a job's last
// buffer, and its byte bound.
#include "agent/process/job_cache.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"

namespace reshard::agent {
namespace {

// A generation whose PTC has `tensors` tensors (a 2,000-tensor PTC is about
// 1 MB in memory).
JobCache::GenerationPtr MakeGeneration(int tensors) {
  auto g = std::make_shared<JobCache::Generation>();
  g->ptc.set_num_layers(1);
  for (int i = 0; i < tensors; ++i) {
    v1::TensorSpec* t = g->ptc.add_tensors();
    t->set_name(absl::StrCat("layers.", i, ".mlp.fc1.weight"));
    t->set_dtype(v1::DTYPE_BFLOAT16);
    t->add_shape(64);
    t->add_shape(64);
  }
  g->layout.mutable_config()->set_tp(1);
  g->layout.mutable_config()->set_pp(1);
  g->layout.mutable_config()->set_dp(1);
  g->layout.mutable_placement()->add_hosts("h0");
  return g;
}

const std::string kSha(32, 'x');

TEST(JobCacheTest, FindsWhatWasPutAndCountsItsBytes) {
  JobCache cache(int64_t{64} << 20);
  EXPECT_EQ(cache.Find("j", 1), nullptr);
  EXPECT_FALSE(cache.FindToken("j").has_value());
  JobCache::GenerationPtr g = MakeGeneration(10);
  cache.Put("j", 1, g);
  cache.PutToken("j", kSha);
  EXPECT_EQ(cache.Find("j", 1), g);
  EXPECT_EQ(cache.Find("j", 2), nullptr);
  EXPECT_EQ(cache.FindToken("j"), kSha);
  const JobCache::Stats s = cache.stats();
  EXPECT_EQ(s.generations, 1);
  EXPECT_EQ(s.tokens, 1);
  EXPECT_EQ(s.bytes, JobCache::BytesOf("j", *g) + JobCache::TokenBytesOf("j", kSha));
  // The PTC's in-memory size, not a constant per entry.
  EXPECT_GT(JobCache::BytesOf("j", *MakeGeneration(2000)),
            100 * JobCache::BytesOf("j", *MakeGeneration(10)));
}

TEST(JobCacheTest, PutReplacesAnEntryWithoutCountingItTwice) {
  JobCache cache(int64_t{64} << 20);
  cache.Put("j", 1, MakeGeneration(10));
  JobCache::GenerationPtr bigger = MakeGeneration(20);
  cache.Put("j", 1, bigger);
  EXPECT_EQ(cache.Find("j", 1), bigger);
  EXPECT_EQ(cache.stats().generations, 1);
  EXPECT_EQ(cache.stats().bytes, JobCache::BytesOf("j", *bigger));
}

// A released, retired or discarded generation (the store dropped its
// buffers) goes; the job's other generations and its token stay.
TEST(JobCacheTest, ForgetDropsOneGeneration) {
  JobCache cache(int64_t{64} << 20);
  cache.Put("j", 1, MakeGeneration(10));
  cache.Put("j", 2, MakeGeneration(10));
  cache.PutToken("j", kSha);
  cache.Forget("j", 1);
  cache.Forget("j", 7);  // never cached: nothing happens
  EXPECT_EQ(cache.Find("j", 1), nullptr);
  EXPECT_NE(cache.Find("j", 2), nullptr);
  EXPECT_TRUE(cache.FindToken("j").has_value());
  EXPECT_EQ(cache.stats().generations, 1);
  EXPECT_EQ(cache.stats().tokens, 1);
}

// DeleteJob (the job's last buffer here dropped): every generation and the
// token hash of that job go, other jobs' entries stay, the bytes are 0 when
// nothing else is held.
TEST(JobCacheTest, ForgetJobDropsEverythingOfThatJobOnly) {
  JobCache cache(int64_t{256} << 20);
  for (int64_t g = 1; g <= 60; ++g) cache.Put("a", g, MakeGeneration(100));
  cache.PutToken("a", kSha);
  cache.Put("ab", 1, MakeGeneration(10));  // a job id with "a" as its prefix
  cache.PutToken("ab", kSha);
  cache.Put("b", 3, MakeGeneration(10));
  cache.ForgetJob("a");
  for (int64_t g = 1; g <= 60; ++g) EXPECT_EQ(cache.Find("a", g), nullptr) << g;
  EXPECT_FALSE(cache.FindToken("a").has_value());
  EXPECT_NE(cache.Find("ab", 1), nullptr);
  EXPECT_TRUE(cache.FindToken("ab").has_value());
  EXPECT_NE(cache.Find("b", 3), nullptr);
  EXPECT_EQ(cache.stats().generations, 2);
  cache.ForgetJob("ab");
  cache.ForgetJob("b");
  const JobCache::Stats s = cache.stats();
  EXPECT_EQ(s.bytes, 0);
  EXPECT_EQ(s.generations, 0);
  EXPECT_EQ(s.tokens, 0);
}

// The byte bound: 60 checkpoints of a 2,000-tensor PTC (the 70 MB)
// stay within it, the least recently used going first.
TEST(JobCacheTest, StaysWithinItsBytesLeastRecentlyUsedOutFirst) {
  const JobCache::GenerationPtr big = MakeGeneration(2000);
  const int64_t one = JobCache::BytesOf("j", *big);
  JobCache cache(4 * one + one / 2);  // room for four
  for (int64_t g = 1; g <= 60; ++g) {
    cache.Put("j", g, MakeGeneration(2000));
    ASSERT_LE(cache.stats().bytes, cache.max_bytes()) << g;
    // Used after each Put: never the least recently used.
    ASSERT_NE(cache.Find("j", 1), nullptr);
  }
  EXPECT_EQ(cache.stats().generations, 4);
  EXPECT_NE(cache.Find("j", 1), nullptr);
  EXPECT_NE(cache.Find("j", 60), nullptr);
  EXPECT_NE(cache.Find("j", 59), nullptr);
  EXPECT_NE(cache.Find("j", 58), nullptr);
  EXPECT_EQ(cache.Find("j", 57), nullptr);
}

TEST(JobCacheTest, AnEntryLargerThanTheBoundIsNotKept) {
  JobCache cache(int64_t{64} << 10);
  cache.PutToken("j", kSha);
  cache.Put("j", 1, MakeGeneration(2000));
  EXPECT_EQ(cache.Find("j", 1), nullptr);
  EXPECT_TRUE(cache.FindToken("j").has_value());  // nothing evicted for it
  EXPECT_EQ(cache.stats().generations, 0);
}

TEST(JobCacheTest, TheObserverSeesEveryChange) {
  JobCache::Stats seen;
  int calls = 0;
  JobCache cache(int64_t{64} << 20, [&](const JobCache::Stats& s) {
    seen = s;
    ++calls;
  });
  cache.Put("j", 1, MakeGeneration(10));
  EXPECT_EQ(seen.generations, 1);
  cache.PutToken("j", kSha);
  EXPECT_EQ(seen.tokens, 1);
  cache.Forget("j", 1);
  EXPECT_EQ(seen.generations, 0);
  cache.ForgetJob("j");
  EXPECT_EQ(seen.tokens, 0);
  EXPECT_EQ(seen.bytes, 0);
  EXPECT_EQ(calls, 4);
}

}  // namespace
}  // namespace reshard::agent
