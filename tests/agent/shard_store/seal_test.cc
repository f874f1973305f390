// A sealed rank buffer is immutable and no worker action on its file can
// crash the agent (issue 9, defects 1, 2 and 5). Each test does to the file
// what a careless or hostile worker does: keeps a writable mapping, writes
// after sealing, truncates, and checks what the store serves.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "agent/shard_store/shard_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/shard_store/store_fixture.h"

namespace reshard::agent {
namespace {

using ::testing::HasSubstr;

// A worker's view of a published file: mapped shared and writable.
class WorkerMapping {
 public:
  WorkerMapping(const std::string& path, int64_t size) : size_(size) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    EXPECT_GE(fd, 0) << path << ": " << std::strerror(errno);
    void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(p, MAP_FAILED) << std::strerror(errno);
    data_ = static_cast<uint8_t*>(p);
    ::close(fd);
  }
  ~WorkerMapping() { Unmap(); }
  void Unmap() {
    if (data_ != nullptr) ::munmap(data_, static_cast<size_t>(size_));
    data_ = nullptr;
  }
  uint8_t* data() { return data_; }

 private:
  uint8_t* data_ = nullptr;
  int64_t size_;
};

ino_t InodeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

class SealTest : public ShardStoreTest {
 protected:
  RankBufferPtr Publish(ShardStore& store, const RankBufferKey& key, std::vector<int64_t> items) {
    auto created = store.CreateAll({key}, {items}, ShardStore::Backing::kPrefaulted,
                                   ShardStore::Writer::kWorker);
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? (*created)[0] : nullptr;
  }
};

TEST_F(SealTest, WorkerThatUnmappedIsSealedInPlaceAndTheFileBecomesReadOnly) {
  auto store = OpenStore();
  RankBufferPtr b = Publish(*store, Key(0), {4096});
  ASSERT_NE(b, nullptr);
  const ino_t inode = InodeOf(b->path());
  {
    WorkerMapping w(b->path(), b->size());
    std::memset(w.data(), 'A', 4096);
  }
  auto sums = store->Seal(Key(0), {});
  ASSERT_TRUE(sums.ok()) << sums.status();
  std::vector<uint8_t> want(4096, 'A');
  EXPECT_EQ((*sums)[0], Checksum(want.data(), want.size()));
  EXPECT_EQ(InodeOf(b->path()), inode) << "no copy was needed";
  EXPECT_EQ(ModeOf(b->path()), 0400u);
  // Nobody in the agent can write it, so a reader gets a lease.
  auto got = store->Get(Key(0));
  ASSERT_TRUE(got.ok());
  auto lease = (*got)->LeaseForReading();
  EXPECT_TRUE(lease.ok()) << lease.status();
}

TEST_F(SealTest, WritesThroughAMappingHeldAcrossTheSealDoNotReachTheSealedBuffer) {
  auto store = OpenStore();
  RankBufferPtr b = Publish(*store, Key(0), {1 << 20, 100});
  ASSERT_NE(b, nullptr);
  const std::string path = b->path();
  const ino_t inode = InodeOf(path);
  WorkerMapping w(path, b->size());
  std::memset(w.data(), 'A', b->size());
  auto sums = store->Seal(Key(0), {});
  ASSERT_TRUE(sums.ok()) << sums.status();
  // The worker goes on writing through its old mapping.
  std::memset(w.data(), 'B', b->size());

  auto sealed = store->Get(Key(0));
  ASSERT_TRUE(sealed.ok());
  EXPECT_TRUE((*sealed)->sealed());
  EXPECT_NE(InodeOf(path), inode) << "the sealed bytes must live in a file the worker cannot reach";
  for (size_t i = 0; i < (*sealed)->items().size(); ++i) {
    const ItemSlot& slot = (*sealed)->items()[i];
    std::vector<uint8_t> a(static_cast<size_t>(slot.bytes), 'A');
    EXPECT_EQ(0, std::memcmp((*sealed)->item_data(static_cast<int>(i)), a.data(), a.size()));
    EXPECT_EQ((*sums)[i], Checksum(a.data(), a.size()));
  }
  EXPECT_TRUE((*sealed)->CheckFile().ok());
  EXPECT_EQ(ModeOf(path), 0400u);
  // The copy took the room of one more buffer while it was made, and the
  // old one's is returned once its last user (here `b`) lets go.
  b.reset();
  EXPECT_EQ(store->used_bytes(), (*sealed)->size());
  // A restarted agent finds the sealed copy.
  sealed->reset();
  store.reset();
  store = OpenStore();
  auto again = store->Get(Key(0));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->sealed());
  EXPECT_EQ((*again)->checksums(), *sums);
}

TEST_F(SealTest, CopyThatDoesNotFitTheLimitIsResourceExhaustedAndChangesNothing) {
  auto store = OpenStore(/*limit=*/int64_t{3} << 20);
  RankBufferPtr b = Publish(*store, Key(0), {2 << 20});
  ASSERT_NE(b, nullptr);
  WorkerMapping w(b->path(), b->size());
  auto sums = store->Seal(Key(0), {});
  EXPECT_EQ(sums.status().code(), absl::StatusCode::kResourceExhausted) << sums.status();
  EXPECT_THAT(sums.status().message(), HasSubstr("unmap"));
  EXPECT_FALSE(b->sealed());
  EXPECT_EQ(store->used_bytes(), 2 << 20);
  // Once the worker lets go, the seal goes through in place.
  w.Unmap();
  EXPECT_TRUE(store->Seal(Key(0), {}).ok());
}

TEST_F(SealTest, TruncatedBeforeSealIsDataLossAndTheStoreSurvives) {
  auto store = OpenStore();
  RankBufferPtr b = Publish(*store, Key(0), {1 << 20});
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(::truncate(b->path().c_str(), 0), 0);
  auto sums = store->Seal(Key(0), {});
  EXPECT_EQ(sums.status().code(), absl::StatusCode::kDataLoss) << sums.status();
  EXPECT_THAT(sums.status().message(), HasSubstr("rank 0"));
  EXPECT_EQ(b->CheckFile().code(), absl::StatusCode::kDataLoss);
  // Still truncated while a worker keeps it mapped: the copy reads with
  // pread and sees the short file.
  {
    WorkerMapping w(b->path(), 0 + 4096);
    auto again = store->Seal(Key(0), {});
    EXPECT_EQ(again.status().code(), absl::StatusCode::kDataLoss) << again.status();
  }
  // Other buffers are served as before.
  RankBufferPtr other = Publish(*store, Key(1), {100});
  ASSERT_NE(other, nullptr);
  EXPECT_TRUE(store->Seal(Key(1), {}).ok());
}

TEST_F(SealTest, TruncatingASealedFileIsCaughtBeforeAnyRead) {
  auto store = OpenStore();
  RankBufferPtr b = Publish(*store, Key(0), {1 << 20});
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(store->Seal(Key(0), {}).ok());
  ASSERT_EQ(::truncate(b->path().c_str(), 4096), 0);  // root ignores the 0400 mode
  EXPECT_EQ(b->CheckFile().code(), absl::StatusCode::kDataLoss);
  auto lease = b->LeaseForReading();
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kDataLoss) << lease.status();
}

TEST_F(SealTest, LeaseRefusesAWriterAndBreaksWhenOneAsks) {
  auto store = OpenStore();
  RankBufferPtr b = Publish(*store, Key(0), {4096});
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(store->Seal(Key(0), {}).ok());
  {
    const int w = ::open(b->path().c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(w, 0);
    EXPECT_EQ(b->LeaseForReading().status().code(), absl::StatusCode::kFailedPrecondition);
    ::close(w);
  }
  auto lease = b->LeaseForReading();
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_FALSE((*lease)->Broken());
  // An open for writing does not get through while the lease is held
  // (O_NONBLOCK: it fails at once instead of waiting), and breaks it.
  EXPECT_LT(::open(b->path().c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC), 0);
  EXPECT_EQ(errno, EWOULDBLOCK);
  EXPECT_TRUE((*lease)->Broken());
}

TEST_F(SealTest, SealingASealedBufferReturnsItsChecksumsAndRefusesOthers) {
  auto store = OpenStore();
  RankBufferPtr b = Publish(*store, Key(0), {64});
  ASSERT_NE(b, nullptr);
  auto sums = store->Seal(Key(0), {});
  ASSERT_TRUE(sums.ok());
  auto again = store->Seal(Key(0), *sums);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *sums);
  auto other = store->Seal(Key(0), {(*sums)[0] ^ 1});
  EXPECT_EQ(other.status().code(), absl::StatusCode::kDataLoss) << other.status();
}

// The executor checksums each item as its last write lands and seals with
// those sums: they are recorded (and survive a restart) as if Seal had read
// them, and only an agent-written, unsealed buffer takes them.
TEST_F(SealTest, SealWrittenRecordsTheWritersChecksumsAndRefusesWorkerOrSealedBuffers) {
  std::vector<uint64_t> want;
  {
    auto store = OpenStore();
    auto created = store->CreateAll({Key(0, 2)}, {{100, 0, 300}}, ShardStore::Backing::kReserved);
    ASSERT_TRUE(created.ok()) << created.status();
    RankBuffer& b = *(*created)[0];
    Fill(b, 0, 3);
    Fill(b, 2, 9);
    for (const ItemSlot& slot : b.items())
      want.push_back(Checksum(b.data() + slot.offset, slot.bytes));
    EXPECT_EQ(store->SealWritten(Key(0, 2), {1, 2}).status().code(),
              absl::StatusCode::kInvalidArgument);
    auto sums = store->SealWritten(Key(0, 2), want);
    ASSERT_TRUE(sums.ok()) << sums.status();
    EXPECT_EQ(*sums, want);
    EXPECT_TRUE(b.sealed());
    EXPECT_EQ(b.checksums(), want);
    EXPECT_EQ(store->SealWritten(Key(0, 2), want).status().code(),
              absl::StatusCode::kFailedPrecondition);
    ASSERT_NE(Publish(*store, Key(0, 1), {64}), nullptr);
    EXPECT_EQ(store->SealWritten(Key(0, 1), {0}).status().code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(store->SealWritten(Key(5, 1), {0}).status().code(), absl::StatusCode::kNotFound);
  }
  auto store = OpenStore();
  auto again = store->Seal(Key(0, 2), want);  // what Open found in the sidecar
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, want);
}

TEST_F(SealTest, UnfinishedTaskBuffersAreRemovedAtOpenAndPublishedOnesKept) {
  {
    auto store = OpenStore();
    ASSERT_TRUE(store->CreateAll({Key(0, 2)}, {{1000}}, ShardStore::Backing::kReserved).ok());
    ASSERT_NE(Publish(*store, Key(0, 1), {1000}), nullptr);
  }
  const std::string task_file = dir_ + "/reshard-host-a-job-1-g2-r0";
  ASSERT_TRUE(std::filesystem::exists(task_file));
  auto store = OpenStore();
  EXPECT_EQ(store->Get(Key(0, 2)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(task_file));
  EXPECT_FALSE(std::filesystem::exists(task_file + ".meta"));
  EXPECT_TRUE(store->Get(Key(0, 1)).ok());
  EXPECT_EQ(store->used_bytes(), 1024);
  // A new attempt can make the buffer again.
  EXPECT_TRUE(store->CreateAll({Key(0, 2)}, {{1000}}, ShardStore::Backing::kReserved).ok());
}

// The soak found these: an agent killed while it made a buffer left a data
// file without its sidecar (written second) and a half-written sidecar
// (`.meta.tmp`), which no later agent ever removed. The sidecar now goes
// first, and Open removes what a dead agent left half made.
TEST_F(SealTest, BuffersAnAgentDiedMakingAreRemovedAtOpen) {
  {
    auto store = OpenStore();
    ASSERT_NE(Publish(*store, Key(0), {1000}), nullptr);
    ASSERT_NE(Publish(*store, Key(1), {1000}), nullptr);
  }
  const std::string r0 = dir_ + "/reshard-host-a-job-1-g1-r0";
  const std::string r1 = dir_ + "/reshard-host-a-job-1-g1-r1";
  ASSERT_EQ(::truncate(r0.c_str(), 0), 0);  // made, not yet sized
  ASSERT_EQ(::unlink(r1.c_str()), 0);       // sidecar written, no file yet
  std::ofstream(r1 + ".meta.tmp") << "reshard-rank-buffer 1\nhost host-a\n";
  auto store = OpenStore();
  EXPECT_TRUE(store->List().empty());
  EXPECT_EQ(store->used_bytes(), 0);
  EXPECT_EQ(FilesInDir(), 0);
  // The worker publishes again.
  EXPECT_NE(Publish(*store, Key(0), {1000}), nullptr);
}

// Issue 9, defect 8: a full tmpfs says so (it used to answer "Bad address").
// A real 1 MiB tmpfs is mounted for it, which needs root.
TEST(FullTmpfsTest, PublishOnAFullTmpfsIsResourceExhaustedSayingTheDeviceIsFull) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  char tmpl[] = "/tmp/reshard-full-tmpfs-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_EQ(std::system(("mount -t tmpfs -o size=1m reshard-test " + dir).c_str()), 0);
  {
    ShardStore::Options o;
    o.shm_dir = dir;
    o.host_id = "host-a";
    auto store = ShardStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status();
    RankBufferKey key{"job-1", 1, 0};
    auto created = (*store)->CreateAll({key}, {{4 << 20}}, ShardStore::Backing::kPrefaulted,
                                       ShardStore::Writer::kWorker);
    EXPECT_EQ(created.status().code(), absl::StatusCode::kResourceExhausted) << created.status();
    EXPECT_THAT(std::string(created.status().message()), HasSubstr("no space left on device"));
    EXPECT_EQ((*store)->used_bytes(), 0);
  }
  EXPECT_EQ(std::system(("umount " + dir).c_str()), 0);
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace reshard::agent
