// The GPU path (built only with RESHARD_CUDA); skipped without a CUDA device.
#include "agent/transfer/nccl_transport.h"

#include <gtest/gtest.h>

#include <vector>

namespace reshard::agent {
namespace {

TEST(NcclTransportTest, AllocateWithoutDeviceIsUnavailable) {
  if (NcclDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_TRUE(absl::IsUnavailable(DeviceBuffer::Allocate(0, 1024).status()));
}

TEST(NcclTransportTest, PeerCopyMovesBytes) {
  const int n = NcclDeviceCount();
  if (n == 0) GTEST_SKIP() << "no CUDA device";
  const int dst_device = n > 1 ? 1 : 0;
  constexpr size_t kBytes = size_t{64} << 20;
  std::vector<uint8_t> host(kBytes), back(kBytes, 0);
  for (size_t i = 0; i < kBytes; ++i) host[i] = static_cast<uint8_t>(i * 131 + 7);
  auto src = DeviceBuffer::Allocate(0, kBytes);
  ASSERT_TRUE(src.ok()) << src.status();
  auto dst = DeviceBuffer::Allocate(dst_device, kBytes);
  ASSERT_TRUE(dst.ok()) << dst.status();
  ASSERT_TRUE(src->CopyFromHost(host.data(), kBytes).ok());
  absl::Status s = NcclPeerCopy(*src, &*dst, kBytes);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(dst->CopyToHost(back.data(), kBytes).ok());
  EXPECT_TRUE(host == back);
}

}  // namespace
}  // namespace reshard::agent
