// The fake device (fake_device.h): stream ordering, capacity, alignment,
// device memory that the host cannot touch, IPC into a real child process
// (transfer_device_peer), and the factory ($RESHARD_DEVICE).
#include "agent/device/fake_device.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "agent/device/device_api.h"
#include "device_peer.h"

namespace reshard::agent {
namespace {

std::vector<uint8_t> Pattern(size_t bytes, int seed) { return PeerPattern(bytes, seed); }

class FakeDeviceTest : public ::testing::Test {
 protected:
  FakeDeviceTest() : api_(FakeDeviceApi::Options{2, 1 << 20}) {}
  void SetUp() override {
    absl::StatusOr<DeviceStream> s = api_.CreateStream(0);
    ASSERT_TRUE(s.ok()) << s.status();
    stream_ = *s;
  }
  void TearDown() override { EXPECT_TRUE(api_.DestroyStream(stream_).ok()); }
  void* Alloc(int device, size_t bytes) {
    absl::StatusOr<void*> p = api_.Malloc(device, bytes);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : nullptr;
  }
  // Copies and waits: `host` may be a temporary.
  void ToDevice(void* dev, const std::vector<uint8_t>& host) {
    ASSERT_TRUE(
        api_.MemcpyAsync(dev, host.data(), host.size(), CopyKind::kHostToDevice, stream_).ok());
    ASSERT_TRUE(api_.StreamSynchronize(stream_).ok());
  }
  std::vector<uint8_t> FromDevice(const void* dev, size_t bytes) {
    std::vector<uint8_t> host(bytes);
    EXPECT_TRUE(api_.MemcpyAsync(host.data(), dev, bytes, CopyKind::kDeviceToHost, stream_).ok());
    EXPECT_TRUE(api_.StreamSynchronize(stream_).ok());
    return host;
  }

  FakeDeviceApi api_;
  DeviceStream stream_;
};

TEST_F(FakeDeviceTest, AnAsyncCopyIsNotVisibleBeforeSynchronize) {
  void* dev = Alloc(0, 4096);
  ToDevice(dev, Pattern(4096, 1));
  ASSERT_TRUE(api_.StreamSynchronize(stream_).ok());
  std::function<void()> release = api_.HoldStream(stream_);
  std::vector<uint8_t> host(4096, 0xEE);
  ASSERT_TRUE(api_.MemcpyAsync(host.data(), dev, 4096, CopyKind::kDeviceToHost, stream_).ok());
  // Queued behind the hold: the call returned, the bytes have not moved.
  EXPECT_EQ(host, std::vector<uint8_t>(4096, 0xEE));
  release();
  ASSERT_TRUE(api_.StreamSynchronize(stream_).ok());
  EXPECT_EQ(host, Pattern(4096, 1));
  ASSERT_TRUE(api_.Free(0, dev).ok());
}

TEST_F(FakeDeviceTest, OneStreamRunsItsCopiesInOrder) {
  void* dev = Alloc(0, 8192);
  std::function<void()> release = api_.HoldStream(stream_);
  const std::vector<uint8_t> first = Pattern(8192, 3), second = Pattern(8192, 90);
  ASSERT_TRUE(api_.MemcpyAsync(dev, first.data(), 8192, CopyKind::kHostToDevice, stream_).ok());
  std::vector<uint8_t> between(8192, 0);
  ASSERT_TRUE(api_.MemcpyAsync(between.data(), dev, 8192, CopyKind::kDeviceToHost, stream_).ok());
  ASSERT_TRUE(api_.MemcpyAsync(dev, second.data(), 8192, CopyKind::kHostToDevice, stream_).ok());
  ASSERT_TRUE(api_.MemsetAsync(static_cast<uint8_t*>(dev) + 100, 0x5A, 10, stream_).ok());
  release();
  ASSERT_TRUE(api_.StreamSynchronize(stream_).ok());
  // The read queued between the two writes saw the first one only; the
  // memset queued last landed on the second.
  EXPECT_EQ(between, first);
  std::vector<uint8_t> expected = second;
  for (int i = 100; i < 110; ++i) expected[i] = 0x5A;
  EXPECT_EQ(FromDevice(dev, 8192), expected);
}

TEST_F(FakeDeviceTest, StreamsRunIndependently) {
  // A held stream keeps its own work back, not another stream's.
  absl::StatusOr<DeviceStream> other = api_.CreateStream(0);
  ASSERT_TRUE(other.ok()) << other.status();
  void* dev = Alloc(0, 256);
  std::function<void()> release = api_.HoldStream(stream_);
  std::vector<uint8_t> held(256, 0), free_running(256, 0);
  const std::vector<uint8_t> bytes = Pattern(256, 40);
  ASSERT_TRUE(api_.MemcpyAsync(dev, bytes.data(), 256, CopyKind::kHostToDevice, *other).ok());
  ASSERT_TRUE(
      api_.MemcpyAsync(free_running.data(), dev, 256, CopyKind::kDeviceToHost, *other).ok());
  ASSERT_TRUE(api_.MemcpyAsync(held.data(), dev, 256, CopyKind::kDeviceToHost, stream_).ok());
  ASSERT_TRUE(api_.StreamSynchronize(*other).ok());
  EXPECT_EQ(free_running, bytes);
  EXPECT_EQ(held, std::vector<uint8_t>(256, 0));
  release();
  ASSERT_TRUE(api_.StreamSynchronize(stream_).ok());
  EXPECT_EQ(held, bytes);
  ASSERT_TRUE(api_.DestroyStream(*other).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(api_.StreamSynchronize(*other)));  // destroyed
}

TEST_F(FakeDeviceTest, DeviceToDeviceAndPeerCopies) {
  void* a = Alloc(0, 1000);
  void* b = Alloc(0, 1000);
  void* c = Alloc(1, 1000);
  ToDevice(a, Pattern(1000, 5));
  ASSERT_TRUE(api_.MemcpyAsync(b, a, 1000, CopyKind::kDeviceToDevice, stream_).ok());
  ASSERT_TRUE(api_.MemcpyPeerAsync(c, 1, b, 0, 1000, stream_).ok());
  // A plain D2D copy into another device's memory is refused: use the peer copy.
  absl::Status cross = api_.MemcpyAsync(c, a, 1000, CopyKind::kDeviceToDevice, stream_);
  EXPECT_TRUE(absl::IsInvalidArgument(cross)) << cross;
  ASSERT_TRUE(api_.MemcpyPeerAsync(a, 0, c, 1, 1000, stream_).ok());
  EXPECT_EQ(FromDevice(a, 1000), Pattern(1000, 5));
  EXPECT_EQ(FromDevice(b, 1000), Pattern(1000, 5));
}

TEST_F(FakeDeviceTest, CapacityIsPerDeviceAndExhaustionIsResourceExhausted) {
  EXPECT_EQ(api_.MemoryInfo(0)->free_bytes, 1 << 20);
  void* big = Alloc(0, (1 << 20) - 256);
  EXPECT_EQ(api_.MemoryInfo(0)->free_bytes, 256);
  absl::StatusOr<void*> over = api_.Malloc(0, 257);
  ASSERT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
  EXPECT_NE(over.status().message().find("fake device 0, 257 bytes"), std::string::npos)
      << over.status();
  // 1 byte is charged as 256 (the alignment): it fits exactly.
  void* last = Alloc(0, 1);
  EXPECT_EQ(api_.MemoryInfo(0)->free_bytes, 0);
  // Device 1 has its own capacity.
  void* other = Alloc(1, 1 << 20);
  ASSERT_TRUE(api_.Free(0, big).ok());
  EXPECT_EQ(api_.MemoryInfo(0)->free_bytes, (1 << 20) - 256);
  EXPECT_TRUE(absl::IsInvalidArgument(api_.Free(0, other)));  // device 1's
  ASSERT_TRUE(api_.Free(0, last).ok());
  ASSERT_TRUE(api_.Free(1, other).ok());
  EXPECT_EQ(api_.used_bytes(0), 0);
  EXPECT_EQ(api_.used_bytes(1), 0);
  EXPECT_TRUE(absl::IsInvalidArgument(api_.Malloc(2, 16).status()));
}

TEST_F(FakeDeviceTest, AllocationsAreAlignedTo256Bytes) {
  std::vector<void*> ptrs;
  for (size_t bytes : {1, 3, 255, 257, 4097, 10000}) {
    void* p = Alloc(0, bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kDeviceAlignment, 0u) << bytes;
    ptrs.push_back(p);
  }
  EXPECT_EQ(api_.used_bytes(0), 256 + 256 + 256 + 512 + 4352 + 10240);
  for (void* p : ptrs) ASSERT_TRUE(api_.Free(0, p).ok());
}

TEST_F(FakeDeviceTest, CopiesOutsideDeviceMemoryAreRefused) {
  void* dev = Alloc(0, 512);
  std::vector<uint8_t> host(1024);
  // Past the allocation's end.
  EXPECT_TRUE(absl::IsInvalidArgument(
      api_.MemcpyAsync(dev, host.data(), 1024, CopyKind::kHostToDevice, stream_)));
  // Host memory where device memory is needed, and the other way round.
  EXPECT_TRUE(absl::IsInvalidArgument(
      api_.MemcpyAsync(host.data(), dev, 16, CopyKind::kHostToDevice, stream_)));
  EXPECT_TRUE(absl::IsInvalidArgument(
      api_.MemcpyAsync(dev, dev, 16, CopyKind::kDeviceToHost, stream_)));
}

TEST(FakeDeviceDeathTest, TheHostCannotDereferenceDeviceMemory) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  FakeDeviceApi api(FakeDeviceApi::Options{});
  absl::StatusOr<void*> dev = api.Malloc(0, 64);
  ASSERT_TRUE(dev.ok());
  EXPECT_DEATH(*static_cast<volatile uint8_t*>(*dev) = 1, "");
  EXPECT_DEATH((void)*static_cast<volatile uint8_t*>(*dev), "");
}

TEST_F(FakeDeviceTest, IpcOpenInTheSameProcessAliasesTheAllocation) {
  void* dev = Alloc(0, 3000);
  ToDevice(dev, Pattern(3000, 11));
  absl::StatusOr<std::string> handle = api_.IpcExport(0, dev);
  ASSERT_TRUE(handle.ok()) << handle.status();
  absl::StatusOr<void*> opened = api_.IpcOpen(0, *handle);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_NE(*opened, dev);
  EXPECT_EQ(FromDevice(*opened, 3000), Pattern(3000, 11));
  ToDevice(*opened, Pattern(3000, 12));
  EXPECT_EQ(FromDevice(dev, 3000), Pattern(3000, 12));
  EXPECT_EQ(api_.used_bytes(0), 3072);  // the opened mapping is not charged
  EXPECT_TRUE(absl::IsInvalidArgument(api_.Free(0, *opened)));
  ASSERT_TRUE(api_.IpcClose(0, *opened).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(api_.IpcClose(0, *opened)));
  EXPECT_TRUE(absl::IsInvalidArgument(api_.IpcOpen(0, "not a handle").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      api_.IpcExport(0, static_cast<uint8_t*>(dev) + 256).status()));  // not a base
}

// The agent opens a handle's /proc/<pid>/fd/<fd> with its own rights, so a
// handle must not be a way to read what some process holds open: only a
// memfd (what a fake allocation is) is opened, and a handle a worker sends
// must name the worker's own process. Before, a handle naming any process's
// descriptor of a root-only file was opened, mapped and read.
TEST_F(FakeDeviceTest, AHandleOpensOnlyAMemfdOfTheCallersOwnProcess) {
  char path[] = "/tmp/reshard-fake-ipc-secret-XXXXXX";
  const int secret = mkstemp(path);
  ASSERT_GE(secret, 0);
  ASSERT_EQ(fchmod(secret, 0600), 0);
  const std::string bytes(4096, 's');
  ASSERT_EQ(write(secret, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  unlink(path);
  const std::string pid = std::to_string(getpid());
  const std::string file_handle = "fake-ipc " + pid + " " + std::to_string(secret) + " 0 4096";
  const std::string where = "cudaIpcOpenMemHandle (fake device 0, 4096 bytes): /proc/" + pid +
                            "/fd/" + std::to_string(secret) +
                            " is not a memfd (a fake device allocation is one); nothing was read";
  EXPECT_EQ(api_.IpcOpen(0, file_handle).status(), absl::PermissionDeniedError(where));
  EXPECT_EQ(api_.IpcOpenFrom(0, file_handle, getpid()).status(),
            absl::PermissionDeniedError(where));
  close(secret);

  void* dev = Alloc(0, 3000);
  ToDevice(dev, Pattern(3000, 5));
  absl::StatusOr<std::string> handle = api_.IpcExport(0, dev);
  ASSERT_TRUE(handle.ok()) << handle.status();
  // A memfd of another process than the caller's: refused before opening.
  absl::StatusOr<void*> other = api_.IpcOpenFrom(0, *handle, getpid() + 1);
  EXPECT_TRUE(absl::IsPermissionDenied(other.status())) << other.status();
  EXPECT_NE(other.status().message().find("the handle names process " + pid), std::string::npos)
      << other.status();
  EXPECT_TRUE(absl::IsPermissionDenied(api_.IpcOpenFrom(0, *handle, 0).status()));
  // The caller's own memfd opens.
  absl::StatusOr<void*> own = api_.IpcOpenFrom(0, *handle, getpid());
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(FromDevice(*own, 3000), Pattern(3000, 5));
  ASSERT_TRUE(api_.IpcClose(0, *own).ok());
}

TEST_F(FakeDeviceTest, AllocationSizeIsTheBytesToTheAllocationsEnd) {
  uint8_t* dev = static_cast<uint8_t*>(Alloc(0, 3000));
  absl::StatusOr<size_t> size = api_.AllocationSize(0, dev);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, 3000u);
  size = api_.AllocationSize(0, dev + 2999);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, 1u);
  // An IPC-opened mapping has the exported allocation's size.
  absl::StatusOr<std::string> handle = api_.IpcExport(0, dev);
  ASSERT_TRUE(handle.ok()) << handle.status();
  absl::StatusOr<void*> opened = api_.IpcOpen(0, *handle);
  ASSERT_TRUE(opened.ok()) << opened.status();
  size = api_.AllocationSize(0, static_cast<uint8_t*>(*opened) + 1000);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, 2000u);
  ASSERT_TRUE(api_.IpcClose(0, *opened).ok());
  // The end, another device, host memory, a closed mapping: in no allocation.
  EXPECT_TRUE(absl::IsInvalidArgument(api_.AllocationSize(0, dev + 3000).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(api_.AllocationSize(1, dev).status()));
  std::vector<uint8_t> host(16);
  EXPECT_TRUE(absl::IsInvalidArgument(api_.AllocationSize(0, host.data()).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(api_.AllocationSize(0, *opened).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(api_.AllocationSize(0, nullptr).status()));
}

TEST_F(FakeDeviceTest, IpcIntoAChildProcess) {
  constexpr size_t kBytes = (1 << 16) + 123;
  void* dev = Alloc(0, kBytes);
  ToDevice(dev, Pattern(kBytes, 21));
  ASSERT_TRUE(api_.StreamSynchronize(stream_).ok());
  absl::StatusOr<std::string> handle = api_.IpcExport(0, dev);
  ASSERT_TRUE(handle.ok()) << handle.status();
  // The child checks our bytes, then writes its own through the handle.
  ASSERT_EQ(RunDevicePeer("fake", *handle, kBytes, 21, 77), 0);
  EXPECT_EQ(FromDevice(dev, kBytes), Pattern(kBytes, 77));
  // A child that expects other bytes than the allocation holds says so.
  EXPECT_EQ(RunDevicePeer("fake", *handle, kBytes, 21, 1), 2);
  // After Free, the handle opens nothing.
  ASSERT_TRUE(api_.Free(0, dev).ok());
  EXPECT_EQ(RunDevicePeer("fake", *handle, kBytes, 1, 2), 1);
}

TEST(DeviceApiFactoryTest, SpecsPickTheApi) {
  absl::StatusOr<std::unique_ptr<DeviceApi>> fake = MakeDeviceApi("fake:3:4096");
  ASSERT_TRUE(fake.ok()) << fake.status();
  EXPECT_EQ((*fake)->capabilities().name, "fake");
  EXPECT_EQ((*fake)->capabilities().device_count, 3);
  EXPECT_EQ((*fake)->MemoryInfo(2)->total_bytes, 4096);
  EXPECT_EQ((*MakeDeviceApi("fake"))->capabilities().device_count, 1);
  EXPECT_EQ(*MakeDeviceApi("none"), nullptr);
  for (const char* bad : {"fake:0", "fake:x", "gpu", "fake:1:2:3", "fake:1:-5"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(MakeDeviceApi(bad).status())) << bad;
  }
#ifndef RESHARD_HAVE_CUDA
  EXPECT_TRUE(absl::IsFailedPrecondition(MakeDeviceApi("cuda").status()));
  EXPECT_EQ(*MakeDeviceApi(""), nullptr);
#endif
}

}  // namespace
}  // namespace reshard::agent
