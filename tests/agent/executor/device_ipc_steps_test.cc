// Cross-host steps through device IPC handles (device_ipc_steps.h) between
// hosts of "one machine" (fake devices, whose IPC handles open within one
// process too), with real UCX transports on loopback (proofs, handles and
// "done" messages): two and three hosts whose new device buffers equal the
// global tensors byte for byte (and checksum for checksum); a host-resident
// source staged to a device for the run and dropped after; a peer whose IPC
// entry differs makes every host take the communicator route; a host with
// another secret fails the task on both; a sender that never runs is
// UNAVAILABLE naming it; a cancelled task leaves nothing; the message MAC.
#include "agent/executor/device_ipc_steps.h"

#include <atomic>
#include <fstream>
#include <future>
#include <map>
#include <string>
#include <vector>

#include "agent/shard_store/device_buffer.h"
#include "agent/shard_store/device_staging.h"
#include "agent/transfer/backend.h"
#include "agent/transfer/fake_comm.h"
#include "agent/transfer/fake_device.h"
#include "tests/agent/executor/executor_fixture.h"

namespace reshard::agent::executor_testing {
namespace {

using Result = absl::StatusOr<std::vector<v1::ShardChecksum>>;
const std::string kSecret(32, 's');

class DeviceIpcStepsTest : public ExecutorTest {
 protected:
  void TearDown() override {
    for (auto& h : hosts_) h.executor.reset();
    devices_.clear();
    factories_.clear();
    ExecutorTest::TearDown();
    apis_.clear();
  }

  // `n` hosts h0..h<n-1>, each with two fake devices, a device store, the
  // fake communicator and an executor (device IPC on, but for `without_ipc`:
  // --device-ipc none, which then advertises no IPC entry).
  void MakeIpcHosts(int n, const std::string& without_ipc = "") {
    for (int i = 0; i < n; ++i) {
      Host h;
      h.id = "h" + std::to_string(i);
      h.dir = fs::temp_directory_path() /
              ("reshard-ipc-test-" + std::to_string(getpid()) + "-" + h.id);
      fs::create_directories(h.dir);
      ShardStore::Options so;
      so.shm_dir = h.dir.string();
      so.host_id = h.id;
      so.memory_limit_bytes = int64_t{1} << 30;
      auto store = ShardStore::Open(so);
      ASSERT_TRUE(store.ok()) << store.status();
      h.store = std::move(*store);
      auto t = MakeUcxTransportImpl(UcxOptions{"lo", "tcp,self"});
      ASSERT_TRUE(t.ok()) << t.status();
      h.transport = std::move(*t);
      apis_.push_back(std::make_unique<FakeDeviceApi>(FakeDeviceApi::Options{2, 64 << 20}));
      auto d = DeviceBufferStore::Open(apis_.back().get(), DeviceBufferStore::Options());
      ASSERT_TRUE(d.ok()) << d.status();
      devices_.push_back(std::move(*d));
      factories_.push_back(std::make_unique<FakeCommFactory>(apis_.back().get()));
      TaskExecutor::Options eo;
      eo.copy_threads = 2;
      eo.chunk_bytes = 4 << 10;
      eo.peer_window_bytes = 12 << 10;
      eo.proof_timeout_ms = 3000;
      eo.seal_timeout_ms = 10000;
      eo.device_ipc = h.id != without_ipc;
      h.executor = std::make_unique<TaskExecutor>(h.store.get(), h.transport.get(), eo,
                                                  devices_.back().get(), factories_.back().get());
      hosts_.push_back(std::move(h));
    }
  }

  void FillHostRank(int h, int r) {
    ShardStore& store = *hosts_[h].store;
    auto bufs = store.CreateAll({RankBufferKey{kJob, 1, r}}, {RankItemBytes(ptc_, from_, r)});
    ASSERT_TRUE(bufs.ok()) << bufs.status();
    RenderRank(ptc_, from_, r, old_world_, (*bufs)[0].get());
    ASSERT_TRUE(store.Seal({kJob, 1, r}, {}).ok());
  }

  // Every old rank filled on its host: on device r % 2, or in host memory
  // on `host_resident`.
  void FillOldRanks(const std::string& host_resident = "") {
    const auto slots = planner::ExpandPlacement(from_.placement());
    for (int r = 0; r < static_cast<int>(slots.size()); ++r) {
      const int h = std::stoi(slots[r].host().substr(1));
      FillHostRank(h, r);
      if (slots[r].host() == host_resident) continue;
      auto d = StageToDevice(*hosts_[h].store, *devices_[h], {kJob, 1, r}, r % 2);
      ASSERT_TRUE(d.ok()) << d.status();
      hosts_[h].store->Drop({kJob, 1, r});
    }
  }

  // Runs the hosts `run` (default: all) at once; every peer advertises
  // "ucx", "fake-nccl" and its IPC entry (but `without_ipc`).
  std::vector<Result> RunAll(const std::string& secret,
                             const std::function<bool()>& cancelled = [] { return false; },
                             const std::function<void(const std::string&)>& on_wait = nullptr,
                             std::vector<size_t> run = {}) {
    v1::HostTask whole = WholeTask();
    whole.set_transfer_secret(secret);
    const auto addrs = Addresses();
    waits_.assign(hosts_.size(), {});
    if (run.empty()) {
      for (size_t i = 0; i < hosts_.size(); ++i) run.push_back(i);
    }
    std::vector<std::future<Result>> runs;
    for (size_t i : run) {
      Host& h = hosts_[i];
      v1::HostTask task = Slice(whole, h.id, addrs);
      for (v1::PeerHost& p : *task.mutable_peers()) {
        p.add_transports("ucx");
        p.add_transports("fake-nccl");
        if (p.host_id() != without_ipc_) p.add_transports(DeviceIpcEntry(*apis_[i]));
      }
      if (i < secrets_.size()) task.set_transfer_secret(secrets_[i]);
      runs.push_back(std::async(std::launch::async, [this, &h, task, i, cancelled, on_wait] {
        return h.executor->Execute(h.id, task, nullptr, cancelled, [&](const std::string& what) {
          waits_[i].push_back(what);
          if (on_wait) on_wait(what);
        });
      }));
    }
    std::vector<Result> out;
    for (auto& r : runs) out.push_back(r.get());
    return out;
  }

  // Host h's new ranks equal the global tensors, in device memory (or host
  // memory for `in_host`), checksums as reported.
  void ExpectResult(int h, const Result& result, bool in_host = false) {
    ASSERT_TRUE(result.ok()) << hosts_[h].id << ": " << result.status();
    std::map<std::pair<int, int>, v1::ShardChecksum> sums;
    for (const auto& c : *result) sums[{c.rank(), c.item()}] = c;
    const auto slots = planner::ExpandPlacement(to_.placement());
    int ranks = 0;
    for (int r = 0; r < static_cast<int>(slots.size()); ++r) {
      if (slots[r].host() != hosts_[h].id) continue;
      ++ranks;
      std::vector<ItemSlot> items;
      int64_t size = 0;
      RankBufferPtr host_buf;
      if (in_host) {
        auto got = hosts_[h].store->Get({kJob, 2, r});
        ASSERT_TRUE(got.ok()) << got.status();
        host_buf = *got;
        items = host_buf->items();
        size = host_buf->size();
      } else {
        auto got = devices_[h]->Get({kJob, 2, r});
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_TRUE((*got)->sealed());
        items = (*got)->items();
        size = (*got)->size();
      }
      VectorBuffer want(items, size);
      RenderRank(ptc_, to_, r, old_world_, &want);
      for (size_t item = 0; item < items.size(); ++item) {
        const int64_t n = items[item].bytes;
        if (n == 0) continue;
        std::vector<uint8_t> bytes(n);
        if (in_host) {
          std::memcpy(bytes.data(), host_buf->data() + items[item].offset, n);
        } else {
          ASSERT_TRUE(
              devices_[h]->ReadItem({kJob, 2, r}, static_cast<int>(item), 0, bytes.data(), n).ok());
        }
        ASSERT_EQ(0, std::memcmp(want.item_data(item), bytes.data(), n))
            << "host " << h << " rank " << r << " item " << item;
        auto it = sums.find({r, static_cast<int>(item)});
        ASSERT_NE(it, sums.end()) << "rank " << r << " item " << item;
        EXPECT_EQ(it->second.checksum(), Checksum(want.item_data(item), n));
        EXPECT_EQ(it->second.bytes(), n);
      }
    }
    EXPECT_GT(ranks, 0);
    // The other memory kind holds nothing of generation 2.
    int other = 0;
    if (in_host) {
      for (const auto& k : devices_[h]->List()) other += k.generation == 2;
    } else {
      other = NewBuffers(hosts_[h]);
    }
    EXPECT_EQ(other, 0) << "host " << h;
  }

  bool Waited(int h, const std::string& what) {
    return std::find(waits_[h].begin(), waits_[h].end(), what) != waits_[h].end();
  }

  void ExpectNothingLeft(int h) {
    for (const auto& k : devices_[h]->List()) EXPECT_NE(k.generation, 2) << "host " << h;
    EXPECT_EQ(NewBuffers(hosts_[h]), 0) << "host " << h;
  }

  std::vector<std::unique_ptr<FakeDeviceApi>> apis_;
  std::vector<std::unique_ptr<DeviceBufferStore>> devices_;
  std::vector<std::unique_ptr<DeviceCommFactory>> factories_;
  std::vector<std::vector<std::string>> waits_;
  std::vector<std::string> secrets_;
  std::string without_ipc_;
  int old_world_ = 6;
};

TEST(DeviceIpcEntryTest, TheFakeAdvertisesItsBootId) {
  FakeDeviceApi api(FakeDeviceApi::Options{1, 1 << 20});
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  ASSERT_TRUE(std::getline(f, boot_id));
  EXPECT_EQ(DeviceIpcEntry(api), "fake-ipc:" + boot_id);
  std::vector<std::string> names = AdvertisedTransports(LoadedBackends(nullptr, &api, nullptr));
  EXPECT_NE(std::find(names.begin(), names.end(), "fake-ipc:" + boot_id), names.end());
  names = AdvertisedTransports(LoadedBackends(nullptr, &api, nullptr, /*device_ipc=*/false));
  EXPECT_EQ(std::find(names.begin(), names.end(), "fake-ipc:" + boot_id), names.end());
}

TEST(DeviceIpcMessageTest, AnotherSecretIsPermissionDeniedNamingTheSender) {
  auto m = MakeDeviceIpcMessage(kSecret, "op-1", "h0", "h1", "done", DeviceIpcMessageBytes(0, 2));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->size(), DeviceIpcMessageBytes(0, 2));
  auto checked = CheckDeviceIpcMessage(kSecret, "op-1", *m);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->sender, "h0");
  EXPECT_EQ(checked->receiver, "h1");
  EXPECT_EQ(checked->payload, "done");
  for (const auto& [secret, op] : {std::pair<std::string, std::string>{"other", "op-1"},
                                   {kSecret, "op-2"}}) {
    checked = CheckDeviceIpcMessage(secret, op, *m);
    ASSERT_EQ(checked.status().code(), absl::StatusCode::kPermissionDenied) << checked.status();
    EXPECT_THAT(std::string(checked.status().message()), ::testing::HasSubstr("host \"h0\""));
  }
  EXPECT_EQ(CheckDeviceIpcMessage(kSecret, "op-1", std::string(8, '\xff')).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(DeviceIpcStepsTest, TwoHostsMoveDeviceBuffersThroughIpcHandles) {
  MakeIpcHosts(2);
  FillOldRanks();
  const std::vector<Result> results = RunAll(kSecret);
  for (int h = 0; h < 2; ++h) {
    ExpectResult(h, results[h]);
    EXPECT_TRUE(Waited(h, "cross-host steps (device IPC)")) << h;
    EXPECT_FALSE(Waited(h, "device communicator")) << h;
    for (const std::string& w : waits_[h]) EXPECT_EQ(w.rfind("host-staged", 0), std::string::npos);
  }
}

TEST_F(DeviceIpcStepsTest, ThreeHostsInACycle) {
  from_ = MakeLayout(2, 1, 3, 2);  // h0: 0-1, h1: 2-3, h2: 4-5
  to_ = MakeLayout(1, 1, 3, 1);    // h0: 0, h1: 1, h2: 2
  MakeIpcHosts(3);
  FillOldRanks();
  const std::vector<Result> results = RunAll(kSecret);
  for (int h = 0; h < 3; ++h) {
    ExpectResult(h, results[h]);
    EXPECT_TRUE(Waited(h, "cross-host steps (device IPC)")) << h;
  }
}

TEST_F(DeviceIpcStepsTest, HostResidentSourcesAreStagedForTheRunAndDropped) {
  MakeIpcHosts(2);
  FillOldRanks("h0");  // h0's sources in host memory: its new buffers stay there
  const std::vector<Result> results = RunAll("");  // no secret: no proofs
  ExpectResult(0, results[0], /*in_host=*/true);
  ExpectResult(1, results[1]);
  EXPECT_TRUE(Waited(1, "cross-host steps (device IPC)"));
  // The sources are untouched, and their device copies for the run are gone.
  EXPECT_TRUE(hosts_[0].store->Get({kJob, 1, 0}).ok());
  EXPECT_TRUE(devices_[0]->List().empty());
}

TEST_F(DeviceIpcStepsTest, APeerWithoutTheEntryMakesEveryHostTakeTheCommunicator) {
  without_ipc_ = "h1";  // --device-ipc none (or another machine: another entry)
  MakeIpcHosts(2, without_ipc_);
  FillOldRanks();
  const std::vector<Result> results = RunAll(kSecret);
  for (int h = 0; h < 2; ++h) {
    ExpectResult(h, results[h]);
    EXPECT_TRUE(Waited(h, "device communicator")) << h;
    EXPECT_FALSE(Waited(h, "cross-host steps (device IPC)")) << h;
  }
}

TEST_F(DeviceIpcStepsTest, AHostWithAnotherSecretFailsTheTaskOnBoth) {
  MakeIpcHosts(2);
  FillOldRanks();
  secrets_ = {kSecret, std::string(32, 'x')};
  const std::vector<Result> results = RunAll(kSecret);
  for (int h = 0; h < 2; ++h) {
    ASSERT_FALSE(results[h].ok()) << h;
    // The other secret derives other tags: no proof ever arrives.
    EXPECT_EQ(results[h].status().code(), absl::StatusCode::kUnauthenticated)
        << results[h].status();
    ExpectNothingLeft(h);
  }
}

TEST_F(DeviceIpcStepsTest, ASenderThatNeverSendsIsUnavailableNamingIt) {
  MakeIpcHosts(2);
  FillOldRanks();
  // No secret (no proofs): h0 runs alone and waits for h1's handles.
  const std::vector<Result> results = RunAll("", [] { return false; }, nullptr, {0});
  ASSERT_EQ(results[0].status().code(), absl::StatusCode::kUnavailable) << results[0].status();
  EXPECT_THAT(std::string(results[0].status().message()),
              ::testing::HasSubstr("no IPC handles came from host \"h1\""));
  ExpectNothingLeft(0);
}

TEST_F(DeviceIpcStepsTest, CancelledWhileWaitingLeavesNothing) {
  MakeIpcHosts(2);
  FillOldRanks();
  std::atomic<bool> cancel{false};
  const std::vector<Result> results =
      RunAll(kSecret, [&] { return cancel.load(); }, [&](const std::string& what) {
        if (what == "device IPC handles") cancel = true;
      });
  for (int h = 0; h < 2; ++h) {
    ASSERT_FALSE(results[h].ok()) << h;
    EXPECT_EQ(results[h].status().code(), absl::StatusCode::kCancelled) << results[h].status();
    ExpectNothingLeft(h);
  }
}

}  // namespace
}  // namespace reshard::agent::executor_testing
