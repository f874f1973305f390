// Cross-host steps over a device communicator (device_comm_steps.h) on fake
// devices with the fake communicator, between hosts with real UCX transports
// on loopback (proofs, communicator id, step seals): two and three hosts
// whose new device buffers equal the global tensors byte for byte (and
// checksum for checksum); a host-resident source moved over the
// communicator, its new buffers back in host memory; a host without a
// communicator makes every host host-staged, saying why; bytes altered in
// flight fail the receiver (DATA_LOSS); a host with another secret fails the
// task on both; a cancelled task leaves nothing, even while a transfer waits
// on a stalled peer. The device routes' movers (device_cross_host.h): each
// route's is the one MoverFor picks for device memory; a cancel before the
// move or in the middle of it leaves no byte behind.
#include "agent/executor/device_comm_steps.h"

#include <atomic>
#include <future>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "agent/executor/device_ipc_steps.h"
#include "agent/executor/precopy_check.h"
#include "agent/executor/task_run.h"
#include "agent/executor/transfer_tags.h"
#include "agent/transfer/fake_comm.h"
#include "tests/agent/executor/device_hosts_fixture.h"

namespace reshard::agent::executor_testing {
namespace {

// A communicator that runs `before(n)` / `after(n)` around its n-th
// GroupEnd (from 1), then `landed` on each of the group's receives (in
// stream order, after the bytes arrived: e.g. to alter them), and returns
// `end(n)` when the inner one succeeded (a GroupEnd that fails after
// queueing); `gone()` when it is destroyed; on Abort, `aborted(live)` with
// whether every buffer it was given to receive into is still allocated, and
// passes the abort on only when `abortable()` (a hung process aborts
// nothing). Its factory runs `init()` before each Init.
struct CommHooks {
  std::function<void()> init = [] {};
  std::function<void(int)> before = [](int) {};
  std::function<void(int)> after = [](int) {};
  std::function<absl::Status(DeviceApi*, void* data, DeviceStream)> landed = nullptr;
  std::function<absl::Status(int)> end = [](int) { return absl::OkStatus(); };
  std::function<void()> gone = [] {};
  std::function<void(bool live)> aborted = [](bool) {};
  std::function<bool()> abortable = [] { return true; };
};

class HookedComm : public DeviceComm {
 public:
  HookedComm(std::unique_ptr<DeviceComm> inner, CommHooks hooks, DeviceApi* api)
      : inner_(std::move(inner)), hooks_(std::move(hooks)), api_(api) {}
  ~HookedComm() override {
    inner_.reset();
    hooks_.gone();
  }
  int rank() const override { return inner_->rank(); }
  int nranks() const override { return inner_->nranks(); }
  int device() const override { return inner_->device(); }
  absl::Status Send(const void* data, size_t bytes, int peer, DeviceStream stream) override {
    return inner_->Send(data, bytes, peer, stream);
  }
  absl::Status Recv(void* data, size_t bytes, int peer, DeviceStream stream) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      received_into_.insert(data);
    }
    group_receives_.emplace_back(data, stream);
    return inner_->Recv(data, bytes, peer, stream);
  }
  absl::Status GroupStart() override { return inner_->GroupStart(); }
  absl::Status GroupEnd() override {
    ++ends_;
    hooks_.before(ends_);
    absl::Status s = inner_->GroupEnd();
    hooks_.after(ends_);
    for (const auto& [data, stream] : group_receives_) {
      if (s.ok() && hooks_.landed) s = hooks_.landed(api_, data, stream);
    }
    group_receives_.clear();
    return s.ok() ? hooks_.end(ends_) : s;
  }
  void Abort() override {
    bool live = true;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (void* p : received_into_) live &= api_->AllocationSize(device(), p).ok();
    }
    hooks_.aborted(live);
    if (hooks_.abortable()) inner_->Abort();
  }

 private:
  std::unique_ptr<DeviceComm> inner_;
  CommHooks hooks_;
  DeviceApi* api_;
  int ends_ = 0;
  std::vector<std::pair<void*, DeviceStream>> group_receives_;  // since the last GroupEnd
  std::mutex mu_;  // Abort may come from the watchdog's thread
  std::set<void*> received_into_;
};

class HookedCommFactory : public FakeCommFactory {
 public:
  HookedCommFactory(FakeDeviceApi* api, CommHooks hooks)
      : FakeCommFactory(api), hooks_(std::move(hooks)), api_(api) {}
  absl::StatusOr<std::unique_ptr<DeviceComm>> Init(
      const std::string& id, int nranks, int rank, int device,
      const std::function<bool()>& cancelled,
      std::chrono::steady_clock::time_point deadline) override {
    hooks_.init();
    auto c = FakeCommFactory::Init(id, nranks, rank, device, cancelled, deadline);
    if (!c.ok()) return c.status();
    return std::unique_ptr<DeviceComm>(std::make_unique<HookedComm>(*std::move(c), hooks_, api_));
  }

 private:
  CommHooks hooks_;
  FakeDeviceApi* api_;
};

// Receives land with their first byte zeroed: bytes altered in flight.
CommHooks Altering() {
  CommHooks hooks;
  hooks.landed = [](DeviceApi* api, void* data, DeviceStream stream) {
    return api->MemsetAsync(data, 0, 1, stream);
  };
  return hooks;
}

class DeviceCommStepsTest : public DeviceHostsTest {
 protected:
  // `n` hosts with the fake communicator (none on `without_comm`, an
  // altering one on `altering`).
  void MakeCommHosts(int n, const std::string& without_comm = "",
                     const std::string& altering = "") {
    for (int i = 0; i < n; ++i) {
      const std::string id = "h" + std::to_string(i);
      AddDeviceHost(
          [&](FakeDeviceApi* api) -> std::unique_ptr<DeviceCommFactory> {
            if (id == without_comm) return nullptr;
            if (id == altering) return std::make_unique<HookedCommFactory>(api, Altering());
            return std::make_unique<FakeCommFactory>(api);
          },
          [](TaskExecutor::Options& eo) { eo.device_comm_why_not = "NCCL not loaded: test"; });
    }
  }

  void MakeRouteHosts(int n) override { MakeCommHosts(n); }

  // Two hosts with the hooked communicator, rank 0 of two halves on each,
  // resized to a whole rank on each: the halves cross both ways, in many
  // rounds (a window per chunk).
  void MakeHookedHosts(const CommHooks& h0, const CommHooks& h1) {
    for (const CommHooks* hooks : {&h0, &h1}) {
      ASSERT_NO_FATAL_FAILURE(AddDeviceHost(
          [hooks](FakeDeviceApi* api) -> std::unique_ptr<DeviceCommFactory> {
            return std::make_unique<HookedCommFactory>(api, *hooks);
          },
          [](TaskExecutor::Options& eo) { eo.peer_window_bytes = eo.chunk_bytes; }));
    }
    from_ = MakeLayoutOnHosts(2, 1, 1, 1);  // h0: 0, h1: 1 (a half each)
    to_ = MakeLayoutOnHosts(1, 1, 2, 1);    // h0: 0, h1: 1 (whole)
    old_world_ = 2;
    ASSERT_NO_FATAL_FAILURE(FillOldRanks());
  }

  // Peers advertise "fake-nccl" when they have a communicator.
  void Advertise(size_t, v1::PeerHost* p) override {
    p->add_transports("ucx");
    if (factories_[HostOf(p->host_id())]) p->add_transports("fake-nccl");
  }
};

TEST(AdvertisedCommNameTest, TheFakeIsFakeNccl) {
  FakeDeviceApi api(FakeDeviceApi::Options{1, 1 << 20});
  FakeCommFactory f(&api);
  EXPECT_EQ(AdvertisedCommName(f), "fake-nccl");
}

TEST_F(DeviceCommStepsTest, TwoHostsMoveDeviceBuffersOverTheCommunicator) {
  ASSERT_NO_FATAL_FAILURE(ExpectHostsMoveOver("device communicator"));
  for (int h = 0; h < 2; ++h) EXPECT_TRUE(Waited(h, "step seals")) << h;
}

TEST_F(DeviceCommStepsTest, TheHostCopiesArePinnedOnceForTheAgentsLife) {
  // The sealed windows' host copies and the seals' staging are pinned host
  // memory from the device store's pool: a second operation on the same
  // agents registers none (the fake device counts cudaMallocHost calls).
  ASSERT_NO_FATAL_FAILURE(ExpectHostsMoveOver("device communicator"));
  std::vector<int64_t> first;
  for (int h = 0; h < 2; ++h) {
    first.push_back(apis_[h]->host_registrations());
    EXPECT_GT(first[h], 0) << h;  // the first run registered its staging
    devices_[h]->DropGeneration(kJob, 2);
  }
  const std::vector<Result> again = RunAll(kSecret);
  for (int h = 0; h < 2; ++h) {
    ASSERT_NO_FATAL_FAILURE(ExpectResult(h, again[h]));
    EXPECT_EQ(apis_[h]->host_registrations(), first[h]) << h;
    EXPECT_EQ(devices_[h]->pinned().registrations(), first[h]) << h;
  }
}

TEST_F(DeviceCommStepsTest, ThreeHostsInACycleMoveOverOneCommunicator) {
  ExpectThreeHostsInACycleMoveOver("device communicator");
}

TEST_F(DeviceCommStepsTest, HostResidentSourcesGoOverTheCommunicatorAndStayInHostMemory) {
  ExpectHostResidentSourcesMoveOver("device communicator", 0);
}

TEST_F(DeviceCommStepsTest, AJobWithItsStateInHostMemoryStaysOffTheCommunicator) {
  ExpectHostStateStaysOffTheRoute("device communicator");
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
  ExpectAnotherSecretFailsTheTaskOnBoth();
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
  ExpectCancelledWhileWaitingLeavesNothing("cross-host steps (device communicator)");
}

// A transfer that waits on a stalled peer (its process hung: on NCCL the
// stream never completes) still ends when the task is cancelled: a watchdog
// aborts the communicator. h1 stalls before issuing its second round; h0
// issues it, is cancelled while it waits, and must return while h1 is still
// stalled.
TEST_F(DeviceCommStepsTest, ACancelEndsATransferThatWaitsOnAStalledPeer) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<void> h0_done;
  std::atomic<bool> h0_waits{false}, h1_stalled{false};
  CommHooks h0_hooks, h1_hooks;
  h0_hooks.after = [&](int n) {
    if (n == 2) h0_waits = true;  // round 2 issued: h0 waits on h1 from here
  };
  h0_hooks.gone = [&] { h0_done.set_value(); };
  h1_hooks.before = [&, released](int n) {
    if (n == 2) {
      h1_stalled = true;
      released.wait();
    }
  };
  // A hung process aborts nothing (else h1's watchdog, around its GroupEnd,
  // would end h0's wait by closing the links).
  h1_hooks.abortable = [released] {
    return released.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  };
  ASSERT_NO_FATAL_FAILURE(MakeHookedHosts(h0_hooks, h1_hooks));
  // Cancelled once h0 waits on round 2 and h1 is stalled before it (h1,
  // stalled in the hook, polls nothing; h0 polls only through the watchdog).
  auto all = std::async(std::launch::async, [&] {
    return RunAll(kSecret, [&] { return h0_waits.load() && h1_stalled.load(); });
  });
  const bool h0_returned =
      h0_done.get_future().wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  release.set_value();
  const std::vector<Result> results = all.get();
  ASSERT_TRUE(h1_stalled.load()) << "h1 never reached its second round: "
                                 << (results[1].ok() ? "OK" : results[1].status().ToString())
                                 << " / h0: "
                                 << (results[0].ok() ? "OK" : results[0].status().ToString());
  ASSERT_TRUE(h0_returned) << "h0 still waited on the stalled h1 after 30 s";
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kCancelled) << results[0].status();
  ASSERT_FALSE(results[1].ok());  // its peer aborted, and the task is cancelled
  for (int h = 0; h < 2; ++h) ExpectNothingLeft(h);
}

// A GroupEnd that fails after queueing its transfers (h0's second round,
// whose receive waits on h1, stalled before that round): the communicator is
// aborted and the stream drained before the staging is freed (the transfer
// in flight would write freed memory; on CUDA the free would wait behind
// it), and the task fails with the GroupEnd's error while h1 is still
// stalled, leaving nothing.
TEST_F(DeviceCommStepsTest, AGroupEndFailingAfterQueueingAbortsBeforeFreeingTheStaging) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<void> h0_done;
  std::atomic<int> aborts{0};
  std::atomic<bool> live_at_first_abort{false};
  CommHooks h0_hooks, h1_hooks;
  h0_hooks.end = [](int n) {
    return n == 2 ? absl::InternalError("ncclGroupEnd: injected failure") : absl::OkStatus();
  };
  h0_hooks.aborted = [&](bool live) {
    if (aborts++ == 0) live_at_first_abort = live;
  };
  h0_hooks.gone = [&] { h0_done.set_value(); };
  h1_hooks.before = [released](int n) {
    if (n == 2) released.wait();
  };
  ASSERT_NO_FATAL_FAILURE(MakeHookedHosts(h0_hooks, h1_hooks));
  auto all = std::async(std::launch::async, [&] { return RunAll(kSecret); });
  const bool h0_returned =
      h0_done.get_future().wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  release.set_value();
  const std::vector<Result> results = all.get();
  ASSERT_TRUE(h0_returned) << "h0 waited on the stalled h1 after its GroupEnd failed";
  ASSERT_GT(aborts.load(), 0);
  EXPECT_TRUE(live_at_first_abort.load()) << "the staging was freed before the abort";
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kInternal) << results[0].status();
  EXPECT_THAT(std::string(results[0].status().message()), ::testing::HasSubstr("injected failure"));
  ASSERT_FALSE(results[1].ok());  // its peer aborted
  for (int h = 0; h < 2; ++h) ExpectNothingLeft(h);
}

// The communicator's device staging counts against the device store's
// limit: with device 0 of h0 full once its new buffers exist (reserved as
// it joins), the task fails there naming the staging, and nothing is left.
TEST_F(DeviceCommStepsTest, TheStagingIsChargedToTheDeviceLimit) {
  std::optional<DeviceReservation> filled;
  CommHooks filling;
  filling.init = [&] {
    DeviceBufferStore& d = *devices_[0];
    filled = d.Reserve(0, d.limit_bytes(0) - d.used_bytes(0), "the test").value();
  };
  AddDeviceHost([&](FakeDeviceApi* api) -> std::unique_ptr<DeviceCommFactory> {
    return std::make_unique<HookedCommFactory>(api, filling);
  });
  AddDeviceHost([](FakeDeviceApi* api) -> std::unique_ptr<DeviceCommFactory> {
    return std::make_unique<FakeCommFactory>(api);
  });
  FillOldRanks();
  const int64_t old_bytes = devices_[0]->used_bytes(0);
  const std::vector<Result> results = RunAll(kSecret);
  ASSERT_TRUE(filled.has_value());
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(results[0].status().code(), absl::StatusCode::kResourceExhausted)
      << results[0].status();
  EXPECT_THAT(std::string(results[0].status().message()),
              ::testing::HasSubstr("device 0: device communicator staging needs"));
  ASSERT_FALSE(results[1].ok());  // its peer aborted
  filled.reset();
  // The new buffers and the staging's reservation were given back.
  EXPECT_EQ(devices_[0]->used_bytes(0), old_bytes);
  for (int h = 0; h < 2; ++h) ExpectNothingLeft(h);
}

// Forwards to `inner`, and cancels it (Cancel of the run's tag base) once
// the first bytes of its transfer landed: a cancel in the middle of the move.
class CancellingMover : public Mover {
 public:
  explicit CancellingMover(Mover* inner) : inner_(inner) {}
  MoverCapabilities capabilities() const override { return inner_->capabilities(); }
  absl::Status Prepare(const std::string& host_id, const v1::HostTask& task,
                       const std::function<bool()>& cancelled) override {
    return inner_->Prepare(host_id, task, cancelled);
  }
  void Post(uint64_t id, MoverTransfer t) override {
    std::function<void(int64_t)> landed = std::move(t.landed);
    const uint64_t tag = t.tag;
    t.landed = [this, landed, tag](int64_t bytes) {
      if (landed) landed(bytes);
      landed_bytes += bytes;
      if (bytes > 0 && !cancelled) {
        cancelled = true;
        inner_->Cancel(tag, kTagKeyMask);
      }
    };
    inner_->Post(id, std::move(t));
  }
  void Poll(std::chrono::steady_clock::duration wait, std::deque<MoverCompletion>* out) override {
    inner_->Poll(wait, out);
  }
  void Cancel(uint64_t tag, uint64_t mask) override { inner_->Cancel(tag, mask); }

  int64_t landed_bytes = 0;
  bool cancelled = false;

 private:
  Mover* inner_;
};

// Each device route's mover states what it moves, and MoverFor picks it for
// device memory at both ends (the host mover stays the one of host memory);
// a device mover refuses to run without a transport, and to move a chunk
// instead of a run's steps; cancelled before its transfer starts, the
// transfer fails CANCELLED without moving a byte.
TEST_F(DeviceCommStepsTest, EachDeviceRouteGetsItsOwnMover) {
  ASSERT_NO_FATAL_FAILURE(MakeCommHosts(1));
  const TaskExecutor::Options eo;
  const v1::HostTask task;
  const std::function<bool()> never = [] { return false; };
  const std::function<void(const std::string&)> none;
  const std::string& h0 = hosts_[0].id;  // the movers hold references
  UcxHostMover ucx(hosts_[0].transport.get());
  DeviceCommMover comm(*devices_[0], *factories_[0], nullptr, eo, h0, task, never, none);
  DeviceIpcMover ipc(*hosts_[0].store, *devices_[0], nullptr, eo, h0, task, never, none);
  EXPECT_EQ(comm.capabilities().name, "fake-nccl");
  EXPECT_EQ(ipc.capabilities().name, "device-ipc");
  for (Mover* m : {static_cast<Mover*>(&comm), static_cast<Mover*>(&ipc)}) {
    EXPECT_TRUE(m->capabilities().remote);
    EXPECT_EQ(m->capabilities().memory_kinds, std::vector<MemoryKind>{MemoryKind::kCuda});
    EXPECT_EQ(MoverFor({&ucx, m}, MemoryKind::kCuda, MemoryKind::kCuda), m);
    EXPECT_EQ(MoverFor({m, &ucx}, MemoryKind::kHost, MemoryKind::kHost), &ucx);
    EXPECT_EQ(MoverFor({m}, MemoryKind::kHost, MemoryKind::kCuda), nullptr);
    const absl::Status prepared = m->Prepare(h0, task, never);
    EXPECT_EQ(prepared.code(), absl::StatusCode::kFailedPrecondition) << prepared;
    EXPECT_THAT(std::string(prepared.message()), ::testing::HasSubstr("no transport"));

    std::deque<MoverCompletion> done;
    m->Post(7, MoverTransfer{});  // a chunk, not a run's steps
    m->Poll(std::chrono::milliseconds(0), &done);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].first, 7u);
    EXPECT_EQ(done[0].second.code(), absl::StatusCode::kInvalidArgument) << done[0].second;
    done.clear();
    m->Poll(std::chrono::milliseconds(0), &done);
    EXPECT_TRUE(done.empty());  // reported once

    HostSteps hs;
    std::vector<DeviceRankBufferPtr> made;
    int64_t landed = 0;
    MoverTransfer t;
    t.steps = &hs;
    t.made = &made;
    t.landed = [&](int64_t bytes) { landed += bytes; };
    m->Post(8, std::move(t));
    m->Cancel(TagBase(TaskTagKey(task)), kTagKeyMask);
    m->Poll(std::chrono::milliseconds(0), &done);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].first, 8u);
    EXPECT_EQ(done[0].second.code(), absl::StatusCode::kCancelled) << done[0].second;
    EXPECT_EQ(landed, 0);
  }
}

// The device communicator's mover cancelled in the middle of its move (its
// Cancel, once the first round's bytes landed; the run's cancelled() never
// says so): TaskRun on the device route, which picks it over the host mover, fails
// CANCELLED and leaves no byte of the new generation in either memory; its
// peer, cancelled once it returned, leaves none either.
TEST_F(DeviceCommStepsTest, TheMoverCancelledMidMoveLeavesNoByteBehind) {
  ASSERT_NO_FATAL_FAILURE(MakeHookedHosts(CommHooks(), CommHooks()));
  v1::HostTask whole = WholeTask();
  whole.set_transfer_secret(kSecret);
  whole.set_device_resident(true);
  const auto addrs = Addresses();
  std::vector<v1::HostTask> tasks;
  for (size_t i = 0; i < hosts_.size(); ++i) {
    tasks.push_back(Slice(whole, hosts_[i].id, addrs));
    for (v1::PeerHost& p : *tasks.back().mutable_peers()) Advertise(i, &p);
  }
  std::atomic<bool> h0_done{false};
  std::future<Result> h1 = std::async(std::launch::async, [&] {
    return hosts_[1].executor->Execute(hosts_[1].id, tasks[1], nullptr,
                                       [&] { return h0_done.load(); });
  });
  const std::string& h0_id = hosts_[0].id;  // the mover holds a reference
  DeviceRoute route = RouteTask(*hosts_[0].store, *devices_[0], h0_id, tasks[0]);
  RouteOverDeviceComm(*devices_[0], factories_[0].get(), "", h0_id, tasks[0], &route);
  ASSERT_EQ(route.kind, DeviceRoute::Kind::kDeviceComm);
  TaskExecutor::Options eo;  // as MakeHookedHosts' hosts
  eo.copy_threads = 2;
  eo.chunk_bytes = 4 << 10;
  eo.peer_window_bytes = eo.chunk_bytes;
  eo.proof_timeout_ms = 3000;
  eo.seal_timeout_ms = 10000;
  const std::function<bool()> never = [] { return false; };
  const std::function<void(const std::string&)> none;
  DeviceCommMover comm(*devices_[0], *factories_[0], hosts_[0].transport.get(), eo, h0_id, tasks[0],
                       never, none);
  CancellingMover mover(&comm);
  UcxHostMover ucx(hosts_[0].transport.get());
  LocalCopier copier(eo.copy_threads);
  PrecopyRecords precopies;
  TaskRun::Executor ex{hosts_[0].store.get(), hosts_[0].transport.get(), &eo, &copier, &precopies};
  ex.devices = devices_[0].get();
  ex.route = &route;
  ex.movers = {&ucx, &mover};
  const std::function<void(int64_t, int64_t)> no_progress;
  const Result h0 = TaskRun(ex, h0_id, tasks[0], no_progress, never, none).Run();
  h0_done = true;
  const Result r1 = h1.get();
  EXPECT_TRUE(mover.cancelled);
  EXPECT_GT(mover.landed_bytes, 0);  // in the middle of the move
  ASSERT_FALSE(h0.ok());
  EXPECT_EQ(h0.status().code(), absl::StatusCode::kCancelled) << h0.status();
  EXPECT_FALSE(r1.ok());
  for (int h = 0; h < 2; ++h) ExpectNothingLeft(h);
}

}  // namespace
}  // namespace reshard::agent::executor_testing
