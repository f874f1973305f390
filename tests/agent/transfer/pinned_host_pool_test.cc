// Pinned host memory registered once (pinned_host_pool.h) on the fake device,
// which counts its registrations: a block goes back to the pool and is lent
// again without a new one; sizes round to powers of two; what passes the
// keep limit is freed, the largest first.
#include "agent/device/pinned_host_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "agent/device/fake_device.h"

namespace reshard::agent {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

class PinnedHostPoolTest : public ::testing::Test {
 protected:
  PinnedHostPoolTest() : api_(FakeDeviceApi::Options{1, 1 << 20}) {}
  PinnedHostPool::Lease Take(PinnedHostPool& pool, int64_t bytes) {
    absl::StatusOr<PinnedHostPool::Lease> l = pool.Take(bytes);
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? *std::move(l) : PinnedHostPool::Lease();
  }
  FakeDeviceApi api_;
};

TEST_F(PinnedHostPoolTest, ABlockIsRegisteredOnceAndLentAgain) {
  PinnedHostPool pool(&api_, 64 * kMiB);
  uint8_t* first = nullptr;
  for (int i = 0; i < 10; ++i) {
    PinnedHostPool::Lease l = Take(pool, 8 * kMiB);
    ASSERT_NE(l.data(), nullptr);
    EXPECT_EQ(l.bytes(), 8 * kMiB);
    std::memset(l.data(), i, static_cast<size_t>(l.bytes()));  // host memory, writable
    if (i == 0) first = l.data();
    EXPECT_EQ(l.data(), first) << i;
    EXPECT_EQ(pool.idle_bytes(), 0);
  }
  EXPECT_EQ(api_.host_registrations(), 1);
  EXPECT_EQ(pool.registrations(), 1);
  EXPECT_EQ(pool.registered_bytes(), 8 * kMiB);
  EXPECT_EQ(pool.idle_bytes(), 8 * kMiB);
}

TEST_F(PinnedHostPoolTest, LeasesHeldAtOnceGetBlocksOfTheirOwn) {
  PinnedHostPool pool(&api_, 64 * kMiB);
  for (int round = 0; round < 3; ++round) {
    PinnedHostPool::Lease a = Take(pool, 3 * kMiB);
    PinnedHostPool::Lease b = Take(pool, 3 * kMiB);
    EXPECT_NE(a.data(), b.data());
    EXPECT_EQ(a.bytes(), 4 * kMiB);  // the next power of two
  }
  EXPECT_EQ(api_.host_registrations(), 2);
  EXPECT_EQ(pool.registered_bytes(), 8 * kMiB);
}

TEST_F(PinnedHostPoolTest, TheSmallestIdleBlockThatFitsIsLent) {
  PinnedHostPool pool(&api_, 64 * kMiB);
  {
    PinnedHostPool::Lease big = Take(pool, 16 * kMiB);
    PinnedHostPool::Lease small = Take(pool, 100);
    EXPECT_EQ(small.bytes(), PinnedHostPool::kMinBlock);
  }
  PinnedHostPool::Lease mid = Take(pool, 2 * kMiB);  // fits only the big one
  EXPECT_EQ(mid.bytes(), 16 * kMiB);
  PinnedHostPool::Lease tiny = Take(pool, 1);
  EXPECT_EQ(tiny.bytes(), PinnedHostPool::kMinBlock);
  EXPECT_EQ(api_.host_registrations(), 2);
}

TEST_F(PinnedHostPoolTest, IdleBlocksPastTheKeepLimitAreFreedLargestFirst) {
  PinnedHostPool pool(&api_, 5 * kMiB);
  {
    PinnedHostPool::Lease a = Take(pool, 4 * kMiB);
    PinnedHostPool::Lease b = Take(pool, 1 * kMiB);
    PinnedHostPool::Lease c = Take(pool, 2 * kMiB);
    EXPECT_EQ(pool.registered_bytes(), 7 * kMiB);
  }
  // 7 MiB went idle against a 5 MiB limit: the 4 MiB block went.
  EXPECT_EQ(pool.idle_bytes(), 3 * kMiB);
  EXPECT_EQ(pool.registered_bytes(), 3 * kMiB);
  PinnedHostPool::Lease again = Take(pool, 4 * kMiB);
  EXPECT_EQ(api_.host_registrations(), 4);
}

TEST_F(PinnedHostPoolTest, KeepingNothingRegistersEveryLease) {
  PinnedHostPool pool(&api_, 0);
  for (int i = 0; i < 3; ++i) Take(pool, kMiB);
  EXPECT_EQ(api_.host_registrations(), 3);
  EXPECT_EQ(pool.registered_bytes(), 0);
}

TEST_F(PinnedHostPoolTest, AnEmptyLeaseRegistersNothingAndNegativeBytesAreRefused) {
  PinnedHostPool pool(&api_, 64 * kMiB);
  PinnedHostPool::Lease empty = Take(pool, 0);
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.bytes(), 0);
  absl::StatusOr<PinnedHostPool::Lease> bad = pool.Take(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_NE(bad.status().message().find("-1 bytes"), std::string::npos) << bad.status();
  EXPECT_EQ(api_.host_registrations(), 0);
}

TEST_F(PinnedHostPoolTest, AMovedLeaseReturnsItsBlockOnce) {
  PinnedHostPool pool(&api_, 64 * kMiB);
  PinnedHostPool::Lease a = Take(pool, kMiB);
  PinnedHostPool::Lease b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  PinnedHostPool::Lease c = Take(pool, kMiB);
  c = std::move(b);  // c's own block goes back, b's stays lent
  EXPECT_EQ(pool.idle_bytes(), kMiB);
  c = PinnedHostPool::Lease();
  EXPECT_EQ(pool.idle_bytes(), 2 * kMiB);
  EXPECT_EQ(api_.host_registrations(), 2);
}

TEST_F(PinnedHostPoolTest, ThreadsTakingAtOnceNeverShareABlock) {
  PinnedHostPool pool(&api_, 64 * kMiB);
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        absl::StatusOr<PinnedHostPool::Lease> l = pool.Take(kMiB);
        if (!l.ok()) {
          ++bad[t];
          continue;
        }
        std::memset(l->data(), t + 1, static_cast<size_t>(kMiB));
        for (int64_t k = 0; k < kMiB; k += 4096) bad[t] += l->data()[k] != t + 1;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(bad, std::vector<int>(4, 0));
  EXPECT_LE(pool.registrations(), 4);  // at most one block per thread holding one at once
  EXPECT_EQ(pool.registered_bytes(), pool.registrations() * kMiB);
}

}  // namespace
}  // namespace reshard::agent
