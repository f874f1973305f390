// The shard store's spare pool: buffers made from spare files, refills,
// memory accounting, stale spares and restarts.
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "agent/shard_store/shard_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/wait.h"

namespace reshard::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr double kWait = 60;  // seconds WaitForSpares may take

class SparePoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/reshard-spare-pool-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<ShardStore> OpenStore(int64_t spare, int64_t limit = int64_t{1} << 30,
                                        double keep_dropped_s = 0,
                                        std::function<int64_t()> host_memory = nullptr) {
    ShardStore::Options o;
    o.shm_dir = dir_;
    o.host_id = "host-a";
    o.memory_limit_bytes = limit;
    o.spare_bytes = spare;
    o.keep_dropped_s = keep_dropped_s;
    // The pool's rules, not this machine's free memory, are under test.
    o.host_memory = host_memory ? std::move(host_memory) : [] { return int64_t{1} << 40; };
    absl::StatusOr<std::unique_ptr<ShardStore>> s = ShardStore::Open(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  // The inodes of this host's spare files.
  std::set<ino_t> SpareInodes() const {
    std::set<ino_t> out;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      if (e.path().filename().string().rfind("reshard-host-a-spare-", 0) != 0) continue;
      struct stat st {};
      if (::stat(e.path().c_str(), &st) == 0) out.insert(st.st_ino);
    }
    return out;
  }

  std::set<std::string> SparePaths() const {
    std::set<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      if (e.path().filename().string().rfind("reshard-host-a-spare-", 0) == 0) {
        out.insert(e.path().string());
      }
    }
    return out;
  }

  static struct stat Stat(const std::string& path) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
    return st;
  }

  static RankBufferKey Key(int rank, int64_t generation = 1) {
    RankBufferKey k;
    k.job_id = "job-1";
    k.generation = generation;
    k.rank = rank;
    return k;
  }

  static void ExpectZero(RankBuffer& b) {
    for (int64_t i = 0; i < b.size(); i += 1021) ASSERT_EQ(b.data()[i], 0) << "byte " << i;
    ASSERT_EQ(b.data()[b.size() - 1], 0);
  }

  std::string dir_;
};

TEST_F(SparePoolTest, BuffersAreMadeFromSparesAndThePoolRefills) {
  auto store = OpenStore(64 * kMiB);
  ASSERT_TRUE(store->WaitForSpares(kWait));
  EXPECT_EQ(store->spare_bytes(), 64 * kMiB);  // before any buffer: 4 x 16 MiB
  const std::set<ino_t> spares = SpareInodes();
  EXPECT_EQ(spares.size(), 4u);
  EXPECT_EQ(store->used_bytes(), 0);

  {
    // Nothing refills while paused, so the pool's state can be checked.
    const std::shared_ptr<void> pause = store->PauseSpareRefill();
    auto created =
        store->CreateAll({Key(0), Key(1), Key(2)}, {{10 * kMiB + 5, 100}, {20 * kMiB}, {4096}},
                         ShardStore::Backing::kReserved);
    ASSERT_TRUE(created.ok()) << created.status();
    // Rank 1 (largest) took a 16 MiB spare, extended; rank 0 the next,
    // truncated; rank 2 is too small for a spare.
    RankBufferPtr b0 = (*created)[0], b1 = (*created)[1], b2 = (*created)[2];
    EXPECT_EQ(b0->path(), dir_ + "/reshard-host-a-job-1-g1-r0");
    EXPECT_EQ(b1->path(), dir_ + "/reshard-host-a-job-1-g1-r1");
    EXPECT_EQ(b0->size(), 10 * kMiB + 64 + 128);
    EXPECT_EQ(b1->size(), 20 * kMiB);
    EXPECT_EQ(Stat(b0->path()).st_size, b0->size());
    EXPECT_EQ(Stat(b1->path()).st_size, b1->size());
    EXPECT_EQ(spares.count(Stat(b0->path()).st_ino), 1u);
    EXPECT_EQ(spares.count(Stat(b1->path()).st_ino), 1u);
    EXPECT_EQ(spares.count(Stat(b2->path()).st_ino), 0u);
    // Every page of the extension is reserved too.
    EXPECT_GE(static_cast<int64_t>(Stat(b1->path()).st_blocks) * 512, b1->size());
    EXPECT_EQ(store->spare_bytes(), 32 * kMiB);
    EXPECT_EQ(SpareInodes().size(), 2u);
    EXPECT_EQ(store->used_bytes(), b0->size() + b1->size() + b2->size());
    for (const RankBufferPtr& b : *created) {
      ExpectZero(*b);
      EXPECT_TRUE(std::filesystem::exists(b->path() + ".meta"));
    }
    std::memset(b1->data(), 7, b1->size());
    auto sums = store->Seal(Key(1), {});
    ASSERT_TRUE(sums.ok()) << sums.status();
    EXPECT_EQ((*sums)[0], Checksum(b1->data(), b1->size()));
  }
  // Refilled with spares the sizes of the last buffers made (20 and 12 MiB).
  ASSERT_TRUE(store->WaitForSpares(kWait));
  EXPECT_GT(store->spare_bytes(), 32 * kMiB);
  EXPECT_LE(store->spare_bytes(), 64 * kMiB);

  // A prefaulted buffer from a spare: zeroed, the right size, mapped.
  auto more = store->CreateAll({Key(0, 2)}, {{18 * kMiB}});
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_EQ((*more)[0]->size(), 18 * kMiB);
  EXPECT_EQ(Stat((*more)[0]->path()).st_size, 18 * kMiB);
  ExpectZero(*(*more)[0]);
}

TEST_F(SparePoolTest, SparesCountAgainstTheLimitAndMakeRoom) {
  auto store = OpenStore(64 * kMiB, 100 * kMiB);
  ASSERT_TRUE(store->WaitForSpares(kWait));
  EXPECT_EQ(store->spare_bytes(), 64 * kMiB);
  auto a = store->CreateAll({Key(0)}, {{60 * kMiB}});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(store->used_bytes(), 60 * kMiB);
  EXPECT_LE(store->used_bytes() + store->spare_bytes(), 100 * kMiB);
  ASSERT_TRUE(store->WaitForSpares(kWait));
  EXPECT_LE(store->used_bytes() + store->spare_bytes(), 100 * kMiB);
  EXPECT_GT(store->spare_bytes(), 0);

  // Over the limit with the rank buffers alone: nothing made, spares kept.
  const int64_t spare_before = store->spare_bytes();
  auto over = store->CreateAll({Key(5), Key(6)}, {{20 * kMiB}, {30 * kMiB}});
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_THAT(over.status().message(), HasSubstr("need 50.0 MiB"));
  EXPECT_THAT(store->List(), ElementsAre(Key(0)));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/reshard-host-a-job-1-g1-r5"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/reshard-host-a-job-1-g1-r6"));
  EXPECT_EQ(store->used_bytes(), 60 * kMiB);
  EXPECT_EQ(store->spare_bytes(), spare_before);

  // Fits only without the spares: they make room.
  auto fits = store->CreateAll({Key(5), Key(6)}, {{10 * kMiB}, {30 * kMiB}});
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(store->used_bytes(), 100 * kMiB);
  EXPECT_EQ(store->spare_bytes(), 0);
  for (const RankBufferPtr& b : *fits) ExpectZero(*b);
  ASSERT_TRUE(store->WaitForSpares(kWait));
  EXPECT_EQ(store->spare_bytes(), 0);  // no room to refill

  // Freed room is refilled.
  fits->clear();
  store->DropGeneration("job-1", 1);
  a->clear();
  ASSERT_TRUE(store->WaitForSpares(kWait));
  EXPECT_EQ(store->used_bytes(), 0);
  EXPECT_GT(store->spare_bytes(), 0);
  EXPECT_LE(store->spare_bytes(), 64 * kMiB);
}

// A rank buffer of `item_bytes` made with `backing`, filled with `fill`
// and sealed; its file's inode.
ino_t MakeSealed(ShardStore& store, const RankBufferKey& key, std::vector<int64_t> item_bytes,
                 uint8_t fill) {
  auto made = store.CreateAll({key}, {item_bytes}, ShardStore::Backing::kOverwritten);
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return 0;
  RankBufferPtr b = (*made)[0];
  std::memset(b->data(), fill, static_cast<size_t>(b->size()));
  auto sealed = store.Seal(key, {});
  EXPECT_TRUE(sealed.ok()) << sealed.status();
  struct stat st {};
  EXPECT_EQ(::stat(b->path().c_str(), &st), 0);
  return st.st_ino;
}

TEST_F(SparePoolTest, ADroppedBuffersPagesServeTheNextBufferItsWriterOverwrites) {
  auto store = OpenStore(/*spare=*/0, int64_t{1} << 30, /*keep_dropped_s=*/600);
  const ino_t old = MakeSealed(*store, Key(0), {8 * kMiB + 3, 100}, 0xAB);
  const int64_t old_size = 8 * kMiB + 192;  // items at 64-byte offsets, the end too
  store->DropGeneration("job-1", 1);
  // Its name is gone at once; its file is a used spare, counted as a spare.
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/reshard-host-a-job-1-g1-r0"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/reshard-host-a-job-1-g1-r0.meta"));
  EXPECT_EQ(SpareInodes(), std::set<ino_t>{old});
  EXPECT_EQ(store->spare_bytes(), old_size);
  EXPECT_EQ(store->used_bytes(), 0);
  EXPECT_EQ(Stat(*SparePaths().begin()).st_mode & 07777, 0600u);  // writable again

  // A buffer its writer overwrites takes it: the old bytes stay in its
  // items until overwritten; between and after them it reads zero.
  auto reused =
      store->CreateAll({Key(1, 2)}, {{4 * kMiB + 1, 4 * kMiB}}, ShardStore::Backing::kOverwritten);
  ASSERT_TRUE(reused.ok()) << reused.status();
  RankBufferPtr b = (*reused)[0];
  EXPECT_EQ(Stat(b->path()).st_ino, old);
  ASSERT_EQ(b->size(), 8 * kMiB + 64);
  EXPECT_EQ(Stat(b->path()).st_size, b->size());
  EXPECT_EQ(b->data()[0], 0xAB);
  EXPECT_EQ(b->data()[4 * kMiB], 0xAB);
  for (int64_t i = 4 * kMiB + 1; i < 4 * kMiB + 64; ++i) ASSERT_EQ(b->data()[i], 0) << i;
  EXPECT_EQ(b->items()[1].offset, 4 * kMiB + 64);
  EXPECT_EQ(b->data()[b->size() - 1], 0xAB);
  EXPECT_EQ(store->spare_bytes(), 0);
  EXPECT_TRUE(SpareInodes().empty());
  EXPECT_EQ(store->used_bytes(), 8 * kMiB + 64);

  // Dropped again (filled with 0xCD), the pages serve a buffer that must
  // read zero (kReserved; a worker's publish alike): cleared whole.
  std::memset(b->data(), 0xCD, static_cast<size_t>(b->size()));
  b.reset();
  reused->clear();
  store->Drop(Key(1, 2));
  EXPECT_EQ(SpareInodes(), std::set<ino_t>{old});
  auto zeroed = store->CreateAll({Key(0, 3)}, {{8 * kMiB}}, ShardStore::Backing::kReserved);
  ASSERT_TRUE(zeroed.ok()) << zeroed.status();
  EXPECT_EQ(Stat((*zeroed)[0]->path()).st_ino, old);
  ExpectZero(*(*zeroed)[0]);
  for (int64_t i = 0; i < 8 * kMiB; i += 4096) ASSERT_EQ((*zeroed)[0]->data()[i], 0) << i;
  // And a worker's publish buffer (mapped read-only by the agent) likewise.
  std::memset((*zeroed)[0]->data(), 0xEE, 8 * kMiB);
  zeroed->clear();
  store->Drop(Key(0, 3));
  EXPECT_EQ(SpareInodes(), std::set<ino_t>{old});
  auto published = store->CreateAll({Key(1, 3)}, {{8 * kMiB}}, ShardStore::Backing::kPrefaulted,
                                    ShardStore::Writer::kWorker);
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_EQ(Stat((*published)[0]->path()).st_ino, old);
  ExpectZero(*(*published)[0]);
  for (int64_t i = 0; i < 8 * kMiB; i += 4096) ASSERT_EQ((*published)[0]->data()[i], 0) << i;
}

TEST_F(SparePoolTest, ADroppedBufferAnotherProcessHoldsIsFreedNotKept) {
  auto store = OpenStore(0, int64_t{1} << 30, 600);
  MakeSealed(*store, Key(0), {8 * kMiB}, 0x5A);
  // A worker still holding the file (a zero-copy load keeps it mapped; an
  // open descriptor counts alike): its bytes must never be reused.
  const int held = ::open((dir_ + "/reshard-host-a-job-1-g1-r0").c_str(), O_RDONLY);
  ASSERT_GE(held, 0) << std::strerror(errno);
  store->DropGeneration("job-1", 1);
  EXPECT_TRUE(SpareInodes().empty());
  EXPECT_EQ(store->spare_bytes(), 0);
  struct stat st {};
  ASSERT_EQ(::fstat(held, &st), 0);
  EXPECT_EQ(st.st_nlink, 0u);  // unlinked: its pages go when the holder lets go
  uint8_t byte = 0;
  ASSERT_EQ(::pread(held, &byte, 1, 4 * kMiB), 1);
  EXPECT_EQ(byte, 0x5A);
  ::close(held);

  // A buffer the agent itself still uses (a task holds it) likewise.
  MakeSealed(*store, Key(1), {8 * kMiB}, 0x11);
  absl::StatusOr<RankBufferPtr> in_use = store->Get(Key(1));
  ASSERT_TRUE(in_use.ok()) << in_use.status();
  store->Drop(Key(1));
  EXPECT_TRUE(SpareInodes().empty());
  EXPECT_EQ((*in_use)->data()[8 * kMiB - 1], 0x11);
}

TEST_F(SparePoolTest, UsedSparesAreFreedWhenTheirTimeIsUpOrTheRoomIsNeeded) {
  {
    auto store = OpenStore(0, int64_t{1} << 30, /*keep_dropped_s=*/0.2);
    MakeSealed(*store, Key(0), {8 * kMiB}, 1);
    store->DropGeneration("job-1", 1);
    EXPECT_EQ(store->spare_bytes(), 8 * kMiB);
    EXPECT_TRUE(test_support::Eventually(
        [&] { return store->spare_bytes() == 0 && SpareInodes().empty(); }, absl::Seconds(30)));
  }
  // Within the memory limit, and freed first when a buffer needs the room.
  auto store = OpenStore(0, /*limit=*/20 * kMiB, 600);
  MakeSealed(*store, Key(0), {16 * kMiB}, 2);
  store->DropGeneration("job-1", 1);
  EXPECT_EQ(store->spare_bytes(), 16 * kMiB);
  auto zeroed = store->CreateAll({Key(0, 2)}, {{12 * kMiB}}, ShardStore::Backing::kReserved);
  ASSERT_TRUE(zeroed.ok()) << zeroed.status();
  EXPECT_EQ(store->spare_bytes(), 0);
  EXPECT_TRUE(SpareInodes().empty());
  ExpectZero(*(*zeroed)[0]);
  // Kept beside the buffers while the limit allows: 12 MiB used + 6 kept.
  MakeSealed(*store, Key(1, 2), {6 * kMiB}, 3);
  store->Drop(Key(1, 2));
  EXPECT_EQ(store->spare_bytes(), 6 * kMiB);
  zeroed->clear();
  store->Drop(Key(0, 2));
  EXPECT_EQ(store->spare_bytes(), 18 * kMiB);
  EXPECT_EQ(store->used_bytes(), 0);
}

TEST_F(SparePoolTest, SparesGoWhenTheHostNeedsItsMemoryBack) {
  std::atomic<int64_t> host{int64_t{1} << 40};
  auto store = OpenStore(32 * kMiB, int64_t{1} << 30, 600, [&] { return host.load(); });
  ASSERT_TRUE(store->WaitForSpares(kWait));
  MakeSealed(*store, Key(0), {8 * kMiB}, 1);
  store->DropGeneration("job-1", 1);
  ASSERT_TRUE(store->WaitForSpares(kWait));
  ASSERT_GT(store->spare_bytes(), 8 * kMiB);  // clean ones and the used one
  // The host needs memory back (and goes on needing it): every spare goes.
  host = -1;
  ASSERT_TRUE(
      test_support::Eventually([&] { return store->spare_bytes() == 0 && SpareInodes().empty(); }));
  // While it is short nothing is kept or filled.
  host = 0;
  MakeSealed(*store, Key(1), {8 * kMiB}, 2);
  const int64_t before = store->spare_bytes();
  store->Drop(Key(1));
  EXPECT_EQ(store->spare_bytes(), before);
  ASSERT_TRUE(store->WaitForSpares(kWait));
  EXPECT_EQ(store->spare_bytes(), before);
  // Room again: the clean pool refills.
  host = int64_t{1} << 40;
  store->WaitForSpares(0);  // wakes the thread
  ASSERT_TRUE(test_support::Eventually([&] { return store->spare_bytes() == 32 * kMiB; }));
}

TEST_F(SparePoolTest, StaleSparesAreRemovedAtOpen) {
  for (const char* name : {"reshard-host-a-spare-7", "reshard-host-a-spare-123",
                           "reshard-host-b-spare-1", "reshard-host-a-spare-x"}) {
    std::ofstream(dir_ + "/" + name) << "left by a crashed agent";
  }
  auto store = OpenStore(0);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/reshard-host-a-spare-7"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/reshard-host-a-spare-123"));
  // Another host's, and a name that is not a spare's, stay.
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/reshard-host-b-spare-1"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/reshard-host-a-spare-x"));
  EXPECT_EQ(store->spare_bytes(), 0);
  EXPECT_TRUE(store->WaitForSpares(0));
}

TEST_F(SparePoolTest, BuffersFromSparesSurviveARestart) {
  std::vector<uint64_t> sums;
  {
    auto store = OpenStore(32 * kMiB);
    ASSERT_TRUE(store->WaitForSpares(kWait));
    const std::set<ino_t> spares = SpareInodes();
    auto created = store->CreateAll({Key(0)}, {{8 * kMiB, 3 * kMiB}});
    ASSERT_TRUE(created.ok()) << created.status();
    RankBufferPtr b = (*created)[0];
    EXPECT_EQ(spares.count(Stat(b->path()).st_ino), 1u);
    for (int64_t i = 0; i < b->size(); ++i) b->data()[i] = static_cast<uint8_t>(i * 13);
    auto sealed = store->Seal(Key(0), {});
    ASSERT_TRUE(sealed.ok()) << sealed.status();
    sums = *sealed;
    ASSERT_TRUE(store->WaitForSpares(kWait));
  }
  // The store removes its spares when it goes; the buffer stays.
  EXPECT_TRUE(SpareInodes().empty());
  auto store = OpenStore(32 * kMiB);
  EXPECT_THAT(store->List(), ElementsAre(Key(0)));
  absl::StatusOr<RankBufferPtr> b = store->Get(Key(0));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE((*b)->sealed());
  EXPECT_EQ((*b)->checksums(), sums);
  EXPECT_EQ(Checksum((*b)->item_data(0), 8 * kMiB), sums[0]);
  EXPECT_EQ(Checksum((*b)->item_data(1), 3 * kMiB), sums[1]);
  EXPECT_EQ(store->used_bytes(), 11 * kMiB);
  ASSERT_TRUE(store->WaitForSpares(kWait));
  EXPECT_LE(store->spare_bytes(), 32 * kMiB);
  EXPECT_GT(store->spare_bytes(), 0);
}

TEST_F(SparePoolTest, ExistingFileIsAlreadyExistsAndTheSpareStays) {
  auto store = OpenStore(32 * kMiB);
  ASSERT_TRUE(store->WaitForSpares(kWait));
  const std::shared_ptr<void> pause = store->PauseSpareRefill();
  std::ofstream(dir_ + "/reshard-host-a-job-1-g1-r1") << "x";
  auto r = store->CreateAll({Key(0), Key(1)}, {{8 * kMiB}, {16 * kMiB}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists) << r.status();
  EXPECT_EQ(store->used_bytes(), 0);
  EXPECT_TRUE(store->List().empty());
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/reshard-host-a-job-1-g1-r0"));
  EXPECT_EQ(Stat(dir_ + "/reshard-host-a-job-1-g1-r1").st_size, 1);
  // The existing file is found before anything is made: no spare was taken.
  EXPECT_EQ(store->spare_bytes(), 32 * kMiB);
}

TEST_F(SparePoolTest, NoPoolOutsideTmpfs) {
  char tmpl[] = "/var/tmp/reshard-spare-pool-test-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) GTEST_SKIP() << "no /var/tmp: " << std::strerror(errno);
  const std::string disk = tmpl;
  struct statfs fs {};
  if (::statfs(disk.c_str(), &fs) != 0 || fs.f_type == TMPFS_MAGIC) {
    std::filesystem::remove_all(disk);
    GTEST_SKIP() << "/var/tmp is a tmpfs here";
  }
  {
    ShardStore::Options o;
    o.shm_dir = disk;
    o.host_id = "host-a";
    o.spare_bytes = 64 * kMiB;
    auto store = ShardStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_TRUE((*store)->WaitForSpares(kWait));
    EXPECT_EQ((*store)->spare_bytes(), 0);
    EXPECT_TRUE((*store)->CreateAll({Key(0)}, {{8 * kMiB}}).ok());
  }
  std::filesystem::remove_all(disk);
}

TEST_F(SparePoolTest, NegativeSpareBytesIsInvalidArgument) {
  ShardStore::Options o;
  o.shm_dir = dir_;
  o.host_id = "host-a";
  o.spare_bytes = -1;
  EXPECT_EQ(ShardStore::Open(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace reshard::agent
