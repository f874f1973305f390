// The UCX transport's parts (ucx_worker.h, ucx_connections.h,
// ucx_requests.h) called directly: the pure ones (status mapping, tag
// matching, the idle-spin setting, an endpoint's send accounting and cancel
// watch), and connections and requests on one real worker over loopback TCP,
// with the test as the progress thread: it sends to its own listener.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/transfer/ucx_address.h"
#include "agent/transfer/ucx_connections.h"
#include "agent/transfer/ucx_discard.h"
#include "agent/transfer/ucx_requests.h"
#include "agent/transfer/ucx_worker.h"

namespace reshard::agent {
namespace {

using std::chrono::seconds;

TEST(UcxStatusTest, EachUcxErrorBecomesTheCodeACallerActsOn) {
  EXPECT_TRUE(FromUcs(UCS_OK, "x").ok());
  EXPECT_EQ(FromUcs(UCS_ERR_CANCELED, "x").code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(FromUcs(UCS_ERR_MESSAGE_TRUNCATED, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromUcs(UCS_ERR_INVALID_PARAM, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromUcs(UCS_ERR_INVALID_ADDR, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromUcs(UCS_ERR_NO_MEMORY, "x").code(), absl::StatusCode::kResourceExhausted);
  for (ucs_status_t s : {UCS_ERR_UNREACHABLE, UCS_ERR_CONNECTION_RESET, UCS_ERR_ENDPOINT_TIMEOUT,
                         UCS_ERR_REJECTED, UCS_ERR_NOT_CONNECTED, UCS_ERR_TIMED_OUT,
                         UCS_ERR_IO_ERROR, UCS_ERR_NO_DEVICE}) {
    EXPECT_EQ(FromUcs(s, "x").code(), absl::StatusCode::kUnavailable) << ucs_status_string(s);
  }
  EXPECT_EQ(FromUcs(UCS_ERR_CONNECTION_RESET, "send of tag 5").message(),
            std::string("send of tag 5: ") + ucs_status_string(UCS_ERR_CONNECTION_RESET));
}

TEST(UcxStatusTest, TagsAgreeOnlyOnTheMaskedBits) {
  EXPECT_TRUE(TagsAgree(0x12'0000'0001, 0x12'0000'0002, 0xFF'0000'0000));
  EXPECT_FALSE(TagsAgree(0x12'0000'0001, 0x13'0000'0001, 0xFF'0000'0000));
  EXPECT_TRUE(TagsAgree(7, 7, kUcxFullMask));
  EXPECT_FALSE(TagsAgree(7, 6, kUcxFullMask));
  EXPECT_TRUE(TagsAgree(7, 6, 0));
}

TEST(UcxStatusTest, IdleSpinsDefaultToEightAndTakeANonNegativeNumber) {
  EXPECT_EQ(ParseIdleSpins(nullptr), 8);
  EXPECT_EQ(ParseIdleSpins("-1"), 8);
  EXPECT_EQ(ParseIdleSpins("0"), 0);
  EXPECT_EQ(ParseIdleSpins("1000"), 1000);
}

TEST(UcxEndpointTest, SendAccountingAndTheCancelWatch) {
  UcxEndpoint e;
  const auto t0 = UcxClock::now();
  EXPECT_EQ(e.Watch(t0), UcxEndpoint::CancelWatch::kNone);
  e.AddSend();
  e.AddSend();
  e.CancelSend();  // one of the two is cancelled
  EXPECT_EQ(e.sends, 2u);
  EXPECT_EQ(e.live_sends, 1u);
  e.cancelled_by = t0 + kCancelFallback;
  EXPECT_EQ(e.Watch(t0), UcxEndpoint::CancelWatch::kWait);
  EXPECT_EQ(e.Watch(t0 + kCancelFallback), UcxEndpoint::CancelWatch::kOverdue);
  e.retired = true;  // already on its way out: nothing more to do
  EXPECT_EQ(e.Watch(t0 + kCancelFallback), UcxEndpoint::CancelWatch::kWait);
  e.retired = false;
  e.EndSend(/*cancelled=*/false);  // the live one ends: the cancelled one is left
  EXPECT_EQ(e.Watch(t0 + kCancelFallback), UcxEndpoint::CancelWatch::kOverdue);
  e.EndSend(/*cancelled=*/true);
  EXPECT_EQ(e.sends, 0u);
  EXPECT_EQ(e.live_sends, 0u);
  EXPECT_EQ(e.Watch(t0 + kCancelFallback), UcxEndpoint::CancelWatch::kDrained);
}

TEST(UcxRequestTest, DescribeNamesTheTagTheSizeAndThePeer) {
  UcxRequest r;
  r.tag = 42;
  r.bytes = 1024;
  EXPECT_EQ(Describe(r), "receive of tag 42 (1024 bytes)");
  r.is_send = true;
  r.peer = "host-1";
  EXPECT_EQ(Describe(r), "send of tag 42 (1024 bytes) to \"host-1\"");
}

// One worker listening on loopback; the test progresses it.
class UcxPartsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    UcxOptions o;
    o.net_devices = "lo";
    o.transports = "tcp,self";
    ASSERT_TRUE(worker_.Init(o).ok());
    requests_ = std::make_unique<UcxRequests>(worker_.get());
    connections_ = std::make_unique<UcxConnections>(
        worker_.get(), [] { return false; },
        [this](const std::string& why) { requests_->FailReceives(why); });
    absl::StatusOr<std::string> address = connections_->Listen(o);
    ASSERT_TRUE(address.ok()) << address.status();
    address_ = *address;
  }
  void TearDown() override {
    requests_->CancelReceives();
    connections_->CloseAll();
    ProgressUntil([&] { return requests_->empty(); });
    requests_->AbandonPending();
    connections_->DestroyListener();
    worker_.DestroyWorker();
    discards_.reset();  // after the worker, as the transport does
    requests_->FreeAbandoned();
  }

  // Progresses the worker until `done` or 10 s; whether it is done.
  template <typename Done>
  bool ProgressUntil(Done done) {
    const auto deadline = UcxClock::now() + seconds(10);
    while (!done()) {
      if (UcxClock::now() > deadline) return false;
      worker_.Progress();
      connections_->Progress();
      if (discards_ != nullptr) discards_->Progress(UcxClock::now());
    }
    return true;
  }

  // A request whose outcome lands in `*out`.
  UcxRequest* Request(uint64_t tag, size_t bytes, std::optional<absl::Status>* out) {
    return requests_->New(tag, bytes, [out](absl::Status s) { *out = std::move(s); });
  }

  UcxEndpoint* ConnectToSelf() {
    EXPECT_TRUE(connections_->Connect("self", address_).ok());
    absl::StatusOr<UcxEndpoint*> e = connections_->EndpointFor("self");
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? *e : nullptr;
  }

  UcxWorker worker_;
  std::unique_ptr<UcxRequests> requests_;
  std::unique_ptr<UcxConnections> connections_;
  std::unique_ptr<UcxDiscards> discards_;
  std::string address_;
};

TEST_F(UcxPartsTest, ListensOnLoopbackOrAdvertisesTheWorkerAddress) {
  EXPECT_TRUE(IsListenerAddress(address_)) << address_;
  EXPECT_EQ(address_.rfind("ucx-listener:127.0.0.1:", 0), 0u) << address_;
  UcxOptions o;
  o.net_devices = "lo";
  o.listen = false;
  UcxConnections unlistening(worker_.get(), [] { return false; }, [](const std::string&) {});
  absl::StatusOr<std::string> worker_address = unlistening.Listen(o);
  ASSERT_TRUE(worker_address.ok()) << worker_address.status();
  EXPECT_FALSE(IsListenerAddress(*worker_address));
  EXPECT_FALSE(worker_address->empty());
}

TEST_F(UcxPartsTest, SendingToAnUnknownOrMalformedPeerNamesIt) {
  absl::StatusOr<UcxEndpoint*> e = connections_->EndpointFor("host-9");
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("\"host-9\""), std::string::npos) << e.status();
  absl::Status c = connections_->Connect("host-8", "ucx-listener:127.0.0.1/1");
  EXPECT_EQ(c.code(), absl::StatusCode::kInvalidArgument) << c;
  EXPECT_EQ(connections_->EndpointFor("host-8").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(UcxPartsTest, ASendToOurOwnListenerArrivesByteForByte) {
  UcxEndpoint* e = ConnectToSelf();
  ASSERT_NE(e, nullptr);
  EXPECT_TRUE(connections_->Connect("self", address_).ok());  // idempotent: same endpoint
  EXPECT_EQ(*connections_->EndpointFor("self"), e);
  std::vector<char> out(1 << 20), in(1 << 20, 0);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(i * 7 + 3);
  std::optional<absl::Status> sent, received;
  requests_->Receive(Request(11, in.size(), &received), in.data());
  UcxRequest* s = Request(11, out.size(), &sent);
  s->is_send = true;
  s->peer = "self";
  requests_->Send(s, e, out.data());
  ASSERT_TRUE(ProgressUntil([&] { return sent && received; }));
  EXPECT_TRUE(sent->ok()) << *sent;
  EXPECT_TRUE(received->ok()) << *received;
  EXPECT_EQ(in, out);
  EXPECT_EQ(requests_->pending_count(), 0u);
  EXPECT_EQ(e->sends, 0u);
  EXPECT_EQ(e->live_sends, 0u);
}

TEST_F(UcxPartsTest, AShorterMessageFailsTheReceiveWithBothSizes) {
  UcxEndpoint* e = ConnectToSelf();
  ASSERT_NE(e, nullptr);
  char out[8] = {1, 2, 3, 4, 5, 6, 7, 8}, in[16] = {};
  std::optional<absl::Status> sent, received;
  requests_->Receive(Request(12, sizeof(in), &received), in);
  UcxRequest* s = Request(12, sizeof(out), &sent);
  s->is_send = true;
  s->peer = "self";
  requests_->Send(s, e, out);
  ASSERT_TRUE(ProgressUntil([&] { return sent && received; }));
  EXPECT_TRUE(sent->ok()) << *sent;
  EXPECT_EQ(received->code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(received->message(), "receive of tag 12 (16 bytes): got 8 bytes");
}

TEST_F(UcxPartsTest, CancelFailsTheReceivesUnderTheMaskAndNoOthers) {
  char a[8], b[8];
  std::optional<absl::Status> in_op, other_op;
  requests_->Receive(Request(0x1'0000'0005, sizeof(a), &in_op), a);
  requests_->Receive(Request(0x2'0000'0005, sizeof(b), &other_op), b);
  EXPECT_EQ(requests_->pending_count(), 2u);
  EXPECT_TRUE(requests_->Cancel(0x1'0000'0000, 0xF'0000'0000).empty());  // no sends
  ASSERT_TRUE(ProgressUntil([&] { return in_op.has_value(); }));
  EXPECT_EQ(in_op->code(), absl::StatusCode::kCancelled) << *in_op;
  EXPECT_FALSE(other_op.has_value());
  EXPECT_EQ(requests_->pending_count(), 1u);
  requests_->FailReceives("peer connection failed: Connection reset by remote peer");
  ASSERT_TRUE(ProgressUntil([&] { return other_op.has_value(); }));
  EXPECT_EQ(other_op->code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(other_op->message(),
            "receive of tag 8589934597 (8 bytes): peer connection failed: Connection reset by "
            "remote peer");
}

TEST_F(UcxPartsTest, ACancelledSendCompletesWhenTheReceiverDrainsIt) {
  UcxEndpoint* e = ConnectToSelf();
  ASSERT_NE(e, nullptr);
  discards_ = std::make_unique<UcxDiscards>(worker_.get());
  std::vector<char> out(4 << 20, 'x');  // rendezvous: pending until received
  std::optional<absl::Status> sent;
  UcxRequest* s = Request(0x3'0000'0009, out.size(), &sent);
  s->is_send = true;
  s->peer = "self";
  requests_->Send(s, e, out.data());
  ASSERT_FALSE(sent.has_value());
  EXPECT_EQ(e->sends, 1u);
  const std::vector<UcxEndpoint*> cancelled = requests_->Cancel(0x3'0000'0000, 0xF'0000'0000);
  ASSERT_EQ(cancelled, std::vector<UcxEndpoint*>{e});
  EXPECT_EQ(e->live_sends, 0u);
  connections_->WatchCancelled(e, UcxClock::now());
  EXPECT_EQ(e->Watch(UcxClock::now()), UcxEndpoint::CancelWatch::kWait);
  // What the peer does on our discard notice: drain what arrives under the mask.
  discards_->Add(0x3'0000'0000, 0xF'0000'0000, UcxClock::now());
  ASSERT_TRUE(ProgressUntil([&] { return sent.has_value(); }));
  EXPECT_EQ(sent->code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(sent->message(),
            "send of tag 12884901897 (4194304 bytes) to \"self\": cancelled; the receiver "
            "dropped it");
  EXPECT_EQ(discards_->drained(), 1u);
  EXPECT_EQ(e->sends, 0u);
  // The connections' cancel watch saw it drained and forgot the deadline;
  // the endpoint was not retired.
  ProgressUntil([&] { return !e->cancelled_by.has_value(); });
  EXPECT_FALSE(e->cancelled_by.has_value());
  EXPECT_EQ(*connections_->EndpointFor("self"), e);
}

}  // namespace
}  // namespace reshard::agent
