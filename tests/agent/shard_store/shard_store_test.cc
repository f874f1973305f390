#include "agent/shard_store/shard_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/shard_store/store_fixture.h"

namespace reshard::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST_F(ShardStoreTest, CreateGetSealRoundTrip) {
  auto store = OpenStore();
  absl::StatusOr<std::vector<RankBufferPtr>> created =
      store->CreateAll({Key(0), Key(1)}, {{100, 0, 7}, {3000}});
  ASSERT_TRUE(created.ok()) << created.status();
  ASSERT_EQ(created->size(), 2u);
  RankBufferPtr b0 = (*created)[0];
  EXPECT_EQ(b0->key(), Key(0));
  EXPECT_EQ(b0->path(), dir_ + "/reshard-host-a-job-1-g1-r0");
  EXPECT_TRUE(std::filesystem::exists(b0->path()));
  EXPECT_TRUE(std::filesystem::exists(b0->path() + ".meta"));
  ASSERT_EQ(b0->items().size(), 3u);
  EXPECT_EQ(b0->items()[2].offset, 128);
  EXPECT_EQ(b0->size(), 192);
  EXPECT_EQ(store->used_bytes(), 192 + 3008);
  for (int64_t i = 0; i < b0->size(); ++i) ASSERT_EQ(b0->data()[i], 0) << "byte " << i;
  EXPECT_FALSE(b0->sealed());

  Fill(*b0, 0, 1);
  Fill(*b0, 2, 9);
  absl::StatusOr<RankBufferPtr> got = store->Get(Key(0));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->get(), b0.get());
  EXPECT_EQ(store->Get(Key(5)).status().code(), absl::StatusCode::kNotFound);

  const std::vector<uint64_t> want = {Checksum(b0->item_data(0), 100), Checksum(nullptr, 0),
                                      Checksum(b0->item_data(2), 7)};
  absl::StatusOr<std::vector<uint64_t>> sums = store->Seal(Key(0), want);
  ASSERT_TRUE(sums.ok()) << sums.status();
  EXPECT_EQ(*sums, want);
  EXPECT_TRUE(b0->sealed());
  EXPECT_EQ(b0->checksums(), want);
  // Without expected checksums, Seal records what it finds.
  sums = store->Seal(Key(1), {});
  ASSERT_TRUE(sums.ok()) << sums.status();
  EXPECT_THAT(*sums, ElementsAre(Checksum((*created)[1]->data(), 3000)));
  EXPECT_EQ(store->Seal(Key(7), {}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(store->List(), ElementsAre(Key(0), Key(1)));
}

// Both backings give zeroed buffers whose pages are allocated before
// CreateAll returns (so a full shm_dir fails there, not with a SIGBUS later);
// PrefaultPages then maps a reserved buffer's pages.
TEST_F(ShardStoreTest, BackingsAllocateEveryPageUpFront) {
  auto store = OpenStore();
  for (auto backing : {ShardStore::Backing::kPrefaulted, ShardStore::Backing::kReserved}) {
    const int rank = backing == ShardStore::Backing::kPrefaulted ? 0 : 1;
    auto created = store->CreateAll({Key(rank)}, {{(int64_t{3} << 20) + 5}}, backing);
    ASSERT_TRUE(created.ok()) << created.status();
    RankBufferPtr b = (*created)[0];
    struct stat st {};
    ASSERT_EQ(::stat(b->path().c_str(), &st), 0);
    EXPECT_EQ(st.st_size, b->size());
    EXPECT_GE(static_cast<int64_t>(st.st_blocks) * 512, b->size()) << "rank " << rank;
    if (backing == ShardStore::Backing::kReserved) {
      EXPECT_TRUE(PrefaultPages(b->data() + 100, b->size() - 100).ok());
    }
    for (int64_t i = 0; i < b->size(); i += 4093) ASSERT_EQ(b->data()[i], 0) << "byte " << i;
    Fill(*b, 0, 3);
    EXPECT_EQ(b->data()[b->size() - 64], static_cast<uint8_t>(3 + (b->size() - 64) * 7));
  }
  EXPECT_TRUE(PrefaultPages(nullptr, 0).ok());
}

// Many bytes at once are created in parallel, still all or nothing.
TEST_F(ShardStoreTest, LargeCreatesAreAllOrNothing) {
  auto store = OpenStore();
  std::vector<RankBufferKey> keys;
  std::vector<std::vector<int64_t>> sizes;
  for (int r = 0; r < 5; ++r) {
    keys.push_back(Key(r));
    sizes.push_back({int64_t{16} << 20});
  }
  // A stray file where rank 3's buffer goes: that one fails, so all do.
  const std::string stray = dir_ + "/reshard-host-a-job-1-g1-r3";
  { std::ofstream(stray) << "x"; }
  auto failed = store->CreateAll(keys, sizes, ShardStore::Backing::kReserved);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kAlreadyExists) << failed.status();
  EXPECT_EQ(store->used_bytes(), 0);
  EXPECT_TRUE(store->List().empty());
  EXPECT_EQ(FilesInDir(), 1);
  std::filesystem::remove(stray);

  auto created = store->CreateAll(keys, sizes);
  ASSERT_TRUE(created.ok()) << created.status();
  ASSERT_EQ(created->size(), 5u);
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ((*created)[r]->key(), Key(r));
    EXPECT_EQ((*created)[r]->size(), int64_t{16} << 20);
    EXPECT_EQ((*created)[r]->data()[(int64_t{16} << 20) - 1], 0);
  }
  EXPECT_EQ(store->used_bytes(), int64_t{80} << 20);
  EXPECT_EQ(FilesInDir(), 10);  // buffers and sidecars
}

TEST_F(ShardStoreTest, BytesAreSharedWithAWorkerMapping) {
  auto store = OpenStore();
  auto created = store->CreateAll({Key(0)}, {{4096, 4096}});
  ASSERT_TRUE(created.ok()) << created.status();
  RankBufferPtr b = (*created)[0];
  // The worker maps the same file on its own.
  const int fd = ::open(b->path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  void* p = ::mmap(nullptr, b->size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(p, MAP_FAILED) << std::strerror(errno);
  uint8_t* worker = static_cast<uint8_t*>(p);

  Fill(*b, 0, 3);
  EXPECT_EQ(std::memcmp(worker, b->item_data(0), 4096), 0);
  for (int64_t i = 0; i < 4096; ++i) worker[b->items()[1].offset + i] = static_cast<uint8_t>(i);
  EXPECT_EQ(b->item_data(1)[200], 200);
  absl::StatusOr<std::vector<uint64_t>> sums =
      store->Seal(Key(0), {Checksum(worker, 4096), Checksum(worker + 4096, 4096)});
  EXPECT_TRUE(sums.ok()) << sums.status();
  ::munmap(p, b->size());
}

// Every rank buffer file is the agent's alone (issue 19): no worker of any
// job may open one by path, unsealed (0600: neither a worker's buffer nor one
// an operation prepares) or sealed (0400); workers map descriptors the agent
// opens for them (OpenForWorker), of exactly the file the store mapped.
TEST_F(ShardStoreTest, FilesAreTheAgentsAlone) {
  auto store = OpenStore();
  auto mode_and_group = [](const std::string& path) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0) << path << ": " << std::strerror(errno);
    return std::make_pair(st.st_mode & 07777, st.st_gid);
  };
  const gid_t own = ::getegid();
  auto worker = store->CreateAll({Key(0)}, {{4096}}, ShardStore::Backing::kPrefaulted,
                                 ShardStore::Writer::kWorker);
  ASSERT_TRUE(worker.ok()) << worker.status();
  const std::string path = (*worker)[0]->path();
  EXPECT_EQ(mode_and_group(path), std::make_pair(mode_t{0600}, own));
  absl::StatusOr<RankBuffer::WorkerFile> w = (*worker)[0]->OpenForWorker(/*writable=*/true);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->size, (*worker)[0]->size());
  ASSERT_EQ(::pwrite(w->fd, "x", 1, 0), 1);  // the worker writes through it
  ::close(w->fd);
  ASSERT_TRUE(store->Seal(Key(0), {}).ok());
  EXPECT_EQ(mode_and_group(path), std::make_pair(mode_t{0400}, own));
  absl::StatusOr<RankBuffer::WorkerFile> r =
      (*store->Get(Key(0)))->OpenForWorker(/*writable=*/false);
  ASSERT_TRUE(r.ok()) << r.status();
  char byte = 0;
  ASSERT_EQ(::pread(r->fd, &byte, 1, 0), 1);
  EXPECT_EQ(byte, 'x');
  EXPECT_LT(::write(r->fd, "y", 1), 0);  // read-only
  ::close(r->fd);

  auto agent = store->CreateAll({Key(1)}, {{4096}});
  ASSERT_TRUE(agent.ok()) << agent.status();
  EXPECT_EQ(mode_and_group((*agent)[0]->path()), std::make_pair(mode_t{0600}, own));
  ASSERT_TRUE(store->Seal(Key(1), {}).ok());
  EXPECT_EQ(mode_and_group((*agent)[0]->path()), std::make_pair(mode_t{0400}, own));

  // A truncated file is DataLoss naming the buffer, not a descriptor.
  ASSERT_EQ(::truncate(path.c_str(), 100), 0);
  absl::StatusOr<RankBuffer::WorkerFile> cut =
      (*store->Get(Key(0)))->OpenForWorker(/*writable=*/false);
  ASSERT_EQ(cut.status().code(), absl::StatusCode::kDataLoss) << cut.status();
  EXPECT_THAT(std::string(cut.status().message()), HasSubstr("generation"));
}

TEST_F(ShardStoreTest, SealWithWrongChecksumIsDataLossNamingTheItem) {
  auto store = OpenStore();
  auto created = store->CreateAll({Key(2, 3, "j")}, {{64, 64}});
  ASSERT_TRUE(created.ok()) << created.status();
  Fill(*(*created)[0], 1, 5);
  const uint64_t zeros = Checksum((*created)[0]->item_data(0), 64);
  absl::StatusOr<std::vector<uint64_t>> sums = store->Seal(Key(2, 3, "j"), {zeros, zeros});
  ASSERT_EQ(sums.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(sums.status().message()), HasSubstr("item 1"));
  EXPECT_THAT(std::string(sums.status().message()), HasSubstr("\"j\" generation 3 rank 2"));
  EXPECT_FALSE((*created)[0]->sealed());
  EXPECT_EQ(store->Seal(Key(2, 3, "j"), {zeros}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ShardStoreTest, OverTheLimitCreatesNothing) {
  auto store = OpenStore(10000);
  ASSERT_TRUE(store->CreateAll({Key(0, 1)}, {{4000}}).ok());
  // Three more of 2048 bytes fit one by one but not all together.
  auto over = store->CreateAll({Key(0, 2), Key(1, 2), Key(2, 2)}, {{2048}, {2048}, {2048}});
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.status().message()),
              HasSubstr("need 6.0 KiB for 3 rank buffers of job \"job-1\" generation 2"));
  EXPECT_EQ(store->used_bytes(), 4032);
  EXPECT_THAT(store->List(), ElementsAre(Key(0, 1)));
  EXPECT_EQ(FilesInDir(), 2);  // the generation 1 buffer and its sidecar
  EXPECT_TRUE(store->CreateAll({Key(0, 2), Key(1, 2)}, {{2048}, {2048}}).ok());
  EXPECT_EQ(store->used_bytes(), 4032 + 4096);
}

TEST_F(ShardStoreTest, CreatingAnExistingBufferIsAlreadyExistsAndCreatesNothing) {
  auto store = OpenStore();
  ASSERT_TRUE(store->CreateAll({Key(1)}, {{10}}).ok());
  auto again = store->CreateAll({Key(0), Key(1)}, {{10}, {10}});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store->Get(Key(0)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/reshard-host-a-job-1-g1-r0"));
  EXPECT_EQ(store->used_bytes(), 64);
  // A file left in the directory by someone else is not overwritten either.
  std::ofstream(dir_ + "/reshard-host-a-job-1-g1-r2") << "x";
  EXPECT_EQ(store->CreateAll({Key(2)}, {{10}}).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store->used_bytes(), 64);
}

TEST_F(ShardStoreTest, ReopenedStoreFindsBuffersAndSealedChecksums) {
  std::vector<uint64_t> sums;
  {
    auto store = OpenStore();
    auto created = store->CreateAll({Key(0), Key(0, 1, "job-x-g2")}, {{256, 8}, {}});
    ASSERT_TRUE(created.ok()) << created.status();
    // Published (a worker writes them): kept unsealed across a restart.
    ASSERT_TRUE(store
                    ->CreateAll({Key(1), Key(2)}, {{99}, {99}}, ShardStore::Backing::kPrefaulted,
                                ShardStore::Writer::kWorker)
                    .ok());
    Fill(*(*created)[0], 0, 11);
    Fill(*(*created)[0], 1, 12);
    auto sealed = store->Seal(Key(0), {});
    ASSERT_TRUE(sealed.ok()) << sealed.status();
    sums = *sealed;
    ASSERT_TRUE(store->Seal(Key(0, 1, "job-x-g2"), {}).ok());
  }
  // Another host's buffers and a malformed sidecar are not ours to load.
  {
    ShardStore::Options other = MakeOptions();
    other.host_id = "host-a-2";
    auto s = ShardStore::Open(other);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE((*s)->CreateAll({Key(9)}, {{10}}).ok());
  }
  std::ofstream(dir_ + "/reshard-host-a-bad-g1-r0.meta") << "garbage\n";
  // A data file whose size disagrees with its sidecar is skipped too.
  std::filesystem::resize_file(dir_ + "/reshard-host-a-job-1-g1-r1", 64);

  auto store = OpenStore();
  EXPECT_THAT(store->List(), ElementsAre(Key(0), Key(2), Key(0, 1, "job-x-g2")));
  EXPECT_EQ(store->used_bytes(), 320 + 128 + 0);
  absl::StatusOr<RankBufferPtr> b0 = store->Get(Key(0));
  ASSERT_TRUE(b0.ok()) << b0.status();
  EXPECT_TRUE((*b0)->sealed());
  EXPECT_EQ((*b0)->checksums(), sums);
  ASSERT_EQ((*b0)->items().size(), 2u);
  EXPECT_EQ((*b0)->items()[1].offset, 256);
  EXPECT_EQ(Checksum((*b0)->item_data(0), 256), sums[0]);
  EXPECT_EQ(Checksum((*b0)->item_data(1), 8), sums[1]);
  EXPECT_EQ(store->Get(Key(1)).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<RankBufferPtr> b2 = store->Get(Key(2));
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_FALSE((*b2)->sealed());
  EXPECT_TRUE((*b2)->checksums().empty());
  absl::StatusOr<RankBufferPtr> empty = store->Get(Key(0, 1, "job-x-g2"));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE((*empty)->sealed());
  EXPECT_EQ((*empty)->size(), 0);
  // The reloaded buffers can still be sealed, with the same result.
  auto resealed = store->Seal(Key(0), sums);
  EXPECT_TRUE(resealed.ok()) << resealed.status();
}

TEST_F(ShardStoreTest, DropGenerationRemovesFilesAndFreesMemoryWhenUnused) {
  auto store = OpenStore();
  auto g1 = store->CreateAll({Key(0, 1), Key(1, 1)}, {{1000}, {1000}});
  ASSERT_TRUE(g1.ok()) << g1.status();
  auto g2 = store->CreateAll({Key(0, 2)}, {{1000}});
  ASSERT_TRUE(g2.ok()) << g2.status();
  const std::string path = (*g1)[0]->path();
  RankBufferPtr held = (*g1)[0];
  g1->clear();
  EXPECT_EQ(store->used_bytes(), 3 * 1024);

  store->DropGeneration("job-1", 1);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".meta"));
  EXPECT_EQ(FilesInDir(), 2);
  EXPECT_THAT(store->List(), ElementsAre(Key(0, 2)));
  EXPECT_EQ(store->Get(Key(0, 1)).status().code(), absl::StatusCode::kNotFound);
  // Still mapped by its last user, and still counted.
  held->data()[999] = 1;
  EXPECT_EQ(store->used_bytes(), 2 * 1024);
  held.reset();
  EXPECT_EQ(store->used_bytes(), 1024);
  store->DropGeneration("job-1", 1);  // idempotent

  g2->clear();
  store->Drop(Key(0, 2));
  store->Drop(Key(0, 2));
  EXPECT_EQ(store->used_bytes(), 0);
  EXPECT_EQ(FilesInDir(), 0);
  // The key can be created again.
  EXPECT_TRUE(store->CreateAll({Key(0, 1)}, {{10}}).ok());
}

TEST_F(ShardStoreTest, ConcurrentCreatesOfOneKeyHaveOneWinner) {
  auto store = OpenStore(8 * 1024);
  std::atomic<int> won{0}, exists{0}, full{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        auto r = store->CreateAll({Key(i % 4, 1 + t % 2)}, {{1000}});
        if (r.ok()) ++won;
        if (r.status().code() == absl::StatusCode::kAlreadyExists) ++exists;
        if (r.status().code() == absl::StatusCode::kResourceExhausted) ++full;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(won, 8);  // 4 ranks x 2 generations, exactly 8 KiB
  EXPECT_EQ(won + exists + full, 160);
  EXPECT_EQ(store->used_bytes(), 8 * 1024);
  EXPECT_EQ(store->List().size(), 8u);
  EXPECT_EQ(FilesInDir(), 16);
}

TEST_F(ShardStoreTest, BadInputIsInvalidArgument) {
  auto store = OpenStore();
  EXPECT_EQ(store->CreateAll({Key(0)}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->CreateAll({Key(0), Key(0)}, {{1}, {1}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->CreateAll({Key(0, 1, "a/b")}, {{1}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->CreateAll({Key(0)}, {{-1}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FilesInDir(), 0);
  ShardStore::Options missing = MakeOptions();
  missing.shm_dir = dir_ + "/missing";
  EXPECT_FALSE(ShardStore::Open(missing).ok());
}

}  // namespace
}  // namespace reshard::agent
