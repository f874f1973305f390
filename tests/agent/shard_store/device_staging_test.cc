// Whole sealed rank buffers between host and device memory
// (device_staging.h), on the fake device: exact bytes and checksums both
// ways, the existing copy returned, NotFound and FailedPrecondition, and
// nothing left behind when the copy does not fit.
#include "agent/shard_store/device_staging.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "agent/device/fake_device.h"
#include "store_fixture.h"

namespace reshard::agent {
namespace {

class DeviceStagingTest : public ShardStoreTest {
 protected:
  DeviceStagingTest() : api_(FakeDeviceApi::Options{2, 1 << 20}) {}

  void SetUp() override {
    ShardStoreTest::SetUp();
    host_ = OpenStore();
    ASSERT_NE(host_, nullptr);
    DeviceBufferStore::Options o;
    o.staging_bytes = 5000;
    absl::StatusOr<std::unique_ptr<DeviceBufferStore>> d = DeviceBufferStore::Open(&api_, o);
    ASSERT_TRUE(d.ok()) << d.status();
    devices_ = *std::move(d);
  }

  // A sealed host buffer of `key` with patterned items.
  RankBufferPtr SealedHost(const RankBufferKey& key, const std::vector<int64_t>& items) {
    absl::StatusOr<std::vector<RankBufferPtr>> made = host_->CreateAll({key}, {items});
    EXPECT_TRUE(made.ok()) << made.status();
    if (!made.ok()) return nullptr;
    for (size_t i = 0; i < items.size(); ++i) {
      Fill(*(*made)[0], static_cast<int>(i), static_cast<uint8_t>(key.rank * 13 + i + 1));
    }
    EXPECT_TRUE(host_->Seal(key, {}).ok());
    return (*made)[0];
  }

  std::vector<uint8_t> DeviceItem(const RankBufferKey& key, int item, int64_t bytes) {
    std::vector<uint8_t> out(static_cast<size_t>(bytes));
    EXPECT_TRUE(devices_->ReadItem(key, item, 0, out.data(), bytes).ok());
    return out;
  }

  FakeDeviceApi api_;
  std::unique_ptr<ShardStore> host_;
  std::unique_ptr<DeviceBufferStore> devices_;
};

TEST_F(DeviceStagingTest, RoundTripKeepsBytesAndChecksums) {
  const std::vector<int64_t> items = {1000, 0, 70001, 64};
  RankBufferPtr original = SealedHost(Key(0), items);
  ASSERT_NE(original, nullptr);
  const std::vector<uint64_t> sums = original->checksums();

  absl::StatusOr<DeviceRankBufferPtr> d = StageToDevice(*host_, *devices_, Key(0), 1);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->device(), 1);
  EXPECT_TRUE((*d)->sealed());
  EXPECT_EQ((*d)->checksums(), sums);
  for (size_t i = 0; i < items.size(); ++i) {
    const std::vector<uint8_t> got = DeviceItem(Key(0), static_cast<int>(i), items[i]);
    EXPECT_EQ(0, items[i] == 0 ? 0
                               : std::memcmp(got.data(), original->item_data(static_cast<int>(i)),
                                             items[i]))
        << "item " << i;
  }

  // Back to host under another generation's store: drop the host original.
  original.reset();
  host_->Drop(Key(0));
  absl::StatusOr<RankBufferPtr> h = StageToHost(*devices_, *host_, Key(0));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE((*h)->sealed());
  EXPECT_EQ((*h)->checksums(), sums);
  for (size_t i = 0; i < items.size(); ++i) {
    const uint8_t* p = (*h)->item_data(static_cast<int>(i));
    for (int64_t b = 0; b < items[i]; ++b) {
      ASSERT_EQ(p[b], static_cast<uint8_t>(0 * 13 + i + 1 + b * 7))
          << "item " << i << " byte " << b;
    }
  }
}

TEST_F(DeviceStagingTest, ExistingCopyIsReturned) {
  ASSERT_NE(SealedHost(Key(1), {4096, 100}), nullptr);
  absl::StatusOr<DeviceRankBufferPtr> first = StageToDevice(*host_, *devices_, Key(1), 0);
  ASSERT_TRUE(first.ok()) << first.status();
  const int64_t used = devices_->used_bytes(0);
  absl::StatusOr<DeviceRankBufferPtr> again = StageToDevice(*host_, *devices_, Key(1), 0);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->get(), first->get());
  EXPECT_EQ(devices_->used_bytes(0), used);
  // The host buffer is the host copy of the device one already.
  absl::StatusOr<RankBufferPtr> h = host_->Get(Key(1));
  ASSERT_TRUE(h.ok());
  absl::StatusOr<RankBufferPtr> back = StageToHost(*devices_, *host_, Key(1));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->get(), h->get());
}

TEST_F(DeviceStagingTest, NotFoundInEitherStore) {
  EXPECT_EQ(StageToHost(*devices_, *host_, Key(7)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(StageToDevice(*host_, *devices_, Key(7), 0).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(DeviceStagingTest, UnsealedSourcesAreRefused) {
  ASSERT_TRUE(host_->CreateAll({Key(2)}, {{128}}).ok());
  EXPECT_EQ(StageToDevice(*host_, *devices_, Key(2), 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(devices_->List().empty());

  ASSERT_TRUE(devices_->CreateAll({Key(3)}, {0}, {{128}}).ok());
  EXPECT_EQ(StageToHost(*devices_, *host_, Key(3)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(host_->Get(Key(3)).ok());
}

TEST_F(DeviceStagingTest, OtherChecksumsAreRefused) {
  ASSERT_NE(SealedHost(Key(4), {256}), nullptr);
  ASSERT_TRUE(devices_->CreateAll({Key(4)}, {0}, {{256}}).ok());  // zeros
  ASSERT_TRUE(devices_->Seal(Key(4), {}).ok());
  EXPECT_EQ(StageToDevice(*host_, *devices_, Key(4), 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(StageToHost(*devices_, *host_, Key(4)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(DeviceStagingTest, CopyThatDoesNotFitLeavesNothing) {
  ASSERT_NE(SealedHost(Key(5), {(1 << 20) + 64}), nullptr);  // over one fake device
  absl::StatusOr<DeviceRankBufferPtr> d = StageToDevice(*host_, *devices_, Key(5), 0);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kResourceExhausted) << d.status();
  EXPECT_TRUE(devices_->List().empty());
  EXPECT_EQ(devices_->used_bytes(0), 0);
}

}  // namespace
}  // namespace reshard::agent
