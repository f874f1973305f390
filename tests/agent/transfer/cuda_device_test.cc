// The device API over the CUDA runtime (cuda_device.h). Built with CUDA;
// without a device every test skips, saying why (CudaLibraries' reason). On
// a GPU machine (issue 23's device check) it runs the same contract the fake
// device's tests check: copies in stream order, exact bytes back, capacity
// errors as ResourceExhausted, and IPC into a real child process
// (transfer_device_peer with the "cuda" device API).
#include "agent/device/cuda_device.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "agent/device/cuda_libraries.h"
#include "device_peer.h"

namespace reshard::agent {
namespace {

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<DeviceApi>> api = CudaDeviceApi::Create();
    if (!api.ok()) GTEST_SKIP() << api.status().message();
    api_ = *std::move(api);
  }
  std::unique_ptr<DeviceApi> api_;
};

TEST(CudaDeviceCreateTest, FailsExactlyWhenNoDeviceIsVisible) {
  absl::StatusOr<std::unique_ptr<DeviceApi>> api = CudaDeviceApi::Create();
  EXPECT_EQ(api.ok(), CudaLibraries::Get().state().device_count > 0) << api.status();
  if (!api.ok()) {
    EXPECT_TRUE(absl::IsFailedPrecondition(api.status())) << api.status();
    EXPECT_TRUE(absl::IsFailedPrecondition(MakeDeviceApi("cuda").status()));
    EXPECT_EQ(*MakeDeviceApi(""), nullptr);  // no device: no device API
  } else {
    EXPECT_EQ((*MakeDeviceApi(""))->capabilities().name, "cuda");
  }
}

TEST_F(CudaDeviceTest, CopiesRoundTripInStreamOrder) {
  constexpr size_t kBytes = (8 << 20) + 77;
  absl::StatusOr<void*> a = api_->Malloc(0, kBytes);
  absl::StatusOr<void*> b = api_->Malloc(0, kBytes);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*a) % kDeviceAlignment, 0u);
  absl::StatusOr<DeviceStream> s = api_->CreateStream(0);
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<void*> pinned = api_->MallocHost(kBytes);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  auto* host = static_cast<uint8_t*>(*pinned);
  for (size_t i = 0; i < kBytes; ++i) host[i] = static_cast<uint8_t>(i * 7 + 3);
  std::vector<uint8_t> expected(host, host + kBytes);
  for (int i = 100; i < 200; ++i) expected[i] = 0x5A;
  ASSERT_TRUE(api_->MemcpyAsync(*a, host, kBytes, CopyKind::kHostToDevice, *s).ok());
  ASSERT_TRUE(api_->MemsetAsync(static_cast<uint8_t*>(*a) + 100, 0x5A, 100, *s).ok());
  ASSERT_TRUE(api_->MemcpyAsync(*b, *a, kBytes, CopyKind::kDeviceToDevice, *s).ok());
  std::vector<uint8_t> back(kBytes);
  ASSERT_TRUE(api_->MemcpyAsync(back.data(), *b, kBytes, CopyKind::kDeviceToHost, *s).ok());
  ASSERT_TRUE(api_->StreamSynchronize(*s).ok());
  EXPECT_EQ(back, expected);
  ASSERT_TRUE(api_->DestroyStream(*s).ok());
  ASSERT_TRUE(api_->FreeHost(*pinned).ok());
  ASSERT_TRUE(api_->Free(0, *a).ok());
  ASSERT_TRUE(api_->Free(0, *b).ok());
}

TEST_F(CudaDeviceTest, AnAllocationBeyondTheDeviceIsResourceExhausted) {
  absl::StatusOr<DeviceMemoryInfo> info = api_->MemoryInfo(0);
  ASSERT_TRUE(info.ok()) << info.status();
  absl::StatusOr<void*> p = api_->Malloc(0, static_cast<size_t>(info->total_bytes) * 2);
  EXPECT_TRUE(absl::IsResourceExhausted(p.status())) << p.status();
  // The error is cleared: the next call works.
  absl::StatusOr<void*> q = api_->Malloc(0, 1024);
  ASSERT_TRUE(q.ok()) << q.status();
  ASSERT_TRUE(api_->Free(0, *q).ok());
}

TEST_F(CudaDeviceTest, IpcHandlesHave64Bytes) {
  absl::StatusOr<void*> p = api_->Malloc(0, 1 << 20);
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<std::string> h = api_->IpcExport(0, *p);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->size(), 64u);
  EXPECT_TRUE(absl::IsInvalidArgument(api_->IpcOpen(0, "short").status()));
  ASSERT_TRUE(api_->Free(0, *p).ok());
}

TEST_F(CudaDeviceTest, IpcIntoAChildProcess) {
  constexpr size_t kBytes = (4 << 20) + 5;
  absl::StatusOr<void*> dev = api_->Malloc(0, kBytes);
  ASSERT_TRUE(dev.ok()) << dev.status();
  absl::StatusOr<DeviceStream> s = api_->CreateStream(0);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<uint8_t> ours = PeerPattern(kBytes, 21);
  ASSERT_TRUE(api_->MemcpyAsync(*dev, ours.data(), kBytes, CopyKind::kHostToDevice, *s).ok());
  ASSERT_TRUE(api_->StreamSynchronize(*s).ok());
  absl::StatusOr<std::string> handle = api_->IpcExport(0, *dev);
  ASSERT_TRUE(handle.ok()) << handle.status();
  // The child checks our bytes, then writes its own through the handle.
  ASSERT_EQ(RunDevicePeer("cuda", *handle, kBytes, 21, 77), 0);
  std::vector<uint8_t> back(kBytes);
  ASSERT_TRUE(api_->MemcpyAsync(back.data(), *dev, kBytes, CopyKind::kDeviceToHost, *s).ok());
  ASSERT_TRUE(api_->StreamSynchronize(*s).ok());
  EXPECT_EQ(back, PeerPattern(kBytes, 77));
  ASSERT_TRUE(api_->DestroyStream(*s).ok());
  ASSERT_TRUE(api_->Free(0, *dev).ok());
}

}  // namespace
}  // namespace reshard::agent
