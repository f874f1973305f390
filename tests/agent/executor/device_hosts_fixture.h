// Hosts with fake devices for the cross-host device route tests
// (device_comm_steps_test.cc, device_ipc_steps_test.cc): each host has two
// fake devices, a device store, a device communicator (or none) and an
// executor that cuts steps into small chunks and windows (many rounds),
// with a real UCX transport on loopback; old ranks filled on their devices
// (or in host memory), every host's slice run at once, and the new
// generation checked byte for byte and checksum for checksum. The bodies
// both routes' tests share take the route's wait as a parameter, over the
// hosts the test's MakeRouteHosts adds.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/device/fake_device.h"
#include "agent/shard_store/device_buffer.h"
#include "agent/shard_store/device_staging.h"
#include "agent/transfer/device_comm.h"
#include "tests/agent/executor/executor_fixture.h"

namespace reshard::agent::executor_testing {

// The transfer secret of the route tests' tasks.
inline const std::string kSecret(32, 's');

class DeviceHostsTest : public ExecutorTest {
 protected:
  using Result = absl::StatusOr<std::vector<v1::ShardChecksum>>;

  void TearDown() override {
    for (auto& h : hosts_) h.executor.reset();
    devices_.clear();
    factories_.clear();
    ExecutorTest::TearDown();
    apis_.clear();
  }

  // Adds host "h<index>" with `comm(api)` as its communicator factory (may
  // return null); `tweak` adjusts its executor's options.
  void AddDeviceHost(
      const std::function<std::unique_ptr<DeviceCommFactory>(FakeDeviceApi*)>& comm,
      const std::function<void(TaskExecutor::Options&)>& tweak = nullptr) {
    Host h;
    h.id = "h" + std::to_string(hosts_.size());
    h.dir = fs::temp_directory_path() /
            ("reshard-device-hosts-test-" + std::to_string(getpid()) + "-" + h.id);
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
    factories_.push_back(comm(apis_.back().get()));
    TaskExecutor::Options eo;
    eo.copy_threads = 2;
    eo.chunk_bytes = 4 << 10;
    eo.peer_window_bytes = 12 << 10;
    eo.proof_timeout_ms = 3000;
    eo.seal_timeout_ms = 10000;
    if (tweak) tweak(eo);
    h.executor = std::make_unique<TaskExecutor>(h.store.get(), h.transport.get(), eo,
                                                devices_.back().get(), factories_.back().get());
    hosts_.push_back(std::move(h));
  }

  // What host `host` sees peer `p` advertise (beside its address).
  virtual void Advertise(size_t host, v1::PeerHost* p) = 0;

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

  // Runs the slices of the hosts `run` (default: every host) at once, each
  // peer advertising what Advertise says; secrets_[i], when set, replaces
  // host i's secret. Results in `run` order.
  std::vector<Result> RunAll(const std::string& secret,
                             const std::function<bool()>& cancelled = [] { return false; },
                             const std::function<void(const std::string&)>& on_wait = nullptr,
                             std::vector<size_t> run = {}) {
    v1::HostTask whole = WholeTask();
    whole.set_transfer_secret(secret);
    whole.set_device_resident(device_resident_);
    const auto addrs = Addresses();
    waits_.assign(hosts_.size(), {});
    if (run.empty()) {
      for (size_t i = 0; i < hosts_.size(); ++i) run.push_back(i);
    }
    std::vector<std::future<Result>> runs;
    for (size_t i : run) {
      Host& h = hosts_[i];
      v1::HostTask task = Slice(whole, h.id, addrs);
      for (v1::PeerHost& p : *task.mutable_peers()) Advertise(i, &p);
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

  // The bodies the route tests share (device_comm_steps_test.cc,
  // device_ipc_steps_test.cc), each run over the hosts MakeRouteHosts adds;
  // `route` is the wait that shows a host moved its bytes over the route.

  // Adds `n` hosts that take the test's route (when every host can).
  virtual void MakeRouteHosts(int n) = 0;

  // `n` hosts, every old rank on a device, run with kSecret: each host's new
  // device buffers equal the global tensors, and each host waited on `route`
  // and on nothing host-staged.
  void ExpectHostsMoveOver(const std::string& route, int n = 2) {
    ASSERT_NO_FATAL_FAILURE(MakeRouteHosts(n));
    ASSERT_NO_FATAL_FAILURE(FillOldRanks());
    const std::vector<Result> results = RunAll(kSecret);
    for (int h = 0; h < n; ++h) {
      ASSERT_NO_FATAL_FAILURE(ExpectResult(h, results[h]));
      EXPECT_TRUE(Waited(h, route)) << h;
      for (const std::string& w : waits_[h]) {
        EXPECT_EQ(w.rfind("host-staged", 0), std::string::npos) << h << ": " << w;
      }
    }
  }

  // Three hosts in a cycle (each host's new rank reads the old ranks of two
  // hosts), as ExpectHostsMoveOver.
  void ExpectThreeHostsInACycleMoveOver(const std::string& route) {
    from_ = MakeLayoutOnHosts(2, 1, 3, 2);  // h0: 0-1, h1: 2-3, h2: 4-5
    to_ = MakeLayoutOnHosts(1, 1, 3, 1);    // h0: 0, h1: 1, h2: 2
    ExpectHostsMoveOver(route, 3);
  }

  // Two hosts, h0's old ranks in host memory, h1's on devices, run without
  // a secret (no proofs, no seals): h0's new buffers stay in host memory,
  // h1's are on its devices, host `waiter` waited on `route`, and h0's
  // sources are untouched.
  void ExpectHostResidentSourcesMoveOver(const std::string& route, int waiter) {
    ASSERT_NO_FATAL_FAILURE(MakeRouteHosts(2));
    ASSERT_NO_FATAL_FAILURE(FillOldRanks("h0"));
    const std::vector<Result> results = RunAll("");
    ASSERT_NO_FATAL_FAILURE(ExpectResult(0, results[0], /*in_host=*/true));
    ASSERT_NO_FATAL_FAILURE(ExpectResult(1, results[1]));
    EXPECT_TRUE(Waited(waiter, route)) << waiter;
    EXPECT_TRUE(hosts_[0].store->Get({kJob, 1, 0}).ok());
  }

  // Two hosts that take the route, every old rank on a device, but the job
  // declares its state in host memory (task.device_resident false): every
  // host is host-staged, naming why, and its new buffers still end on its
  // devices, equal to the global tensors.
  void ExpectHostStateStaysOffTheRoute(const std::string& route) {
    ASSERT_NO_FATAL_FAILURE(MakeRouteHosts(2));
    ASSERT_NO_FATAL_FAILURE(FillOldRanks());
    device_resident_ = false;
    const std::vector<Result> results = RunAll(kSecret);
    for (int h = 0; h < 2; ++h) {
      ASSERT_NO_FATAL_FAILURE(ExpectResult(h, results[h]));
      ASSERT_FALSE(waits_[h].empty()) << h;
      EXPECT_EQ(waits_[h][0],
                "host-staged: cross-host steps move host memory (the job's state_memory is not "
                "DEVICE)")
          << h;
      EXPECT_FALSE(Waited(h, route)) << h;
    }
  }

  // Two hosts, h1's task with another secret: both fail DEADLINE_EXCEEDED (the
  // other secret derives other tags: no proof ever arrives), leaving nothing.
  void ExpectAnotherSecretFailsTheTaskOnBoth() {
    ASSERT_NO_FATAL_FAILURE(MakeRouteHosts(2));
    ASSERT_NO_FATAL_FAILURE(FillOldRanks());
    secrets_ = {kSecret, std::string(32, 'x')};
    const std::vector<Result> results = RunAll(kSecret);
    for (int h = 0; h < 2; ++h) {
      ASSERT_FALSE(results[h].ok()) << h;
      EXPECT_EQ(results[h].status().code(), absl::StatusCode::kDeadlineExceeded)
          << results[h].status();
      ExpectNothingLeft(h);
    }
  }

  // Two hosts, the task cancelled once an executor waits on `wait`: both
  // are CANCELLED, leaving nothing.
  void ExpectCancelledWhileWaitingLeavesNothing(const std::string& wait) {
    ASSERT_NO_FATAL_FAILURE(MakeRouteHosts(2));
    ASSERT_NO_FATAL_FAILURE(FillOldRanks());
    std::atomic<bool> cancel{false};
    const std::vector<Result> results = RunAll(
        kSecret, [&] { return cancel.load(); },
        [&](const std::string& what) {
          if (what == wait) cancel = true;
        });
    for (int h = 0; h < 2; ++h) {
      ASSERT_FALSE(results[h].ok()) << h;
      EXPECT_EQ(results[h].status().code(), absl::StatusCode::kCancelled) << results[h].status();
      ExpectNothingLeft(h);
    }
  }

  std::vector<std::unique_ptr<FakeDeviceApi>> apis_;
  std::vector<std::unique_ptr<DeviceBufferStore>> devices_;
  std::vector<std::unique_ptr<DeviceCommFactory>> factories_;
  std::vector<std::vector<std::string>> waits_;
  std::vector<std::string> secrets_;
  bool device_resident_ = true;  // RunAll's task.device_resident
  int old_world_ = 6;
};

}  // namespace reshard::agent::executor_testing
