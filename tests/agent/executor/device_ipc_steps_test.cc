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

#include "agent/transfer/backend.h"
#include "agent/transfer/fake_comm.h"
#include "tests/agent/executor/device_hosts_fixture.h"

namespace reshard::agent::executor_testing {
namespace {

const std::string kSecret(32, 's');

class DeviceIpcStepsTest : public DeviceHostsTest {
 protected:
  // `n` hosts with the fake communicator and device IPC on, but for
  // `without_ipc_`: --device-ipc none, which then advertises no IPC entry.
  void MakeIpcHosts(int n) {
    for (int i = 0; i < n; ++i) {
      const bool ipc = "h" + std::to_string(i) != without_ipc_;
      AddDeviceHost([](FakeDeviceApi* api) { return std::make_unique<FakeCommFactory>(api); },
                    [ipc](TaskExecutor::Options& eo) { eo.device_ipc = ipc; });
    }
  }

  // Every peer advertises "ucx", "fake-nccl" and its IPC entry (but
  // `without_ipc_`).
  void Advertise(size_t host, v1::PeerHost* p) override {
    p->add_transports("ucx");
    p->add_transports("fake-nccl");
    if (p->host_id() != without_ipc_) p->add_transports(DeviceIpcEntry(*apis_[host]));
  }

  std::string without_ipc_;
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
  MakeIpcHosts(2);
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
