// Transfer proofs (agent/executor/peer_proof.h; docs/security.md,
// "Agent-to-agent transfers"): the proof message itself (unit), and the
// exchange between real UCX transports over loopback, where a fake peer
// that knows a proof tag but not the operation's secret is refused.
#include "agent/executor/peer_proof.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "agent/executor/transfer_tags.h"
#include "agent/transfer/ucx_transport.h"

namespace reshard::agent {
namespace {

using std::chrono::milliseconds;

const std::string kSecret(32, 's');
const std::string kOtherSecret(32, 'x');
constexpr char kOp[] = "op-proof";

TEST(PeerProofTest, AProofChecksOnlyWithTheSecretAndTheReceiverItWasMadeFor) {
  absl::StatusOr<std::string> proof = MakePeerProof(kSecret, kOp, "h0", "h1");
  ASSERT_TRUE(proof.ok()) << proof.status();
  EXPECT_EQ(proof->size(), kPeerProofBytes);
  absl::StatusOr<std::string> sender = CheckPeerProof(kSecret, kOp, "h1", *proof);
  ASSERT_TRUE(sender.ok()) << sender.status();
  EXPECT_EQ(*sender, "h0");
  // Another operation's secret, another operation, another receiver.
  for (const auto& [secret, op, receiver] :
       {std::tuple{kOtherSecret, std::string(kOp), std::string("h1")},
        std::tuple{kSecret, std::string("op-other"), std::string("h1")},
        std::tuple{kSecret, std::string(kOp), std::string("h2")}}) {
    absl::StatusOr<std::string> s = CheckPeerProof(secret, op, receiver, *proof);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied) << s.status();
    EXPECT_TRUE(absl::StrContains(s.status().message(), "\"h0\"")) << s.status();
  }
  // A proof claiming another sender does not check either.
  std::string forged = *proof;
  forged[4] = '1';  // "h1"
  EXPECT_EQ(CheckPeerProof(kSecret, kOp, "h1", forged).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(CheckPeerProof(kSecret, kOp, "h1", "short").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckPeerProof(kSecret, kOp, "h1", std::string(kPeerProofBytes, '\0')).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(PeerProofTest, TheTagKeyComesFromTheSecret) {
  const uint32_t a = TransferTagKey(kSecret, kOp);
  const uint32_t b = TransferTagKey(kOtherSecret, kOp);
  EXPECT_NE(a, b);
  EXPECT_LT(a, uint32_t{1} << kTagKeyBits);
  EXPECT_LT(b, uint32_t{1} << kTagKeyBits);
  EXPECT_EQ(TransferTagKey("", kOp), OperationTagKey(kOp));  // no secret: as before
  EXPECT_NE(a, OperationTagKey(kOp));
}

class PeerExchangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TLS", "tcp,self", 1);
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<std::unique_ptr<UcxTransport>> t = MakeUcxTransportImpl({"lo", "tcp,self"});
      ASSERT_TRUE(t.ok()) << t.status();
      transports_.push_back(*std::move(t));
    }
  }
  void TearDown() override {
    for (auto& t : transports_) t->Shutdown();
  }
  uint64_t Tag(const std::string& secret) {
    return TransferTag(TransferTagKey(secret, kOp), kProofStepIndex, 0).value();
  }
  // transports_[from] reaches transports_[to] as host `name`.
  void Connect(int from, int to, const std::string& name) {
    ASSERT_TRUE(transports_[from]->Connect(name, transports_[to]->LocalAddress()).ok());
  }
  // Waits (bounded) for `t` to have no pending transfer: cancellations
  // complete on its progress thread.
  static bool Drained(UcxTransport& t) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (t.pending() != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    return t.pending() == 0;
  }
  std::vector<std::unique_ptr<UcxTransport>> transports_;
};

TEST_F(PeerExchangeTest, PeersWithTheSecretProveThemselvesBothWays) {
  Connect(0, 1, "h1");
  Connect(1, 0, "h0");
  const uint64_t tag = Tag(kSecret);
  auto h0 = std::async(std::launch::async, [&] {
    return ExchangePeerProofs(transports_[0].get(), kSecret, kOp, "h0", tag, {"h1"}, {"h1"},
                              nullptr, milliseconds(20000));
  });
  absl::Status h1 = ExchangePeerProofs(transports_[1].get(), kSecret, kOp, "h1", tag, {"h0"},
                                       {"h0"}, nullptr, milliseconds(20000));
  EXPECT_TRUE(h1.ok()) << h1;
  EXPECT_TRUE(h0.get().ok());
}

// A process that learned (or guessed) the proof tag but not the secret: its
// proof, sent as "h0", is refused naming h0, and nothing else is accepted.
TEST_F(PeerExchangeTest, AFakePeerWithoutTheSecretIsRefusedNamingTheHostItClaims) {
  Connect(2, 1, "h1");  // the fake peer
  const uint64_t tag = Tag(kSecret);
  absl::StatusOr<std::string> fake = MakePeerProof(kOtherSecret, kOp, "h0", "h1");
  ASSERT_TRUE(fake.ok());
  std::promise<absl::Status> sent;
  transports_[2]->Send("h1", tag, fake->data(), fake->size(),
                       [&](absl::Status s) { sent.set_value(s); });
  absl::Status h1 = ExchangePeerProofs(transports_[1].get(), kSecret, kOp, "h1", tag, {}, {"h0"},
                                       nullptr, milliseconds(20000));
  EXPECT_EQ(h1.code(), absl::StatusCode::kPermissionDenied) << h1;
  EXPECT_TRUE(absl::StrContains(h1.message(), "\"h0\"")) << h1;
  EXPECT_TRUE(sent.get_future().get().ok());
  EXPECT_TRUE(Drained(*transports_[1]));
}

// A real peer whose proof is valid, but sent by a host the receiver expects
// nothing from, is refused too.
TEST_F(PeerExchangeTest, AProofFromAHostThatSendsNothingHereIsRefused) {
  Connect(0, 1, "h1");
  const uint64_t tag = Tag(kSecret);
  auto h2 = std::async(std::launch::async, [&] {  // "h2" takes part, but sends nothing to h1
    return ExchangePeerProofs(transports_[0].get(), kSecret, kOp, "h2", tag, {"h1"}, {}, nullptr,
                              milliseconds(20000));
  });
  absl::Status h1 = ExchangePeerProofs(transports_[1].get(), kSecret, kOp, "h1", tag, {}, {"h0"},
                                       nullptr, milliseconds(20000));
  EXPECT_EQ(h1.code(), absl::StatusCode::kPermissionDenied) << h1;
  EXPECT_TRUE(absl::StrContains(h1.message(), "\"h2\"")) << h1;
  EXPECT_TRUE(h2.get().ok());
}

// A peer with another secret sends on tags nobody posted: the receiver gets
// no proof and, after the timeout, fails naming the peer it waited for.
TEST_F(PeerExchangeTest, AMissingProofTimesOutNamingThePeer) {
  Connect(0, 1, "h1");
  auto h0 = std::async(std::launch::async, [&] {
    return ExchangePeerProofs(transports_[0].get(), kOtherSecret, kOp, "h0", Tag(kOtherSecret),
                              {"h1"}, {}, nullptr, milliseconds(20000));
  });
  absl::Status h1 = ExchangePeerProofs(transports_[1].get(), kSecret, kOp, "h1", Tag(kSecret), {},
                                       {"h0"}, nullptr, milliseconds(1500));
  EXPECT_EQ(h1.code(), absl::StatusCode::kDeadlineExceeded) << h1;
  EXPECT_TRUE(absl::StrContains(h1.message(), "\"h0\"")) << h1;
  EXPECT_TRUE(h0.get().ok());  // its eager send completed, unmatched
  EXPECT_TRUE(Drained(*transports_[1]));
}

}  // namespace
}  // namespace reshard::agent
