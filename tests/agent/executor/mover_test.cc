// The mover seam (mover.h): which mover a step's memory kinds get, and the
// UCX host mover's post / poll / cancel over a transport that records what
// it was asked and completes when the test says (unit).
#include "agent/executor/mover.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

namespace reshard::agent {
namespace {

// Holds each transfer's callback until Complete(tag).
class RecordingTransport : public Transport {
 public:
  std::string name() const override { return "ucx"; }
  std::string LocalAddress() const override { return ""; }
  absl::Status Connect(const std::string& peer, const std::string& address) override {
    connected[peer] = address;
    return absl::OkStatus();
  }
  void Send(const std::string& peer, uint64_t tag, const void*, size_t bytes,
            TransferDone done) override {
    log.push_back("send " + peer + " " + std::to_string(tag) + " " + std::to_string(bytes));
    pending[tag] = std::move(done);
  }
  void Receive(uint64_t tag, void*, size_t bytes, TransferDone done) override {
    log.push_back("receive " + std::to_string(tag) + " " + std::to_string(bytes));
    pending[tag] = std::move(done);
  }
  void CancelTags(uint64_t tag, uint64_t mask) override {
    log.push_back("cancel " + std::to_string(tag) + " " + std::to_string(mask));
  }
  void Shutdown() override {}
  void Complete(uint64_t tag, absl::Status s) {
    TransferDone done = std::move(pending.at(tag));
    pending.erase(tag);
    done(std::move(s));
  }

  std::map<std::string, std::string> connected;
  std::vector<std::string> log;
  std::map<uint64_t, TransferDone> pending;
};

TEST(MoverTest, HostStepsGetTheUcxMoverAndDeviceStepsNone) {
  RecordingTransport t;
  UcxHostMover ucx(&t);
  EXPECT_EQ(ucx.capabilities().name, "ucx");
  EXPECT_TRUE(ucx.capabilities().remote);
  EXPECT_EQ(MoverFor({&ucx}, MemoryKind::kHost, MemoryKind::kHost), &ucx);
  EXPECT_EQ(MoverFor({&ucx}, MemoryKind::kCuda, MemoryKind::kHost), nullptr);
  EXPECT_EQ(MoverFor({&ucx}, MemoryKind::kHost, MemoryKind::kCuda), nullptr);
  EXPECT_EQ(MoverFor({}, MemoryKind::kHost, MemoryKind::kHost), nullptr);
}

TEST(MoverTest, PrepareConnectsEveryPeerButThisHost) {
  RecordingTransport t;
  UcxHostMover ucx(&t);
  v1::HostTask task;
  for (const char* h : {"h0", "h1", "h2"}) {
    v1::PeerHost* p = task.add_peers();
    p->set_host_id(h);
    p->set_ucx_address(std::string("addr-") + h);
  }
  task.add_peers()->set_host_id("h3");  // no address: not connected
  ASSERT_TRUE(ucx.Prepare("h1", task, nullptr).ok());
  EXPECT_EQ(t.connected,
            (std::map<std::string, std::string>{{"h0", "addr-h0"}, {"h2", "addr-h2"}}));
}

TEST(MoverTest, EachCompletionIsPolledOnceAndHoldsItsBuffersUntilThen) {
  RecordingTransport t;
  UcxHostMover ucx(&t);
  auto held = std::make_shared<int>(5);
  std::weak_ptr<int> watch = held;
  MoverTransfer send;
  send.is_send = true;
  send.peer = "h2";
  send.tag = 11;
  send.bytes = 64;
  send.hold = std::move(held);
  ucx.Post(1, std::move(send));
  MoverTransfer receive;
  receive.tag = 12;
  receive.bytes = 32;
  ucx.Post(2, std::move(receive));
  EXPECT_EQ(t.log, (std::vector<std::string>{"send h2 11 64", "receive 12 32"}));
  std::deque<MoverCompletion> got;
  ucx.Poll(std::chrono::steady_clock::duration::zero(), &got);
  EXPECT_TRUE(got.empty());
  EXPECT_FALSE(watch.expired());  // the transport may still read it
  t.Complete(11, absl::OkStatus());
  EXPECT_TRUE(watch.expired());
  // A completion from another thread wakes a waiting Poll.
  std::thread late([&] { t.Complete(12, absl::DataLossError("truncated")); });
  while (got.size() < 2) ucx.Poll(std::chrono::seconds(5), &got);
  late.join();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].first, 1u);
  EXPECT_TRUE(got[0].second.ok());
  EXPECT_EQ(got[1].first, 2u);
  EXPECT_EQ(got[1].second, absl::DataLossError("truncated"));
  got.clear();
  ucx.Poll(std::chrono::steady_clock::duration::zero(), &got);
  EXPECT_TRUE(got.empty());
}

TEST(MoverTest, CancelPassesTheRunsTagAndMask) {
  RecordingTransport t;
  UcxHostMover ucx(&t);
  ucx.Cancel(0x500, 0xf00);
  EXPECT_EQ(t.log, (std::vector<std::string>{"cancel 1280 3840"}));
}

}  // namespace
}  // namespace reshard::agent
