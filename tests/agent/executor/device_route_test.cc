// The device routes (device_route.h) on the fake device: a
// device-resident generation resized on one host gives device buffers equal
// byte for byte (and checksum for checksum) to what the host path gives;
// host sources reach device destinations; a resize that does not fit the
// devices or is cancelled leaves nothing; a two-host task runs host-staged
// and still ends in device memory, equal to the global tensors.
#include "agent/executor/device_route.h"

#include <algorithm>
#include <atomic>
#include <future>
#include <map>
#include <string>
#include <vector>

#include "agent/device/fake_device.h"
#include "agent/shard_store/device_buffer.h"
#include "agent/shard_store/device_staging.h"
#include "tests/agent/executor/executor_fixture.h"

namespace reshard::agent::executor_testing {
namespace {

using Sums = std::map<std::pair<int, int>, v1::ShardChecksum>;  // (rank, item)

Sums ByRankItem(const std::vector<v1::ShardChecksum>& sums) {
  Sums out;
  for (const v1::ShardChecksum& c : sums) out[{c.rank(), c.item()}] = c;
  return out;
}

class DeviceRouteTest : public ExecutorTest {
 protected:
  void TearDown() override {
    for (auto& h : hosts_) h.executor.reset();
    plain_.clear();
    devices_.clear();
    ExecutorTest::TearDown();
    apis_.clear();
  }

  // Two hosts (ExecutorTest::MakeHosts); host i gets two fake devices of
  // `device_bytes` each and an executor over them; a plain host executor of
  // host 1's store stays in `plain_` for the reference runs.
  void MakeDeviceHosts(int64_t limit_per_device = 0, int64_t local_chunk_bytes = 8 << 20) {
    MakeHosts();
    for (auto& h : hosts_) {
      apis_.push_back(std::make_unique<FakeDeviceApi>(FakeDeviceApi::Options{2, 64 << 20}));
      DeviceBufferStore::Options o;
      o.memory_limit_bytes_per_device = limit_per_device;
      auto d = DeviceBufferStore::Open(apis_.back().get(), o);
      ASSERT_TRUE(d.ok()) << d.status();
      devices_.push_back(std::move(*d));
      TaskExecutor::Options eo;
      eo.copy_threads = 2;
      eo.max_inflight_bytes = 64 << 10;
      eo.local_chunk_bytes = local_chunk_bytes;
      plain_.push_back(std::move(h.executor));
      h.executor = std::make_unique<TaskExecutor>(h.store.get(), h.transport.get(), eo,
                                                  devices_.back().get());
    }
  }

  // Old rank `r` of from_ (generation 1) rendered into `host`'s store.
  void FillHostRank(ShardStore& store, int r) {
    auto bufs = store.CreateAll({RankBufferKey{kJob, 1, r}}, {RankItemBytes(ptc_, from_, r)});
    ASSERT_TRUE(bufs.ok()) << bufs.status();
    RenderRank(ptc_, from_, r, old_world_, (*bufs)[0].get());
    ASSERT_TRUE(store.Seal({kJob, 1, r}, {}).ok());
  }

  // Old rank `r` rendered, then moved to device `device` of host `h`.
  void FillDeviceRank(int h, int r, int device) {
    FillHostRank(*hosts_[h].store, r);
    auto d = StageToDevice(*hosts_[h].store, *devices_[h], {kJob, 1, r}, device);
    ASSERT_TRUE(d.ok()) << d.status();
    hosts_[h].store->Drop({kJob, 1, r});
  }

  int Generation2Buffers(int h) {
    int n = 0;
    for (const auto& k : devices_[h]->List()) n += k.generation == 2;
    return n + NewBuffers(hosts_[h]);
  }

  // Checks host h's new ranks: device buffers on the expected devices, the
  // global tensors' bytes, `sums` their checksums; nothing of generation 2
  // in its host store.
  void ExpectOnDevices(int h, const std::vector<v1::ShardChecksum>& result,
                       const std::map<int, int>& device_of) {
    const Sums sums = ByRankItem(result);
    for (const auto& [r, device] : device_of) {
      auto got = devices_[h]->Get({kJob, 2, r});
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ((*got)->device(), device) << "rank " << r;
      EXPECT_TRUE((*got)->sealed());
      VectorBuffer want((*got)->items(), (*got)->size());
      RenderRank(ptc_, to_, r, old_world_, &want);
      for (size_t item = 0; item < want.items().size(); ++item) {
        const int64_t n = want.items()[item].bytes;
        if (n == 0) continue;
        std::vector<uint8_t> bytes(n);
        ASSERT_TRUE(
            devices_[h]->ReadItem({kJob, 2, r}, static_cast<int>(item), 0, bytes.data(), n).ok());
        ASSERT_EQ(0, std::memcmp(want.item_data(item), bytes.data(), n))
            << "rank " << r << " item " << item;
        auto it = sums.find({r, static_cast<int>(item)});
        ASSERT_NE(it, sums.end()) << "no checksum for rank " << r << " item " << item;
        EXPECT_EQ(it->second.checksum(), Checksum(want.item_data(item), n));
        EXPECT_EQ(it->second.bytes(), n);
        EXPECT_EQ((*got)->checksums()[item], it->second.checksum());
      }
    }
    EXPECT_EQ(NewBuffers(hosts_[h]), 0);
  }

  // One host (h0) resizes tp2 (2 ranks) -> dp3 (3 ranks).
  void UseOneHostResize() {
    from_ = MakeLayoutOnHosts(2, 1, 1, 2);
    to_ = MakeLayoutOnHosts(1, 1, 3, 3);
    old_world_ = 2;
  }

  // The same task run by the plain host executor of host 1's store on
  // host copies of the sources (as host "h0"): its checksums.
  Sums HostReference(const v1::HostTask& task) {
    for (int r = 0; r < old_world_; ++r) FillHostRank(*hosts_[1].store, r);
    auto ref = plain_[1]->Execute("h0", task, nullptr, [] { return false; });
    EXPECT_TRUE(ref.ok()) << ref.status();
    return ref.ok() ? ByRankItem(*ref) : Sums();
  }

  std::vector<std::unique_ptr<FakeDeviceApi>> apis_;
  std::vector<std::unique_ptr<DeviceBufferStore>> devices_;
  std::vector<std::unique_ptr<TaskExecutor>> plain_;
  int old_world_ = 6;
};

TEST(DeviceRunsTest, StridedRegionsBecomeCoalescedRuns) {
  std::vector<std::tuple<int64_t, int64_t, int64_t>> runs;
  auto collect = [&](int64_t s, int64_t d, int64_t n) { runs.emplace_back(s, d, n); };
  // Whole rows of a 4x8 block: one run.
  ForEachRun({4, 8}, 16, {8, 1}, 0, {8, 1}, collect);
  EXPECT_EQ(runs, (std::vector<std::tuple<int64_t, int64_t, int64_t>>{{16, 0, 32}}));
  // A column slice (3 of 8 columns) into a contiguous 4x3 block: one run per row.
  runs.clear();
  ForEachRun({4, 3}, 5, {8, 1}, 100, {3, 1}, collect);
  EXPECT_EQ(runs, (std::vector<std::tuple<int64_t, int64_t, int64_t>>{
                      {5, 100, 3}, {13, 103, 3}, {21, 106, 3}, {29, 109, 3}}));
  // A transposed copy: element by element; a size-1 dimension is skipped.
  runs.clear();
  ForEachRun({2, 1, 2}, 0, {1, 99, 2}, 0, {2, 7, 1}, collect);
  EXPECT_EQ(runs, (std::vector<std::tuple<int64_t, int64_t, int64_t>>{
                      {0, 0, 1}, {2, 1, 1}, {1, 2, 1}, {3, 3, 1}}));
  // Empty.
  runs.clear();
  ForEachRun({0, 5}, 0, {5, 1}, 0, {5, 1}, collect);
  EXPECT_TRUE(runs.empty());
}

TEST_F(DeviceRouteTest, DeviceResidentResizeEqualsTheHostPath) {
  UseOneHostResize();
  MakeDeviceHosts();
  FillDeviceRank(0, 0, 0);
  FillDeviceRank(0, 1, 1);
  const v1::HostTask task = Slice(WholeTask(), "h0", {});
  std::vector<std::pair<int64_t, int64_t>> reports;
  auto result = hosts_[0].executor->Execute(
      "h0", task, [&](int64_t done, int64_t total) { reports.emplace_back(done, total); },
      [] { return false; });
  ASSERT_TRUE(result.ok()) << result.status();
  // New rank 0 and 1 on their old ranks' devices, rank 2 on (2 mod 2).
  ExpectOnDevices(0, *result, {{0, 0}, {1, 1}, {2, 0}});
  ASSERT_FALSE(reports.empty());
  EXPECT_EQ(reports.back().first, reports.back().second);
  // Exactly what the host path gives, bytes and checksums.
  const Sums ref = HostReference(task);
  EXPECT_EQ(ref.size(), result->size());
  for (const auto& [key, c] : ByRankItem(*result)) {
    auto it = ref.find(key);
    ASSERT_NE(it, ref.end());
    EXPECT_EQ(it->second.checksum(), c.checksum())
        << "rank " << key.first << " item " << key.second;
    auto host = hosts_[1].store->Get({kJob, 2, key.first});
    ASSERT_TRUE(host.ok());
    std::vector<uint8_t> bytes(c.bytes());
    ASSERT_TRUE(
        devices_[0]->ReadItem({kJob, 2, key.first}, key.second, 0, bytes.data(), c.bytes()).ok());
    EXPECT_EQ(0, std::memcmp(bytes.data(), (*host)->item_data(key.second), c.bytes()));
  }
  // The old generation is still on the devices, untouched; no host copies.
  EXPECT_TRUE(devices_[0]->Get({kJob, 1, 0}).ok());
  EXPECT_TRUE(hosts_[0].store->List().empty());
}

TEST_F(DeviceRouteTest, HostSourceReachesDeviceDestinations) {
  UseOneHostResize();
  MakeDeviceHosts();
  FillDeviceRank(0, 0, 1);
  FillHostRank(*hosts_[0].store, 1);  // the host buffer is read host-to-device
  const v1::HostTask task = Slice(WholeTask(), "h0", {});
  auto result = hosts_[0].executor->Execute("h0", task, nullptr, [] { return false; });
  ASSERT_TRUE(result.ok()) << result.status();
  // Rank 0 follows old rank 0 to device 1; old rank 1 is on no device.
  ExpectOnDevices(0, *result, {{0, 1}, {1, 1}, {2, 0}});
  EXPECT_TRUE(hosts_[0].store->Get({kJob, 1, 1}).ok());  // the host source stays
}

TEST_F(DeviceRouteTest, NewBuffersBeyondTheDeviceLimitAreResourceExhaustedAndLeaveNothing) {
  UseOneHostResize();
  // Device 0 holds old rank 0 and one new rank, not the two new ranks it gets.
  int64_t old0 = 0, new0 = 0;
  LayoutItems(RankItemBytes(ptc_, from_, 0), &old0);
  LayoutItems(RankItemBytes(ptc_, to_, 0), &new0);
  MakeDeviceHosts(old0 + new0 + kItemAlignment);
  FillDeviceRank(0, 0, 0);
  FillDeviceRank(0, 1, 1);
  const int64_t used0 = devices_[0]->used_bytes(0), used1 = devices_[0]->used_bytes(1);
  auto result = hosts_[0].executor->Execute("h0", Slice(WholeTask(), "h0", {}), nullptr,
                                            [] { return false; });
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted) << result.status();
  EXPECT_EQ(Generation2Buffers(0), 0);
  EXPECT_EQ(devices_[0]->used_bytes(0), used0);
  EXPECT_EQ(devices_[0]->used_bytes(1), used1);
}

TEST_F(DeviceRouteTest, CancelledMidCopyDropsTheNewDeviceBuffers) {
  UseOneHostResize();
  MakeDeviceHosts(0, /*local_chunk_bytes=*/4096);
  FillDeviceRank(0, 0, 0);
  FillDeviceRank(0, 1, 1);
  std::atomic<int> polls{0};
  // Cancelled at the second poll: the first is before anything is made, the
  // second after the first 4 KiB copied.
  auto result = hosts_[0].executor->Execute("h0", Slice(WholeTask(), "h0", {}), nullptr,
                                            [&] { return ++polls >= 2; });
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
  EXPECT_EQ(polls.load(), 2);
  EXPECT_EQ(Generation2Buffers(0), 0);
  EXPECT_TRUE(devices_[0]->Get({kJob, 1, 0}).ok());
}

TEST_F(DeviceRouteTest, APrepareOfDeviceSourcesKeepsItsNewBuffersInHostMemory) {
  UseOneHostResize();
  MakeDeviceHosts();
  FillDeviceRank(0, 0, 0);
  FillDeviceRank(0, 1, 1);
  v1::HostTask task = Slice(WholeTask(), "h0", {});
  task.set_prepare(true);
  std::vector<std::string> waits;
  auto result = hosts_[0].executor->Execute(
      "h0", task, nullptr, [] { return false; },
      [&](const std::string& what) { waits.push_back(what); });
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_FALSE(waits.empty());
  EXPECT_EQ(waits[0].rfind("host-staged: ", 0), 0u) << waits[0];
  // The prepared phase writes into unsealed host buffers; the staged
  // sources went; nothing of generation 2 on a device.
  for (int r = 0; r < 3; ++r) {
    auto b = hosts_[0].store->Get({kJob, 2, r});
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_FALSE((*b)->sealed());
  }
  EXPECT_FALSE(hosts_[0].store->Get({kJob, 1, 0}).ok());
  EXPECT_FALSE(hosts_[0].store->Get({kJob, 1, 1}).ok());
  for (const auto& k : devices_[0]->List()) EXPECT_EQ(k.generation, 1);
  // It reports the sealed checksums of the old shards it read: the devices'.
  for (const v1::ShardChecksum& c : *result) {
    auto d = devices_[0]->Get({kJob, 1, c.rank()});
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ((*d)->checksums()[c.item()], c.checksum());
  }
  EXPECT_FALSE(result->empty());
}

TEST_F(DeviceRouteTest, TwoHostTaskRunsHostStagedAndEndsOnTheDevices) {
  MakeDeviceHosts();
  const auto old_slots = planner::ExpandPlacement(from_.placement());
  for (int r = 0; r < static_cast<int>(old_slots.size()); ++r) {
    FillDeviceRank(old_slots[r].host() == "h0" ? 0 : 1, r, r % 2);
  }
  const v1::HostTask whole = WholeTask();
  const auto addrs = Addresses();
  std::vector<std::vector<std::string>> waits(hosts_.size());
  std::vector<std::future<absl::StatusOr<std::vector<v1::ShardChecksum>>>> runs;
  for (size_t i = 0; i < hosts_.size(); ++i) {
    Host& h = hosts_[i];
    const v1::HostTask task = Slice(whole, h.id, addrs);
    runs.push_back(std::async(std::launch::async, [&h, task, &w = waits[i]] {
      return h.executor->Execute(
          h.id, task, nullptr, [] { return false; },
          [&](const std::string& what) { w.push_back(what); });
    }));
  }
  const auto new_slots = planner::ExpandPlacement(to_.placement());
  for (size_t i = 0; i < hosts_.size(); ++i) {
    auto result = runs[i].get();
    ASSERT_TRUE(result.ok()) << hosts_[i].id << ": " << result.status();
    ASSERT_FALSE(waits[i].empty());
    EXPECT_EQ(waits[i][0].rfind("host-staged: ", 0), 0u) << waits[i][0];
    // New rank r follows old rank r's device where that is here, else
    // (its index among the host's new ranks) mod 2.
    std::map<int, int> device_of;
    int index = 0;
    for (int r = 0; r < static_cast<int>(new_slots.size()); ++r) {
      if (new_slots[r].host() != hosts_[i].id) continue;
      const bool old_here =
          r < static_cast<int>(old_slots.size()) && old_slots[r].host() == hosts_[i].id;
      device_of[r] = old_here ? r % 2 : index % 2;
      ++index;
    }
    ExpectOnDevices(static_cast<int>(i), *result, device_of);
    // The staged host copies of the sources are gone too.
    EXPECT_TRUE(hosts_[i].store->List().empty());
  }
}

}  // namespace
}  // namespace reshard::agent::executor_testing
