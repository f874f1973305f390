// A worker cannot take memory past the agent's limit by growing its own
// buffer (issue 31, defect 3). The descriptor a worker maps is writable, and
// a tmpfs file takes no seals, so a worker can ftruncate it larger, write
// into the new pages or fallocate past its end. The store measures what the
// file really holds (size and allocated bytes) at every seal, every
// descriptor it hands out and every CreateAll, refuses a grown buffer with
// FailedPrecondition naming job, generation, rank, planned and actual bytes,
// and truncates it to nothing at once, even while the worker keeps it open.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "agent/shard_store/shard_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/shard_store/store_fixture.h"

namespace reshard::agent {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

class WorkerGrowthTest : public ShardStoreTest {
 protected:
  RankBufferPtr Publish(ShardStore& store, const RankBufferKey& key, std::vector<int64_t> items) {
    auto created = store.CreateAll({key}, {items}, ShardStore::Backing::kPrefaulted,
                                   ShardStore::Writer::kWorker);
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? (*created)[0] : nullptr;
  }

  // The writable descriptor a worker gets (ACCESS_PUBLISH).
  static int WorkerFd(const RankBuffer& b) {
    absl::StatusOr<RankBuffer::WorkerFile> f = b.OpenForWorker(/*writable=*/true);
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? f->fd : -1;
  }

  // What a hostile worker does with it: grows the file to `bytes` and writes
  // every byte through a shared mapping, so that the pages exist.
  static void GrowAndFill(int fd, int64_t bytes) {
    ASSERT_EQ(::ftruncate(fd, bytes), 0) << std::strerror(errno);
    void* p =
        ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(p, MAP_FAILED) << std::strerror(errno);
    std::memset(p, 'x', static_cast<size_t>(bytes));
    ::munmap(p, static_cast<size_t>(bytes));
  }

  static struct stat StatFd(int fd) {
    struct stat st {};
    EXPECT_EQ(::fstat(fd, &st), 0) << std::strerror(errno);
    return st;
  }
};

TEST_F(WorkerGrowthTest, AGrownAndWrittenBufferIsRefusedAtSealAndFreedAtOnce) {
  auto store = OpenStore(256 * kMiB);
  RankBufferPtr b = Publish(*store, Key(0), {10240});
  ASSERT_NE(b, nullptr);
  const std::string path = b->path();
  const int fd = WorkerFd(*b);
  ASSERT_GE(fd, 0);
  GrowAndFill(fd, 64 * kMiB);
  ASSERT_EQ(StatFd(fd).st_blocks * 512, 64 * kMiB);
  b.reset();

  const std::string want =
      "rank buffer of job \"job-1\" generation 1 rank 0 holds 67108864 bytes (64.0 MiB: size "
      "67108864, allocated 67108864), 10240 bytes (10.0 KiB) planned: a worker may write its "
      "buffer but not grow it (ftruncate, fallocate or a write past its end); the buffer was "
      "dropped and its memory freed: publish the rank again";
  auto sealed = store->SealForWorker(Key(0), {});
  EXPECT_EQ(sealed.status().code(), absl::StatusCode::kFailedPrecondition) << sealed.status();
  EXPECT_EQ(sealed.status().message(), want);
  // Freed now, though the worker still holds its descriptor: the file is
  // truncated to nothing and its names are gone.
  const struct stat st = StatFd(fd);
  EXPECT_EQ(st.st_size, 0);
  EXPECT_EQ(st.st_blocks, 0);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".meta"));
  EXPECT_EQ(store->used_bytes(), 0);
  EXPECT_EQ(store->Get(Key(0)).status().code(), absl::StatusCode::kNotFound);
  // Asked again (a retried SealShard, a descriptor), the same refusal.
  EXPECT_EQ(store->Seal(Key(0), {}).status(), absl::FailedPreconditionError(want));
  EXPECT_EQ(store->CheckWorkerBuffer(Key(0)), absl::FailedPreconditionError(want));
  ::close(fd);

  // Another publish that fits is served, and the rank published again
  // starts afresh.
  ASSERT_NE(Publish(*store, Key(0, 1, "job-2"), {200 * kMiB}), nullptr);
  EXPECT_TRUE(store->Seal(Key(0, 1, "job-2"), {}).ok());
  ASSERT_NE(Publish(*store, Key(0), {10240}), nullptr);
  EXPECT_TRUE(store->CheckWorkerBuffer(Key(0)).ok());
  EXPECT_TRUE(store->SealForWorker(Key(0), {}).ok());
  EXPECT_EQ(store->used_bytes(), 200 * kMiB + 10240);
}

TEST_F(WorkerGrowthTest, FallocatePastTheEndIsGrowthToo) {
  auto store = OpenStore();
  RankBufferPtr b = Publish(*store, Key(0), {4096});
  ASSERT_NE(b, nullptr);
  const int fd = WorkerFd(*b);
  ASSERT_GE(fd, 0);
  // The size stays 4096: only the allocated bytes tell.
  ASSERT_EQ(::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 8 * kMiB), 0) << std::strerror(errno);
  ::close(fd);  // the worker let go: the seal would be in place
  b.reset();
  auto sealed = store->SealForWorker(Key(0), {});
  EXPECT_EQ(sealed.status(),
            absl::FailedPreconditionError(
                "rank buffer of job \"job-1\" generation 1 rank 0 holds 8388608 bytes (8.0 MiB: "
                "size 4096, allocated 8388608), 4096 bytes (4.0 KiB) planned: a worker may write "
                "its buffer but not grow it (ftruncate, fallocate or a write past its end); the "
                "buffer was dropped and its memory freed: publish the rank again"));
  EXPECT_EQ(store->used_bytes(), 0);
  EXPECT_EQ(FilesInDir(), 0);
}

TEST_F(WorkerGrowthTest, AnotherPublishFreesAGrownBufferFirst) {
  auto store = OpenStore(256 * kMiB);
  RankBufferPtr b = Publish(*store, Key(0), {10240});
  ASSERT_NE(b, nullptr);
  const int fd = WorkerFd(*b);
  ASSERT_GE(fd, 0);
  GrowAndFill(fd, 32 * kMiB);
  b.reset();
  // Another tenant's publish: before its room is counted, the grown buffer
  // goes (on a shm_dir sized to the limit it would otherwise fail ENOSPC).
  ASSERT_NE(Publish(*store, Key(0, 1, "job-2"), {64 * kMiB}), nullptr);
  EXPECT_EQ(StatFd(fd).st_size, 0);
  EXPECT_EQ(StatFd(fd).st_blocks, 0);
  ::close(fd);
  EXPECT_EQ(store->used_bytes(), 64 * kMiB);
  EXPECT_EQ(store->List().size(), 1u);
  auto sealed = store->SealForWorker(Key(0), {});
  EXPECT_EQ(sealed.status().code(), absl::StatusCode::kFailedPrecondition) << sealed.status();
  EXPECT_THAT(std::string(sealed.status().message()),
              ::testing::StartsWith("rank buffer of job \"job-1\" generation 1 rank 0 holds "
                                    "33554432 bytes (32.0 MiB: size 33554432, allocated "
                                    "33554432), 10240 bytes (10.0 KiB) planned"));
}

TEST_F(WorkerGrowthTest, ASparseGrowthIsRefusedBeforeADescriptorIsHandedOut) {
  auto store = OpenStore();
  RankBufferPtr b = Publish(*store, Key(0), {10240});
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(store->CheckWorkerBuffer(Key(0)).ok());
  const int fd = WorkerFd(*b);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, int64_t{1} << 30), 0);  // no page yet, but any write may take one
  ::close(fd);
  b.reset();
  EXPECT_EQ(store->CheckWorkerBuffer(Key(0)),
            absl::FailedPreconditionError(
                "rank buffer of job \"job-1\" generation 1 rank 0 holds 1073741824 bytes (1.0 "
                "GiB: size 1073741824, allocated 12288), 10240 bytes (10.0 KiB) planned: a worker "
                "may write its buffer but not grow it (ftruncate, fallocate or a write past its "
                "end); the buffer was dropped and its memory freed: publish the rank again"));
  EXPECT_EQ(store->Get(Key(0)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FilesInDir(), 0);
  // Sealed and agent-written buffers are not the worker's to grow: OK.
  ASSERT_NE(Publish(*store, Key(1), {100}), nullptr);
  ASSERT_TRUE(store->Seal(Key(1), {}).ok());
  EXPECT_TRUE(store->CheckWorkerBuffer(Key(1)).ok());
  ASSERT_TRUE(store->CreateAll({Key(0, 2)}, {{100}}).ok());
  EXPECT_TRUE(store->CheckWorkerBuffer(Key(0, 2)).ok());
  // Dropping the generation forgets the refusal.
  store->DropGeneration("job-1", 1);
  EXPECT_TRUE(store->CheckWorkerBuffer(Key(0)).ok());
}

TEST_F(WorkerGrowthTest, ABufferGrownBeforeTheAgentStartedIsRemovedAtOpen) {
  std::string path;
  {
    auto store = OpenStore();
    RankBufferPtr b = Publish(*store, Key(0), {4096});
    ASSERT_NE(b, nullptr);
    path = b->path();
    const int fd = WorkerFd(*b);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 4 * kMiB), 0) << std::strerror(errno);
    ::close(fd);
  }
  auto store = OpenStore();
  EXPECT_EQ(store->Get(Key(0)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_EQ(store->used_bytes(), 0);
}

}  // namespace
}  // namespace reshard::agent
