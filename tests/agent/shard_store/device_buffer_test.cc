// Device memory as a memory kind of the shard store (device_buffer.h), on the
// fake device: layout and checksums equal to host buffers', the per-device
// memory limit, all-or-none creation, sealed immutability.
#include "agent/shard_store/device_buffer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/device/fake_device.h"
#include "store_fixture.h"

namespace reshard::agent {
namespace {

std::vector<uint8_t> Pattern(int64_t bytes, int seed) {
  std::vector<uint8_t> v(static_cast<size_t>(bytes));
  for (int64_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + i / 251);
  return v;
}

class DeviceBufferTest : public ShardStoreTest {
 protected:
  // 2 fake devices of 1 MiB each.
  DeviceBufferTest() : api_(FakeDeviceApi::Options{2, 1 << 20}) {}

  std::unique_ptr<DeviceBufferStore> OpenDevices(int64_t limit, int64_t staging) {
    DeviceBufferStore::Options o;
    o.memory_limit_bytes_per_device = limit;
    o.staging_bytes = staging;
    absl::StatusOr<std::unique_ptr<DeviceBufferStore>> s = DeviceBufferStore::Open(&api_, o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  FakeDeviceApi api_;
};

TEST_F(DeviceBufferTest, SealsToTheChecksumsOfAHostBufferWithTheSameBytes) {
  // Items that span several 4000-byte staging chunks, an empty one, and
  // sizes that are not multiples of the chunk or of 64.
  const std::vector<int64_t> items = {1000, 0, 70001, 64, 8000};
  std::unique_ptr<DeviceBufferStore> devices = OpenDevices(0, 4000);
  ASSERT_NE(devices, nullptr);
  EXPECT_EQ(devices->limit_bytes(1), 1 << 20);  // 0: the device's memory
  absl::StatusOr<std::vector<DeviceRankBufferPtr>> made =
      devices->CreateAll({Key(0)}, {1}, {items});
  ASSERT_TRUE(made.ok()) << made.status();
  const DeviceRankBuffer& d = *(*made)[0];
  EXPECT_EQ(d.device(), 1);
  EXPECT_EQ(d.memory_kind(), MemoryKind::kCuda);
  EXPECT_EQ(api_.used_bytes(1), d.size());
  EXPECT_EQ(devices->used_bytes(1), d.size());

  std::unique_ptr<ShardStore> host = OpenStore();
  ASSERT_NE(host, nullptr);
  absl::StatusOr<std::vector<RankBufferPtr>> h = host->CreateAll({Key(0)}, {items});
  ASSERT_TRUE(h.ok()) << h.status();
  RankBuffer& hb = *(*h)[0];
  // The same layout as the host buffer: 64-byte aligned items, same size.
  ASSERT_EQ(d.items().size(), hb.items().size());
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(d.items()[i].offset, hb.items()[i].offset) << i;
    EXPECT_EQ(d.items()[i].offset % kItemAlignment, 0) << i;
  }
  EXPECT_EQ(d.size(), hb.size());

  std::vector<uint64_t> direct;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::vector<uint8_t> bytes = Pattern(items[i], static_cast<int>(i) * 31 + 1);
    // Item 2 in two writes, to an offset within the item.
    if (i == 2) {
      ASSERT_TRUE(devices->WriteItem(Key(0), 2, 0, bytes.data(), 30000).ok());
      ASSERT_TRUE(devices->WriteItem(Key(0), 2, 30000, bytes.data() + 30000, 40001).ok());
    } else {
      ASSERT_TRUE(devices->WriteItem(Key(0), static_cast<int>(i), 0, bytes.data(), items[i]).ok());
    }
    std::copy(bytes.begin(), bytes.end(), hb.item_data(static_cast<int>(i)));
    direct.push_back(Checksum(bytes.data(), bytes.size()));
    std::vector<uint8_t> back(bytes.size());
    ASSERT_TRUE(
        devices->ReadItem(Key(0), static_cast<int>(i), 0, back.data(), items[i]).ok());
    EXPECT_EQ(back, bytes) << i;
  }
  absl::StatusOr<std::vector<uint64_t>> device_sums = devices->Seal(Key(0), {});
  ASSERT_TRUE(device_sums.ok()) << device_sums.status();
  absl::StatusOr<std::vector<uint64_t>> host_sums = host->Seal(Key(0), {});
  ASSERT_TRUE(host_sums.ok()) << host_sums.status();
  EXPECT_EQ(*device_sums, *host_sums);
  EXPECT_EQ(*device_sums, direct);
  EXPECT_TRUE(d.sealed());
  EXPECT_EQ(d.checksums(), direct);
  // One changed byte changes its item's checksum, and only that one.
  ASSERT_TRUE(devices->CreateAll({Key(1)}, {0}, {items}).ok());
  for (size_t i = 0; i < items.size(); ++i) {
    std::vector<uint8_t> bytes = Pattern(items[i], static_cast<int>(i) * 31 + 1);
    if (i == 2) bytes[69999] ^= 1;  // in the last staging chunk of item 2
    ASSERT_TRUE(devices->WriteItem(Key(1), static_cast<int>(i), 0, bytes.data(), items[i]).ok());
  }
  absl::StatusOr<std::vector<uint64_t>> changed = devices->Seal(Key(1), {});
  ASSERT_TRUE(changed.ok()) << changed.status();
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ((*changed)[i] == direct[i], i != 2) << i;
  }
}

TEST_F(DeviceBufferTest, SealsStageThroughPinnedMemoryRegisteredOnce) {
  // Each seal hashes through two staging chunks of pinned host memory; the
  // store registers them once (cudaMallocHost costs more than the copy),
  // whatever the number of seals.
  const std::vector<int64_t> items = {70001, 64};
  std::unique_ptr<DeviceBufferStore> devices = OpenDevices(0, 4000);
  ASSERT_NE(devices, nullptr);
  for (int rank = 0; rank < 5; ++rank) {
    ASSERT_TRUE(devices->CreateAll({Key(rank)}, {rank % 2}, {items}).ok());
    for (size_t i = 0; i < items.size(); ++i) {
      std::vector<uint8_t> bytes = Pattern(items[i], rank * 13 + static_cast<int>(i));
      ASSERT_TRUE(
          devices->WriteItem(Key(rank), static_cast<int>(i), 0, bytes.data(), items[i]).ok());
    }
    absl::StatusOr<std::vector<uint64_t>> sums = devices->Seal(Key(rank), {});
    ASSERT_TRUE(sums.ok()) << sums.status();
    EXPECT_EQ((*sums)[0], Checksum(Pattern(items[0], rank * 13).data(), items[0])) << rank;
  }
  EXPECT_EQ(api_.host_registrations(), 2);
  EXPECT_EQ(devices->pinned().registrations(), 2);
  EXPECT_EQ(devices->pinned().idle_bytes(), 2 * PinnedHostPool::kMinBlock);
}

TEST_F(DeviceBufferTest, KeepingNoPinnedMemoryRegistersPerSeal) {
  DeviceBufferStore::Options o;
  o.staging_bytes = 4000;
  o.pinned_keep_bytes = 0;
  absl::StatusOr<std::unique_ptr<DeviceBufferStore>> devices = DeviceBufferStore::Open(&api_, o);
  ASSERT_TRUE(devices.ok()) << devices.status();
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE((*devices)->CreateAll({Key(rank)}, {0}, {{5000}}).ok());
    ASSERT_TRUE((*devices)->Seal(Key(rank), {}).ok());
  }
  EXPECT_EQ(api_.host_registrations(), 6);
  o.pinned_keep_bytes = -1;
  absl::StatusOr<std::unique_ptr<DeviceBufferStore>> bad = DeviceBufferStore::Open(&api_, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_NE(bad.status().message().find("pinned_keep_bytes -1"), std::string::npos) << bad.status();
}

TEST_F(DeviceBufferTest, TheMemoryLimitCountsDeviceBytesPerDevice) {
  std::unique_ptr<DeviceBufferStore> devices = OpenDevices(64 << 10, 1 << 20);
  ASSERT_NE(devices, nullptr);
  // 2 x 40 KiB on device 0 do not fit its 64 KiB: nothing is made.
  absl::StatusOr<std::vector<DeviceRankBufferPtr>> over =
      devices->CreateAll({Key(0), Key(1)}, {0, 0}, {{40 << 10}, {40 << 10}});
  ASSERT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
  EXPECT_NE(over.status().message().find("device 0: 2 buffer(s) of job \"job-1\" generation 1 "
                                         "need 80.0 KiB there, 64.0 KiB free"),
            std::string::npos)
      << over.status();
  EXPECT_TRUE(devices->List().empty());
  EXPECT_EQ(devices->used_bytes(0), 0);
  EXPECT_EQ(api_.used_bytes(0), 0);
  // One on each device fits.
  absl::StatusOr<std::vector<DeviceRankBufferPtr>> split =
      devices->CreateAll({Key(0), Key(1)}, {0, 1}, {{40 << 10}, {40 << 10}});
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(devices->used_bytes(0), 40 << 10);
  EXPECT_EQ(devices->used_bytes(1), 40 << 10);
  absl::StatusOr<std::vector<DeviceRankBufferPtr>> more =
      devices->CreateAll({Key(2)}, {1}, {{30 << 10}});
  ASSERT_TRUE(absl::IsResourceExhausted(more.status())) << more.status();
  EXPECT_NE(more.status().message().find("device 1:"), std::string::npos) << more.status();
  ASSERT_TRUE(devices->CreateAll({Key(2)}, {0}, {{24 << 10}}).ok());  // exactly full
  EXPECT_EQ(devices->used_bytes(0), 64 << 10);
  EXPECT_TRUE(absl::IsAlreadyExists(devices->CreateAll({Key(2)}, {1}, {{64}}).status()));
  // Dropped buffers give their bytes back when the last user lets go.
  devices->DropGeneration("job-1", 1);
  EXPECT_TRUE(devices->List().empty());
  EXPECT_EQ(devices->used_bytes(1), 40 << 10);  // `split` still holds them
  split->clear();
  EXPECT_EQ(devices->used_bytes(0), 0);
  EXPECT_EQ(devices->used_bytes(1), 0);
  EXPECT_EQ(api_.used_bytes(0), 0);
  EXPECT_EQ(api_.used_bytes(1), 0);
}

TEST_F(DeviceBufferTest, ConcurrentCreationsNeverPassTheLimit) {
  // 8 threads each want 16 KiB of device 0's 64 KiB: exactly 4 get it.
  std::unique_ptr<DeviceBufferStore> devices = OpenDevices(64 << 10, 1 << 20);
  ASSERT_NE(devices, nullptr);
  std::vector<absl::Status> results(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      results[i] = devices->CreateAll({Key(i)}, {0}, {{16 << 10}}).status();
    });
  }
  for (std::thread& t : threads) t.join();
  int made = 0;
  for (const absl::Status& s : results) {
    if (s.ok()) {
      ++made;
    } else {
      EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
    }
  }
  EXPECT_EQ(made, 4);
  EXPECT_EQ(devices->List().size(), 4u);
  EXPECT_EQ(devices->used_bytes(0), 64 << 10);
  EXPECT_EQ(api_.used_bytes(0), 64 << 10);
}

TEST_F(DeviceBufferTest, ADeviceThatRunsOutFailsTheWholeCreation) {
  // The limit allows more than the fake device holds: its cudaMalloc fails.
  std::unique_ptr<DeviceBufferStore> devices = OpenDevices(4 << 20, 1 << 20);
  ASSERT_NE(devices, nullptr);
  absl::StatusOr<std::vector<DeviceRankBufferPtr>> made = devices->CreateAll(
      {Key(0), Key(1), Key(2)}, {0, 0, 0}, {{512 << 10}, {256 << 10}, {512 << 10}});
  ASSERT_TRUE(absl::IsResourceExhausted(made.status())) << made.status();
  EXPECT_NE(made.status().message().find("cudaMalloc (fake device 0, 524288 bytes)"),
            std::string::npos)
      << made.status();
  EXPECT_TRUE(devices->List().empty());
  EXPECT_EQ(devices->used_bytes(0), 0);
  EXPECT_EQ(api_.used_bytes(0), 0);
}

// A fake device whose host-to-device copies wait, once armed, until released.
class GatedFakeDevice : public FakeDeviceApi {
 public:
  GatedFakeDevice() : FakeDeviceApi(Options{}) {}
  void Arm() { armed_ = true; }
  void WaitUntilEntered() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return entered_; });
  }
  void Release() {
    std::lock_guard<std::mutex> l(mu_);
    released_ = true;
    cv_.notify_all();
  }
  absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes, CopyKind kind,
                           DeviceStream stream) override {
    if (kind == CopyKind::kHostToDevice && armed_) {
      std::unique_lock<std::mutex> l(mu_);
      entered_ = true;
      cv_.notify_all();
      cv_.wait(l, [this] { return released_; });
    }
    return FakeDeviceApi::MemcpyAsync(dst, src, bytes, kind, stream);
  }

 private:
  std::atomic<bool> armed_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool entered_ = false;
  bool released_ = false;
};

TEST_F(DeviceBufferTest, SealRefusesWhileAWriteIsInFlight) {
  GatedFakeDevice gated;
  absl::StatusOr<std::unique_ptr<DeviceBufferStore>> devices =
      DeviceBufferStore::Open(&gated, DeviceBufferStore::Options{});
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_TRUE((*devices)->CreateAll({Key(0)}, {0}, {{4096}}).ok());
  const std::vector<uint8_t> bytes = Pattern(4096, 3);
  gated.Arm();
  absl::Status written;
  std::thread writer(
      [&] { written = (*devices)->WriteItem(Key(0), 0, 0, bytes.data(), 4096); });
  gated.WaitUntilEntered();
  absl::StatusOr<std::vector<uint64_t>> early = (*devices)->Seal(Key(0), {});
  EXPECT_TRUE(absl::IsFailedPrecondition(early.status())) << early.status();
  EXPECT_NE(early.status().message().find("is being written by 1 call(s)"), std::string::npos)
      << early.status();
  gated.Release();
  writer.join();
  ASSERT_TRUE(written.ok()) << written;
  absl::StatusOr<std::vector<uint64_t>> sealed = (*devices)->Seal(Key(0), {});
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  EXPECT_EQ(*sealed, std::vector<uint64_t>{Checksum(bytes.data(), bytes.size())});
}

TEST_F(DeviceBufferTest, ASealedBufferIsImmutable) {
  std::unique_ptr<DeviceBufferStore> devices = OpenDevices(0, 1 << 20);
  ASSERT_NE(devices, nullptr);
  const RankBufferKey key = Key(3, 7, "job-x");
  ASSERT_TRUE(devices->CreateAll({key}, {0}, {{100, 200}}).ok());
  const std::vector<uint8_t> a = Pattern(100, 1), b = Pattern(200, 2);
  ASSERT_TRUE(devices->WriteItem(key, 0, 0, a.data(), 100).ok());
  ASSERT_TRUE(devices->WriteItem(key, 1, 0, b.data(), 200).ok());
  const std::vector<uint64_t> sums = {Checksum(a.data(), 100), Checksum(b.data(), 200)};
  // A wrong expectation fails the seal and leaves the buffer writable.
  absl::StatusOr<std::vector<uint64_t>> wrong = devices->Seal(key, {sums[0], sums[1] + 1});
  ASSERT_TRUE(absl::IsDataLoss(wrong.status())) << wrong.status();
  EXPECT_NE(wrong.status().message().find("item 1"), std::string::npos) << wrong.status();
  EXPECT_FALSE((*devices->Get(key))->sealed());
  ASSERT_TRUE(devices->WriteItem(key, 1, 0, b.data(), 200).ok());

  absl::StatusOr<std::vector<uint64_t>> sealed = devices->Seal(key, sums);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  EXPECT_EQ(*sealed, sums);
  const std::vector<uint8_t> other = Pattern(100, 9);
  absl::Status write = devices->WriteItem(key, 0, 0, other.data(), 100);
  ASSERT_TRUE(absl::IsFailedPrecondition(write)) << write;
  EXPECT_NE(write.message().find("job \"job-x\" generation 7 rank 3 is sealed"),
            std::string::npos)
      << write;
  std::vector<uint8_t> back(100);
  ASSERT_TRUE(devices->ReadItem(key, 0, 0, back.data(), 100).ok());
  EXPECT_EQ(back, a);
  // Sealing again returns the same checksums, or DataLoss for others.
  EXPECT_EQ(*devices->Seal(key, {}), sums);
  EXPECT_TRUE(absl::IsDataLoss(devices->Seal(key, {sums[1], sums[0]}).status()));
  // Out of range and unknown buffers.
  EXPECT_TRUE(absl::IsOutOfRange(devices->ReadItem(key, 1, 150, back.data(), 51)));
  EXPECT_TRUE(absl::IsOutOfRange(devices->ReadItem(key, 2, 0, back.data(), 1)));
  EXPECT_TRUE(absl::IsNotFound(devices->Seal(Key(0), {}).status()));
}

}  // namespace
}  // namespace reshard::agent
