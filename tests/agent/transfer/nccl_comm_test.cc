// The NCCL device communicator (nccl_comm.h) on real GPUs: a 1-rank
// communicator sending to itself in a group on one device, and two ranks
// (threads, one device each) when there are two devices, up to 64 MiB a
// message. Skips, saying why, without a loaded NCCL and CUDA device (the
// loader's reason); without a device, the factory is refused.
#include "agent/transfer/nccl_comm.h"

#include <gtest/gtest.h>

#include <future>
#include <string>
#include <vector>

#include "agent/device/cuda_libraries.h"
#include "agent/device/device_api.h"

namespace reshard::agent {
namespace {

std::vector<uint8_t> Pattern(size_t n, int seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + 11 * i);
  return v;
}

class NcclCommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    factory_ = MakeNcclCommFactory(&why);
    if (factory_ == nullptr) GTEST_SKIP() << why;
    absl::StatusOr<std::unique_ptr<DeviceApi>> api = MakeDeviceApi("cuda");
    if (!api.ok()) GTEST_SKIP() << api.status();
    api_ = *std::move(api);
    std::string why_not;
    auto f = MakeDeviceCommFactory(api_.get(), &why_not);
    ASSERT_NE(f, nullptr) << why_not;
    EXPECT_EQ(f->capabilities().name, "nccl");
  }
  // In one group on `comm`'s device: sends `n` bytes (Pattern(n, seed)) to
  // rank `to` and receives `n` from rank `from`; returns what arrived.
  absl::StatusOr<std::vector<uint8_t>> Exchange(DeviceComm& comm, size_t n, int to, int from,
                                                int seed) {
    const int d = comm.device();
    absl::StatusOr<DeviceStream> stream = api_->CreateStream(d);
    if (!stream.ok()) return stream.status();
    void* src = api_->Malloc(d, n).value();
    void* dst = api_->Malloc(d, n).value();
    const std::vector<uint8_t> bytes = Pattern(n, seed);
    std::vector<uint8_t> out(n);
    absl::Status s = api_->MemcpyAsync(src, bytes.data(), n, CopyKind::kHostToDevice, *stream);
    if (s.ok()) s = comm.GroupStart();
    if (s.ok()) s = comm.Send(src, n, to, *stream);
    if (s.ok()) s = comm.Recv(dst, n, from, *stream);
    if (s.ok()) s = comm.GroupEnd();
    if (s.ok()) s = api_->MemcpyAsync(out.data(), dst, n, CopyKind::kDeviceToHost, *stream);
    if (s.ok()) s = api_->StreamSynchronize(*stream);
    (void)api_->Free(d, src);
    (void)api_->Free(d, dst);
    (void)api_->DestroyStream(*stream);
    if (!s.ok()) return s;
    return out;
  }
  std::unique_ptr<DeviceCommFactory> factory_;
  std::unique_ptr<DeviceApi> api_;
};

TEST(NcclCommFactoryTest, WithoutADeviceThereIsNoCommunicator) {
  if (CudaLibraries::Get().state().device_count > 0) GTEST_SKIP() << "a CUDA device is present";
  std::string why;
  EXPECT_EQ(MakeNcclCommFactory(&why), nullptr);
  EXPECT_NE(why, "");
  EXPECT_TRUE(absl::IsFailedPrecondition(MakeDeviceApi("cuda").status()));
}

TEST_F(NcclCommTest, OneRankSendsToItselfInAGroup) {
  absl::StatusOr<std::string> id = factory_->NewId();
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->size(), 128u);
  absl::StatusOr<std::unique_ptr<DeviceComm>> comm = factory_->Init(*id, 1, 0, 0);
  ASSERT_TRUE(comm.ok()) << comm.status();
  for (size_t n : {size_t{1}, size_t{4097}, (size_t{1} << 22) + 5}) {
    absl::StatusOr<std::vector<uint8_t>> got = Exchange(**comm, n, 0, 0, static_cast<int>(n));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, Pattern(n, static_cast<int>(n))) << n << " bytes";
  }
}

TEST_F(NcclCommTest, SixtyFourMiBArriveWhole) {
  absl::StatusOr<std::unique_ptr<DeviceComm>> comm = factory_->Init(*factory_->NewId(), 1, 0, 0);
  ASSERT_TRUE(comm.ok()) << comm.status();
  constexpr size_t kBytes = size_t{64} << 20;
  absl::StatusOr<std::vector<uint8_t>> got = Exchange(**comm, kBytes, 0, 0, 7);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == Pattern(kBytes, 7));
}

TEST_F(NcclCommTest, TwoRanksOnTwoDevicesSwapBytes) {
  if (api_->capabilities().device_count < 2) {
    GTEST_SKIP() << "NCCL between two ranks needs two GPUs";
  }
  for (size_t n : {size_t{1} << 20, size_t{64} << 20}) {
    const std::string id = factory_->NewId().value();
    std::vector<std::future<absl::StatusOr<std::vector<uint8_t>>>> f;
    for (int r = 0; r < 2; ++r) {
      f.push_back(std::async(std::launch::async, [&, r]() -> absl::StatusOr<std::vector<uint8_t>> {
        absl::StatusOr<std::unique_ptr<DeviceComm>> comm = factory_->Init(id, 2, r, r);
        if (!comm.ok()) return comm.status();
        return Exchange(**comm, n, 1 - r, 1 - r, r);
      }));
    }
    for (int r = 0; r < 2; ++r) {
      absl::StatusOr<std::vector<uint8_t>> got = f[r].get();
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, Pattern(n, 1 - r)) << n << " bytes";
    }
  }
}

}  // namespace
}  // namespace reshard::agent
