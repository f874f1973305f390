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

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <future>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/executor/transfer_tags.h"
#include "agent/transfer/backend.h"
#include "agent/transfer/fake_comm.h"
#include "tests/agent/executor/device_hosts_fixture.h"

namespace reshard::agent::executor_testing {
namespace {

class DeviceIpcStepsTest : public DeviceHostsTest {
 protected:
  // `n` hosts with the fake communicator and device IPC on, but for
  // `without_ipc_`: --device-ipc none, which then advertises no IPC entry.
  void MakeRouteHosts(int n) override {
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

// The inode of this process's namespace `kind`, from stat (not readlink,
// as DeviceIpcEntry reads it).
std::string NamespaceInodeOf(const std::string& kind) {
  struct stat st{};
  EXPECT_EQ(stat(("/proc/self/ns/" + kind).c_str(), &st), 0) << kind;
  return std::to_string(st.st_ino);
}

TEST(DeviceIpcEntryTest, TheFakeAdvertisesItsBootIdAndNamespaces) {
  FakeDeviceApi api(FakeDeviceApi::Options{1, 1 << 20});
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  ASSERT_TRUE(std::getline(f, boot_id));
  boot_id.erase(std::remove(boot_id.begin(), boot_id.end(), '-'), boot_id.end());
  const std::string entry =
      "fake-ipc:" + boot_id + ":" + NamespaceInodeOf("pid") + ":" + NamespaceInodeOf("ipc");
  EXPECT_EQ(DeviceIpcEntry(api), entry);
  EXPECT_LE(entry.size(), 64u);  // the coordinator's limit of a transport name
  std::vector<std::string> names = AdvertisedTransports(LoadedBackends(nullptr, &api, nullptr));
  EXPECT_NE(std::find(names.begin(), names.end(), entry), names.end());
  names = AdvertisedTransports(LoadedBackends(nullptr, &api, nullptr, /*device_ipc=*/false));
  EXPECT_EQ(std::find(names.begin(), names.end(), entry), names.end());
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

TEST(DeviceIpcMessageTest, ADoneOfAnotherNonceIsRefused) {
  const std::string nonce(16, '\x01'), earlier(16, '\x02');
  auto m = MakeDeviceIpcMessage(kSecret, "op-1", "h1", "h0", DeviceIpcDonePayload(earlier),
                                DeviceIpcMessageBytes(0, 2));
  ASSERT_TRUE(m.ok()) << m.status();
  auto done = CheckDeviceIpcMessage(kSecret, "op-1", *m);  // the MAC checks: same operation
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(CheckDeviceIpcDone("op-1", *done, earlier).ok());
  absl::Status stale = CheckDeviceIpcDone("op-1", *done, nonce);
  ASSERT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
  EXPECT_THAT(std::string(stale.message()), ::testing::HasSubstr("host \"h1\""));
  done->payload = "done";  // the nonce-less "done" of before
  EXPECT_EQ(CheckDeviceIpcDone("op-1", *done, nonce).code(), absl::StatusCode::kFailedPrecondition);
  done->payload = "handles";
  EXPECT_EQ(CheckDeviceIpcDone("op-1", *done, nonce).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DeviceIpcStepsTest, TwoHostsMoveDeviceBuffersThroughIpcHandles) {
  ASSERT_NO_FATAL_FAILURE(ExpectHostsMoveOver("cross-host steps (device IPC)"));
  for (int h = 0; h < 2; ++h) EXPECT_FALSE(Waited(h, "device communicator")) << h;
}

TEST_F(DeviceIpcStepsTest, ThreeHostsInACycle) {
  ExpectThreeHostsInACycleMoveOver("cross-host steps (device IPC)");
}

TEST_F(DeviceIpcStepsTest, HostResidentSourcesAreStagedForTheRunAndDropped) {
  ASSERT_NO_FATAL_FAILURE(ExpectHostResidentSourcesMoveOver("cross-host steps (device IPC)", 1));
  // The device copies of h0's sources for the run are gone.
  EXPECT_TRUE(devices_[0]->List().empty());
}

TEST_F(DeviceIpcStepsTest, AJobWithItsStateInHostMemoryStaysOffIpc) {
  ExpectHostStateStaysOffTheRoute("cross-host steps (device IPC)");
}

TEST_F(DeviceIpcStepsTest, APeerWithoutTheEntryMakesEveryHostTakeTheCommunicator) {
  without_ipc_ = "h1";  // --device-ipc none (or another machine: another entry)
  MakeRouteHosts(2);
  FillOldRanks();
  const std::vector<Result> results = RunAll(kSecret);
  for (int h = 0; h < 2; ++h) {
    ExpectResult(h, results[h]);
    EXPECT_TRUE(Waited(h, "device communicator")) << h;
    EXPECT_FALSE(Waited(h, "cross-host steps (device IPC)")) << h;
  }
}

TEST_F(DeviceIpcStepsTest, AHostWithAnotherSecretFailsTheTaskOnBoth) {
  ExpectAnotherSecretFailsTheTaskOnBoth();
}

TEST_F(DeviceIpcStepsTest, ASenderThatNeverSendsIsUnavailableNamingIt) {
  MakeRouteHosts(2);
  FillOldRanks();
  // No secret (no proofs): h0 runs alone and waits for h1's handles.
  const std::vector<Result> results = RunAll("", [] { return false; }, nullptr, {0});
  ASSERT_EQ(results[0].status().code(), absl::StatusCode::kUnavailable) << results[0].status();
  EXPECT_THAT(std::string(results[0].status().message()),
              ::testing::HasSubstr("no IPC handles came from host \"h1\""));
  ExpectNothingLeft(0);
}

TEST_F(DeviceIpcStepsTest, CancelledWhileWaitingLeavesNothing) {
  ExpectCancelledWhileWaitingLeavesNothing("device IPC handles");
}

// h0's handles message, MACed with the task's secret (""), but listing
// each old rank h1 reads with the first item of rank `tampered` moved by
// 64 bytes (inside the allocation: only the layout check sees it).
TEST_F(DeviceIpcStepsTest, ATamperedOffsetFailsTheReceiverWithoutCopying) {
  MakeRouteHosts(2);
  FillOldRanks();
  const v1::HostTask whole = WholeTask();  // secret "", as RunAll("") runs it
  const auto old_slots = planner::ExpandPlacement(from_.placement());
  const auto new_slots = planner::ExpandPlacement(to_.placement());
  std::set<int> reads;  // old ranks of h0 that h1 reads
  for (const v1::CopyStep& step : whole.plan().steps()) {
    if (old_slots[step.src_rank()].host() == "h0" &&
        new_slots[step.dsts(0).rank()].host() == "h1") {
      reads.insert(step.src_rank());
    }
  }
  ASSERT_FALSE(reads.empty());
  const int tampered = *reads.begin();
  std::string payload = "nonce " + absl::BytesToHexString(std::string(16, '\x07')) + "\n";
  for (int r : reads) {
    auto buf = devices_[0]->Get({kJob, 1, r});
    ASSERT_TRUE(buf.ok()) << buf.status();
    auto handle = apis_[0]->IpcExport((*buf)->device(), (*buf)->data());
    ASSERT_TRUE(handle.ok()) << handle.status();
    std::vector<int64_t> offsets;
    for (const ItemSlot& item : (*buf)->items()) offsets.push_back(item.offset);
    if (r == tampered) offsets[0] += 64;
    payload +=
        absl::StrCat(r, " ", (*buf)->device(), " ", (*buf)->size(), " ",
                     absl::BytesToHexString(*handle), " ", absl::StrJoin(offsets, ","), "\n");
  }
  auto message = MakeDeviceIpcMessage(
      "", whole.operation_id(), "h0", "h1", payload,
      DeviceIpcMessageBytes(reads.size(), ptc_.tensors_size() + ptc_.blobs_size()));
  ASSERT_TRUE(message.ok()) << message.status();
  auto chunk = DeviceIpcChunk(0, false);
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  auto tag = TransferTag(TaskTagKey(whole), kProofStepIndex, *chunk);
  ASSERT_TRUE(tag.ok()) << tag.status();
  ASSERT_TRUE(hosts_[0].transport->Connect("h1", hosts_[1].transport->LocalAddress()).ok());
  std::promise<absl::Status> sent;
  bool sending = false;
  // h1 runs alone; "h0" sends the message once h1 waits for handles.
  const std::vector<Result> results = RunAll(
      "", [] { return false; },
      [&](const std::string& w) {
        if (w != "device IPC handles" || sending) return;
        sending = true;
        hosts_[0].transport->Send("h1", *tag, message->data(), message->size(),
                                  [&](absl::Status st) { sent.set_value(st); });
      },
      {1});
  ASSERT_TRUE(sending);
  EXPECT_TRUE(sent.get_future().get().ok());
  ASSERT_EQ(results[0].status().code(), absl::StatusCode::kInvalidArgument) << results[0].status();
  EXPECT_THAT(std::string(results[0].status().message()),
              ::testing::HasSubstr(absl::StrCat("host \"h0\" listed old rank ", tampered, " as ")));
  EXPECT_FALSE(Waited(1, "cross-host steps (device IPC)"));  // nothing was copied
  ExpectNothingLeft(1);
}

}  // namespace
}  // namespace reshard::agent::executor_testing
