// Two UCX transports in one process over loopback TCP.
#include "agent/transfer/ucx_transport.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <random>
#include <vector>

namespace reshard::agent {
namespace {

using std::chrono::seconds;

UcxOptions LoopbackOptions() {
  UcxOptions o;
  o.net_devices = "lo";
  o.transports = "tcp,self";
  return o;
}

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

}  // namespace
}  // namespace reshard::agent
