// Two UCX transports in one process over loopback TCP, and a transport in a
// child process (ucx_peer_main.cc) that is killed for real.
#include "agent/transfer/ucx_transport.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/agent/transfer/peer_process.h"

namespace reshard::agent {
namespace {

using std::chrono::seconds;

UcxOptions LoopbackOptions() {
  UcxOptions o;
  o.net_devices = "lo";
  o.transports = "tcp,self";
  return o;
}

// Outcomes of many transfers, waited on with deadlines.
class Outcomes {
 public:
  TransferDone Callback() {
    return [this](absl::Status s) {
      std::lock_guard<std::mutex> l(mu_);
      (s.ok() ? ok_ : failed_)++;
      if (!s.ok() && first_error_.ok()) first_error_ = s;
      cv_.notify_all();
    };
  }
  /// Waits until at least `n` transfers succeeded; false at the deadline.
  bool WaitOk(int n, std::chrono::steady_clock::duration timeout) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, timeout, [&] { return ok_ >= n; });
  }
  /// Waits until `n` transfers finished either way; false at the deadline.
  bool WaitAll(int n, std::chrono::steady_clock::duration timeout) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, timeout, [&] { return ok_ + failed_ >= n; });
  }
  int ok() {
    std::lock_guard<std::mutex> l(mu_);
    return ok_;
  }
  int failed() {
    std::lock_guard<std::mutex> l(mu_);
    return failed_;
  }
  absl::Status first_error() {
    std::lock_guard<std::mutex> l(mu_);
    return first_error_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int ok_ = 0;
  int failed_ = 0;
  absl::Status first_error_;
};

// Shuts transports down when a test body exits, before its locals (buffers,
// outcomes that callbacks write to) are destroyed.
struct StopAtExit {
  Transport* a;
  Transport* b;
  ~StopAtExit() {
    a->Shutdown();
    b->Shutdown();
  }
};

class UcxTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto a = MakeUcxTransportImpl(LoopbackOptions());
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = MakeUcxTransportImpl(LoopbackOptions());
    ASSERT_TRUE(b.ok()) << b.status();
    a_ = std::move(*a);
    b_ = std::move(*b);
    ASSERT_TRUE(a_->Connect("b", b_->LocalAddress()).ok());
    ASSERT_TRUE(b_->Connect("a", a_->LocalAddress()).ok());
  }
  void TearDown() override {
    if (a_) a_->Shutdown();
    if (b_) b_->Shutdown();
  }

  // Sends `bytes` random bytes a -> b and compares.
  void RoundTrip(size_t bytes, uint64_t tag) {
    std::vector<uint8_t> src(bytes), dst(bytes, 0);
    std::mt19937_64 rng(bytes);
    for (size_t i = 0; i < bytes; i += 8) {
      const uint64_t v = rng();
      std::memcpy(&src[i], &v, std::min<size_t>(8, bytes - i));
    }
    std::promise<absl::Status> sent, received;
    a_->Send("b", tag, src.data(), bytes, [&](absl::Status s) { sent.set_value(s); });
    b_->Receive(tag, dst.data(), bytes, [&](absl::Status s) { received.set_value(s); });
    auto rf = received.get_future();
    auto sf = sent.get_future();
    ASSERT_EQ(rf.wait_for(seconds(60)), std::future_status::ready);
    ASSERT_EQ(sf.wait_for(seconds(60)), std::future_status::ready);
    EXPECT_TRUE(rf.get().ok());
    EXPECT_TRUE(sf.get().ok());
    EXPECT_TRUE(src == dst) << "payload differs";
  }

  std::unique_ptr<UcxTransport> a_, b_;
};

TEST_F(UcxTransportTest, SendsOneKibibyte) { RoundTrip(1024, (uint64_t{1} << 32) | 1); }

TEST_F(UcxTransportTest, SendsSixtyFourMebibytes) {
  RoundTrip(size_t{64} << 20, (uint64_t{1} << 32) | 2);
}

TEST_F(UcxTransportTest, ConnectIsIdempotent) {
  EXPECT_TRUE(a_->Connect("b", b_->LocalAddress()).ok());
  EXPECT_FALSE(a_->Connect("c", "").ok());
}

TEST_F(UcxTransportTest, ManyInFlightBothWays) {
  constexpr int kN = 64;
  constexpr size_t kBytes = 256 << 10;
  std::vector<std::vector<uint8_t>> src(kN), dst(kN);
  std::vector<std::promise<absl::Status>> done(4 * kN);
  for (int i = 0; i < kN; ++i) {
    src[i].assign(kBytes, static_cast<uint8_t>(i));
    dst[i].assign(kBytes, 0);
  }
  std::vector<std::vector<uint8_t>> back_src(kN), back_dst(kN);
  for (int i = 0; i < kN; ++i) {
    back_src[i].assign(kBytes / 2, static_cast<uint8_t>(255 - i));
    back_dst[i].assign(kBytes / 2, 0);
  }
  // Receives first for half of them, after for the other half.
  for (int i = 0; i < kN; i += 2) {
    b_->Receive(uint64_t{7} << 32 | i, dst[i].data(), kBytes,
                [&, i](absl::Status s) { done[i].set_value(s); });
  }
  for (int i = 0; i < kN; ++i) {
    a_->Send("b", uint64_t{7} << 32 | i, src[i].data(), kBytes,
             [&, i](absl::Status s) { done[kN + i].set_value(s); });
    b_->Send("a", uint64_t{8} << 32 | i, back_src[i].data(), kBytes / 2,
             [&, i](absl::Status s) { done[2 * kN + i].set_value(s); });
  }
  for (int i = 1; i < kN; i += 2) {
    b_->Receive(uint64_t{7} << 32 | i, dst[i].data(), kBytes,
                [&, i](absl::Status s) { done[i].set_value(s); });
  }
  for (int i = kN - 1; i >= 0; --i) {
    a_->Receive(uint64_t{8} << 32 | i, back_dst[i].data(), kBytes / 2,
                [&, i](absl::Status s) { done[3 * kN + i].set_value(s); });
  }
  for (int i = 0; i < 4 * kN; ++i) {
    auto f = done[i].get_future();
    ASSERT_EQ(f.wait_for(seconds(60)), std::future_status::ready) << i;
    EXPECT_TRUE(f.get().ok()) << i;
  }
  for (int i = 0; i < kN; ++i) {
    EXPECT_TRUE(src[i] == dst[i]) << i;
    EXPECT_TRUE(back_src[i] == back_dst[i]) << i;
  }
  EXPECT_EQ(a_->pending(), 0u);
  EXPECT_EQ(b_->pending(), 0u);
}

TEST_F(UcxTransportTest, WrongSizeIsAnError) {
  std::vector<uint8_t> src(100, 1), dst(50, 0);
  std::promise<absl::Status> received, sent;
  b_->Receive(uint64_t{9} << 32, dst.data(), dst.size(),
              [&](absl::Status s) { received.set_value(s); });
  a_->Send("b", uint64_t{9} << 32, src.data(), src.size(),
           [&](absl::Status s) { sent.set_value(s); });
  auto rf = received.get_future();
  ASSERT_EQ(rf.wait_for(seconds(30)), std::future_status::ready);
  EXPECT_FALSE(rf.get().ok());
  sent.get_future().wait_for(seconds(30));
}

TEST_F(UcxTransportTest, CancelTagsFailsPendingReceiveUnderMask) {
  std::vector<uint8_t> dst(1024);
  std::promise<absl::Status> received, other;
  b_->Receive(uint64_t{11} << 32 | 3, dst.data(), dst.size(),
              [&](absl::Status s) { received.set_value(s); });
  b_->Receive(uint64_t{12} << 32 | 3, dst.data(), dst.size(),
              [&](absl::Status s) { other.set_value(s); });
  b_->CancelTags(uint64_t{11} << 32, ~uint64_t{0} << 32);
  auto rf = received.get_future();
  ASSERT_EQ(rf.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_TRUE(absl::IsCancelled(rf.get()));
  auto of = other.get_future();
  EXPECT_EQ(of.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  b_->Shutdown();  // fails the other one
  ASSERT_EQ(of.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_TRUE(absl::IsCancelled(of.get()));
}

TEST_F(UcxTransportTest, UnknownPeerFails) {
  uint8_t x = 0;
  std::promise<absl::Status> sent;
  a_->Send("nobody", 1, &x, 1, [&](absl::Status s) { sent.set_value(s); });
  EXPECT_TRUE(absl::IsFailedPrecondition(sent.get_future().get()));
}

TEST_F(UcxTransportTest, DeadPeerFailsPendingTransfers) {
  // Warm the connection both ways so each side has a live TCP link.
  RoundTrip(16, uint64_t{13} << 32);
  std::vector<uint8_t> dst(size_t{1} << 20);
  std::promise<absl::Status> received;
  a_->Receive(uint64_t{14} << 32, dst.data(), dst.size(),
              [&](absl::Status s) { received.set_value(s); });
  b_->Shutdown();
  auto rf = received.get_future();
  ASSERT_EQ(rf.wait_for(seconds(30)), std::future_status::ready) << "receive hangs";
  absl::Status rs = rf.get();
  EXPECT_TRUE(absl::IsUnavailable(rs)) << rs;

  // A large send to the dead peer fails too (rendezvous never completes).
  std::vector<uint8_t> src(size_t{8} << 20, 3);
  std::promise<absl::Status> sent;
  a_->Send("b", uint64_t{14} << 32 | 1, src.data(), src.size(),
           [&](absl::Status s) { sent.set_value(s); });
  auto sf = sent.get_future();
  ASSERT_EQ(sf.wait_for(seconds(30)), std::future_status::ready) << "send hangs";
  EXPECT_FALSE(sf.get().ok());
}

// Rendezvous sends whose receiver never posts the receives (its task failed
// before it got there, as in the fault suite's destination-kill case, where a
// third host's task failed at Connect): UCX cannot cancel a send request, so
// before the fix they stayed pending for ever, pinning the sender's buffers.
constexpr int kUnmatchedSends = 16;
constexpr size_t kUnmatchedBytes = size_t{8} << 20;
constexpr uint64_t kOpMask = ~uint64_t{0} << 32;

TEST_F(UcxTransportTest, CancelTagsFailsSendsThePeerNeverReceives) {
  RoundTrip(16, uint64_t{15} << 32);
  std::vector<uint8_t> src(kUnmatchedBytes, 5), dst(kUnmatchedBytes, 0);
  Outcomes cancelled, other, after;
  StopAtExit stop{a_.get(), b_.get()};  // before the buffers go, on any exit
  for (int i = 0; i < kUnmatchedSends; ++i) {
    a_->Send("b", uint64_t{16} << 32 | i, src.data(), src.size(), cancelled.Callback());
  }
  // Another operation's send to the same peer, in flight at the cancel.
  a_->Send("b", uint64_t{17} << 32, src.data(), src.size(), other.Callback());
  a_->CancelTags(uint64_t{16} << 32, kOpMask);
  b_->Receive(uint64_t{17} << 32, dst.data(), dst.size(), other.Callback());
  ASSERT_TRUE(cancelled.WaitAll(kUnmatchedSends, seconds(8)))
      << cancelled.ok() + cancelled.failed() << " of " << kUnmatchedSends
      << " cancelled sends finished; a pending " << a_->pending();
  EXPECT_EQ(cancelled.ok(), 0);
  EXPECT_TRUE(absl::IsCancelled(cancelled.first_error())) << cancelled.first_error();
  // The other operation's transfer is not collateral damage.
  ASSERT_TRUE(other.WaitAll(2, seconds(30)));
  EXPECT_TRUE(other.first_error().ok()) << other.first_error();
  EXPECT_EQ(a_->pending(), 0u);
  // The peer is still reachable (over a fresh endpoint).
  a_->Send("b", uint64_t{18} << 32, src.data(), src.size(), after.Callback());
  b_->Receive(uint64_t{18} << 32, dst.data(), dst.size(), after.Callback());
  ASSERT_TRUE(after.WaitAll(2, seconds(30)));
  EXPECT_TRUE(after.first_error().ok()) << after.first_error();
  EXPECT_EQ(a_->pending(), 0u);
}

// UCX pairs the endpoints two workers create to each other into one
// connection, so the endpoint a cancel retires may be the one the peer's
// sends arrive on. Retiring it must not fail the peer's transfers to us: not
// one in flight at the cancel, nor later ones (seen in the fault soak as
// receives "canceled" and peers' sends timing out, attempt after attempt).
TEST_F(UcxTransportTest, CancelTagsDoesNotBreakThePeersTransfersToUs) {
  RoundTrip(16, uint64_t{22} << 32);
  std::vector<uint8_t> src(kUnmatchedBytes, 7), dst(kUnmatchedBytes, 0);
  std::vector<uint8_t> big(size_t{64} << 20, 9), big_dst(big.size(), 0);
  Outcomes cancelled, inflight, after;
  StopAtExit stop{a_.get(), b_.get()};
  for (int i = 0; i < kUnmatchedSends; ++i) {
    a_->Send("b", uint64_t{23} << 32 | i, src.data(), src.size(), cancelled.Callback());
  }
  // b -> a, in flight while a cancels its own sends to b.
  a_->Receive(uint64_t{24} << 32, big_dst.data(), big_dst.size(), inflight.Callback());
  b_->Send("a", uint64_t{24} << 32, big.data(), big.size(), inflight.Callback());
  a_->CancelTags(uint64_t{23} << 32, kOpMask);
  ASSERT_TRUE(cancelled.WaitAll(kUnmatchedSends, seconds(8)));
  EXPECT_EQ(cancelled.ok(), 0);
  ASSERT_TRUE(inflight.WaitAll(2, seconds(30)));
  EXPECT_TRUE(inflight.first_error().ok()) << inflight.first_error();
  EXPECT_TRUE(big == big_dst) << "payload differs";
  // And b -> a later, after the retired endpoint is closed.
  for (int i = 0; i < 4; ++i) {
    a_->Receive(uint64_t{25} << 32 | i, dst.data(), dst.size(), after.Callback());
    b_->Send("a", uint64_t{25} << 32 | i, src.data(), src.size(), after.Callback());
    ASSERT_TRUE(after.WaitAll(2 * (i + 1), seconds(30)));
  }
  EXPECT_TRUE(after.first_error().ok()) << after.first_error();
  EXPECT_EQ(a_->pending(), 0u);
  EXPECT_EQ(b_->pending(), 0u);
}

TEST_F(UcxTransportTest, ShutdownFailsSendsThePeerNeverReceives) {
  RoundTrip(16, uint64_t{19} << 32);
  std::vector<uint8_t> src(kUnmatchedBytes, 6);
  Outcomes sends;
  for (int i = 0; i < kUnmatchedSends; ++i) {
    a_->Send("b", uint64_t{20} << 32 | i, src.data(), src.size(), sends.Callback());
  }
  // Before the fix, UCX aborted the process here (ucp_ep.c: Assertion
  // `ucs_hlist_is_empty(&ucp_ep_ext_gen(ep)->proto_reqs)' failed).
  a_->Shutdown();
  ASSERT_TRUE(sends.WaitAll(kUnmatchedSends, seconds(1)));
  EXPECT_EQ(sends.ok(), 0);
  EXPECT_TRUE(absl::IsCancelled(sends.first_error())) << sends.first_error();
  EXPECT_EQ(a_->pending(), 0u);
}

// Many rendezvous-sized sends to a peer process that is SIGKILLed while they
// move; the peer posted receives for the first half only, so at the kill some
// sends are mid-transfer and the rest wait for the peer to match them. Every
// send must then finish (with an error) within `kFailBound`, so that callers
// drop what they pin, and Shutdown must not trip over leftover requests.
class UcxDeadPeerTest : public ::testing::Test {
 protected:
  static constexpr int kSends = 64;
  static constexpr size_t kChunk = size_t{8} << 20;
  static constexpr uint64_t kTagBase = uint64_t{21} << 32;
  static constexpr auto kFailBound = seconds(8);

  void SetUp() override {
    auto t = MakeUcxTransportImpl(LoopbackOptions());
    ASSERT_TRUE(t.ok()) << t.status();
    sender_ = std::move(*t);
    peer_ = PeerProcess::Start(*sender_, kSends / 2, kChunk, kTagBase);
    ASSERT_NE(peer_, nullptr) << "peer process did not start";
    ASSERT_TRUE(sender_->Connect("peer", peer_->address()).ok());
    src_.assign(kChunk, 7);
  }
  // Before the buffers and outcomes go: callbacks may still run until then.
  void TearDown() override {
    if (sender_) sender_->Shutdown();
  }

  // Posts the sends and kills the peer once the first one has landed.
  void SendAndKillMidway() {
    for (int i = 0; i < kSends; ++i) {
      sender_->Send("peer", kTagBase + i, src_.data(), src_.size(), outcomes_.Callback());
    }
    ASSERT_TRUE(outcomes_.WaitOk(1, seconds(60))) << "no send completed";
    peer_->Kill();
    ASSERT_LT(outcomes_.ok(), kSends) << "all sends finished before the kill";
  }

  void ExpectAllFailedWithinBound() {
    ASSERT_TRUE(outcomes_.WaitAll(kSends, kFailBound))
        << outcomes_.ok() << " ok + " << outcomes_.failed() << " failed of " << kSends
        << " sends after the peer was killed; pending " << sender_->pending();
    EXPECT_GT(outcomes_.failed(), 0);
    EXPECT_FALSE(outcomes_.first_error().ok());
    EXPECT_EQ(sender_->pending(), 0u);
  }

  std::unique_ptr<UcxTransport> sender_;
  std::unique_ptr<PeerProcess> peer_;
  std::vector<uint8_t> src_;
  Outcomes outcomes_;
  Outcomes after_restart_;
};

TEST_F(UcxDeadPeerTest, SendsToKilledPeerFailWithinBound) {
  SendAndKillMidway();
  ExpectAllFailedWithinBound();
  sender_->Shutdown();  // aborts the process if UCX still holds requests
}

TEST_F(UcxDeadPeerTest, SendsToKilledPeerFailWhenItRestartsAtOnce) {
  SendAndKillMidway();
  // The peer comes back under the same id with a new address before the old
  // connection's failure was seen (an agent restarted by its supervisor).
  auto restarted = PeerProcess::Start(*sender_, 1, kChunk, kTagBase + kSends);
  ASSERT_NE(restarted, nullptr);
  ASSERT_TRUE(sender_->Connect("peer", restarted->address()).ok());
  ExpectAllFailedWithinBound();
  // The new incarnation is reachable.
  sender_->Send("peer", kTagBase + kSends, src_.data(), src_.size(), after_restart_.Callback());
  ASSERT_TRUE(after_restart_.WaitAll(1, seconds(30)));
  EXPECT_TRUE(after_restart_.first_error().ok()) << after_restart_.first_error();
  sender_->Shutdown();
}

}  // namespace
}  // namespace reshard::agent
