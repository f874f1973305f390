// Cross-host steps over a device communicator (device_comm_steps.h) on fake
// devices with the fake communicator, between hosts with real UCX transports
// on loopback (proofs, communicator id, step seals): two and three hosts
// whose new device buffers equal the global tensors byte for byte (and
// checksum for checksum); a host-resident source moved over the
// communicator, its new buffers back in host memory; a host without a
// communicator makes every host host-staged, saying why; bytes altered in
// flight fail the receiver (DATA_LOSS); a host with another secret fails the
// task on both; a cancelled task leaves nothing.
#include "agent/executor/device_comm_steps.h"

#include <atomic>
#include <future>
#include <map>
#include <string>
#include <vector>

#include "agent/shard_store/device_buffer.h"
#include "agent/shard_store/device_staging.h"
#include "agent/transfer/fake_comm.h"
#include "agent/transfer/fake_device.h"
#include "tests/agent/executor/executor_fixture.h"

namespace reshard::agent::executor_testing {
namespace {

using Result = absl::StatusOr<std::vector<v1::ShardChecksum>>;
const std::string kSecret(32, 's');

// A communicator whose receives land with their first byte zeroed (in
// stream order, after the bytes arrived): bytes altered in flight.
class AlteringComm : public DeviceComm {
 public:
  AlteringComm(std::unique_ptr<DeviceComm> inner, DeviceApi* api)
      : inner_(std::move(inner)), api_(api) {}
  int rank() const override { return inner_->rank(); }
  int nranks() const override { return inner_->nranks(); }
  int device() const override { return inner_->device(); }
  absl::Status Send(const void* data, size_t bytes, int peer, DeviceStream stream) override {
    return inner_->Send(data, bytes, peer, stream);
  }
  absl::Status Recv(void* data, size_t bytes, int peer, DeviceStream stream) override {
    absl::Status s = inner_->Recv(data, bytes, peer, stream);
    altered_.emplace_back(data, stream);
    return s;
  }
  absl::Status GroupStart() override { return inner_->GroupStart(); }
  absl::Status GroupEnd() override {
    absl::Status s = inner_->GroupEnd();
    for (const auto& [data, stream] : altered_) {
      if (s.ok()) s = api_->MemsetAsync(data, 0, 1, stream);
    }
    altered_.clear();
    return s;
  }
  void Abort() override { inner_->Abort(); }

 private:
  std::unique_ptr<DeviceComm> inner_;
  DeviceApi* api_;
  std::vector<std::pair<void*, DeviceStream>> altered_;
};

class AlteringCommFactory : public FakeCommFactory {
 public:
  explicit AlteringCommFactory(FakeDeviceApi* api) : FakeCommFactory(api), api_(api) {}
  absl::StatusOr<std::unique_ptr<DeviceComm>> Init(const std::string& id, int nranks, int rank,
                                                   int device) override {
    auto c = FakeCommFactory::Init(id, nranks, rank, device);
    if (!c.ok()) return c.status();
    return std::unique_ptr<DeviceComm>(std::make_unique<AlteringComm>(*std::move(c), api_));
  }

 private:
  FakeDeviceApi* api_;
};

class DeviceCommStepsTest : public ExecutorTest {
 protected:
  void TearDown() override {
    for (auto& h : hosts_) h.executor.reset();
    devices_.clear();
    factories_.clear();
    ExecutorTest::TearDown();
    apis_.clear();
  }

  // `n` hosts h0..h<n-1>, each with two fake devices, a device store, the
  // fake communicator (unless `without_comm` names the host) and an executor
  // cutting steps into small chunks and windows (many rounds).
  void MakeCommHosts(int n, const std::string& without_comm = "",
                     const std::string& altering = "") {
    for (int i = 0; i < n; ++i) {
      Host h;
      h.id = "h" + std::to_string(i);
      h.dir = fs::temp_directory_path() /
              ("reshard-comm-test-" + std::to_string(getpid()) + "-" + h.id);
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
      if (h.id == without_comm) {
        factories_.push_back(nullptr);
      } else if (h.id == altering) {
        factories_.push_back(std::make_unique<AlteringCommFactory>(apis_.back().get()));
      } else {
        factories_.push_back(std::make_unique<FakeCommFactory>(apis_.back().get()));
      }
      TaskExecutor::Options eo;
      eo.copy_threads = 2;
      eo.chunk_bytes = 4 << 10;
      eo.peer_window_bytes = 12 << 10;
      eo.proof_timeout_ms = 3000;
      eo.seal_timeout_ms = 10000;
      eo.device_comm_why_not = "NCCL not loaded: test";
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
  void FillDeviceRank(int h, int r, int device) {
    FillHostRank(h, r);
    auto d = StageToDevice(*hosts_[h].store, *devices_[h], {kJob, 1, r}, device);
    ASSERT_TRUE(d.ok()) << d.status();
    hosts_[h].store->Drop({kJob, 1, r});
  }
  int HostOf(const std::string& id) { return std::stoi(id.substr(1)); }

  // Every old rank filled on its host: on device r % 2, or in host memory
  // on `host_resident`.
  void FillOldRanks(const std::string& host_resident = "") {
    const auto slots = planner::ExpandPlacement(from_.placement());
    for (int r = 0; r < static_cast<int>(slots.size()); ++r) {
      if (slots[r].host() == host_resident) {
        FillHostRank(HostOf(slots[r].host()), r);
      } else {
        FillDeviceRank(HostOf(slots[r].host()), r, r % 2);
      }
    }
  }

  // Runs every host's slice at once; peers advertise "fake-nccl" when they
  // have a communicator.
  std::vector<Result> RunAll(const std::string& secret,
                             const std::function<bool()>& cancelled = [] { return false; },
                             const std::function<void(const std::string&)>& on_wait = nullptr) {
    v1::HostTask whole = WholeTask();
    whole.set_transfer_secret(secret);
    const auto addrs = Addresses();
    waits_.assign(hosts_.size(), {});
    std::vector<std::future<Result>> runs;
    for (size_t i = 0; i < hosts_.size(); ++i) {
      Host& h = hosts_[i];
      v1::HostTask task = Slice(whole, h.id, addrs);
      for (v1::PeerHost& p : *task.mutable_peers()) {
        p.add_transports("ucx");
        if (factories_[HostOf(p.host_id())]) p.add_transports("fake-nccl");
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
      if (in_host) {
        auto got = hosts_[h].store->Get({kJob, 2, r});
        ASSERT_TRUE(got.ok()) << got.status();
        items = (*got)->items();
        size = (*got)->size();
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
          auto got = hosts_[h].store->Get({kJob, 2, r});
          std::memcpy(bytes.data(), (*got)->data() + items[item].offset, n);
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
  int old_world_ = 6;
};

TEST(AdvertisedCommNameTest, TheFakeIsFakeNccl) {
  FakeDeviceApi api(FakeDeviceApi::Options{1, 1 << 20});
  FakeCommFactory f(&api);
  EXPECT_EQ(AdvertisedCommName(f), "fake-nccl");
}

TEST_F(DeviceCommStepsTest, TwoHostsMoveDeviceBuffersOverTheCommunicator) {
  MakeCommHosts(2);
  FillOldRanks();
  const std::vector<Result> results = RunAll(kSecret);
  for (int h = 0; h < 2; ++h) {
    ExpectResult(h, results[h]);
    EXPECT_TRUE(Waited(h, "device communicator")) << h;
    EXPECT_TRUE(Waited(h, "step seals")) << h;
    for (const std::string& w : waits_[h]) EXPECT_EQ(w.rfind("host-staged", 0), std::string::npos);
  }
}

TEST_F(DeviceCommStepsTest, ThreeHostsInACycleMoveOverOneCommunicator) {
  from_ = MakeLayout(2, 1, 3, 2);  // h0: 0-1, h1: 2-3, h2: 4-5
  to_ = MakeLayout(1, 1, 3, 1);    // h0: 0, h1: 1, h2: 2
  MakeCommHosts(3);
  FillOldRanks();
  const std::vector<Result> results = RunAll(kSecret);
  for (int h = 0; h < 3; ++h) {
    ExpectResult(h, results[h]);
    EXPECT_TRUE(Waited(h, "device communicator")) << h;
  }
}

TEST_F(DeviceCommStepsTest, HostResidentSourcesGoOverTheCommunicatorAndStayInHostMemory) {
  MakeCommHosts(2);
  FillOldRanks("h0");  // h0's sources in host memory: its new buffers stay there
  const std::vector<Result> results = RunAll("");  // no secret: no proofs, no seals
  ExpectResult(0, results[0], /*in_host=*/true);
  ExpectResult(1, results[1]);
  EXPECT_TRUE(Waited(0, "device communicator"));
  // The sources are untouched.
  EXPECT_TRUE(hosts_[0].store->Get({kJob, 1, 0}).ok());
}

TEST_F(DeviceCommStepsTest, AHostWithoutTheCommunicatorMakesEveryHostHostStaged) {
  MakeCommHosts(2, /*without_comm=*/"h1");
  FillOldRanks();
  const std::vector<Result> results = RunAll(kSecret);
  for (int h = 0; h < 2; ++h) ExpectResult(h, results[h]);
  ASSERT_FALSE(waits_[0].empty());
  ASSERT_FALSE(waits_[1].empty());
  EXPECT_EQ(waits_[0][0],
            "host-staged: cross-host steps move host memory (host \"h1\" does not advertise "
            "fake-nccl)");
  EXPECT_EQ(waits_[1][0],
            "host-staged: cross-host steps move host memory (no device communicator: NCCL not "
            "loaded: test)");
}

TEST_F(DeviceCommStepsTest, AHostWithAnotherSecretFailsTheTaskOnBoth) {
  MakeCommHosts(2);
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

TEST_F(DeviceCommStepsTest, BytesAlteredInFlightAreDataLossOnTheReceiver) {
  MakeCommHosts(2, "", /*altering=*/"h1");
  FillOldRanks();
  const std::vector<Result> results = RunAll(kSecret);
  ExpectResult(0, results[0]);  // what h1 sent arrived intact
  ASSERT_FALSE(results[1].ok());
  EXPECT_EQ(results[1].status().code(), absl::StatusCode::kDataLoss) << results[1].status();
  EXPECT_THAT(std::string(results[1].status().message()),
              ::testing::HasSubstr("from source host \"h0\""));
  ExpectNothingLeft(1);
}

TEST_F(DeviceCommStepsTest, CancelledWhileMovingLeavesNothing) {
  MakeCommHosts(2);
  FillOldRanks();
  std::atomic<bool> cancel{false};
  const std::vector<Result> results =
      RunAll(kSecret, [&] { return cancel.load(); }, [&](const std::string& what) {
        if (what == "cross-host steps (device communicator)") cancel = true;
      });
  for (int h = 0; h < 2; ++h) {
    ASSERT_FALSE(results[h].ok()) << h;
    EXPECT_EQ(results[h].status().code(), absl::StatusCode::kCancelled) << results[h].status();
    ExpectNothingLeft(h);
  }
}

}  // namespace
}  // namespace reshard::agent::executor_testing
