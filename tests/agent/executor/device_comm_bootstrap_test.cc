// One device communicator per operation (device_comm_bootstrap.h): the id
// message (unit), and the bootstrap between three hosts over real UCX
// transports on loopback, each with its own fake device, followed by a ring
// of device bytes read back exactly through the device API; a wrong secret,
// a rank 0 that never sends, a cancelled task and a peer whose communicator
// goes away, each caused for real.
#include "agent/executor/device_comm_bootstrap.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "agent/executor/peer_proof.h"
#include "agent/executor/transfer_tags.h"
#include "agent/transfer/fake_comm.h"
#include "agent/transfer/ucx_transport.h"
#include "tests/agent/transfer/comm_ring.h"

namespace reshard::agent {
namespace {

using std::chrono::milliseconds;

const std::string kSecret(32, 's');
const std::string kOtherSecret(32, 'x');
constexpr char kOp[] = "op-device-comm";

TEST(DeviceCommIdMessageTest, ChecksOnlyWithTheSecretAndOperationItWasMadeFor) {
  absl::StatusOr<std::string> m = MakeDeviceCommIdMessage(kSecret, kOp, "h0", "the id");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->size(), kDeviceCommIdMessageBytes);
  absl::StatusOr<DeviceCommIdMessage> c = CheckDeviceCommIdMessage(kSecret, kOp, *m);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sender, "h0");
  EXPECT_EQ(c->id, "the id");
  for (const auto& [secret, op] : {std::pair{kOtherSecret, std::string(kOp)},
                                   std::pair{kSecret, std::string("op-other")}}) {
    absl::StatusOr<DeviceCommIdMessage> s = CheckDeviceCommIdMessage(secret, op, *m);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied) << s.status();
    EXPECT_TRUE(absl::StrContains(s.status().message(), "\"h0\"")) << s.status();
  }
  std::string forged = *m;
  forged[12] = 'X';  // a byte of the id
  EXPECT_EQ(CheckDeviceCommIdMessage(kSecret, kOp, forged).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(CheckDeviceCommIdMessage(kSecret, kOp, "short").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckDeviceCommIdMessage(kSecret, kOp, std::string(kDeviceCommIdMessageBytes, '\0'))
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(MakeDeviceCommIdMessage(kSecret, kOp, "h0", std::string(600, 'i')).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A host: a UCX transport, a fake device, its communicator factory.
struct Host {
  std::string id;
  std::unique_ptr<UcxTransport> transport;
  FakeDeviceApi device{FakeDeviceApi::Options{2, int64_t{64} << 20}};
  std::unique_ptr<FakeCommFactory> factory;
  std::unique_ptr<DeviceComm> comm;
  DeviceStream stream;
};

class DeviceCommBootstrapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TLS", "tcp,self", 1);
    for (int i = 0; i < 3; ++i) {
      auto h = std::make_unique<Host>();
      h->id = "h" + std::to_string(i);
      absl::StatusOr<std::unique_ptr<UcxTransport>> t = MakeUcxTransportImpl({"lo", "tcp,self"});
      ASSERT_TRUE(t.ok()) << t.status();
      h->transport = *std::move(t);
      FakeCommFactory::Options o;
      o.init_timeout = milliseconds(10000);
      h->factory = std::make_unique<FakeCommFactory>(&h->device, o);
      h->stream = h->device.CreateStream(1).value();
      hosts_.push_back(std::move(h));
    }
    for (int a = 0; a < 3; ++a) {
      for (int b = 0; b < 3; ++b) {
        if (a == b) continue;
        Transport& t = *hosts_[a]->transport;
        ASSERT_TRUE(t.Connect(hosts_[b]->id, hosts_[b]->transport->LocalAddress()).ok());
      }
    }
  }
  void TearDown() override {
    for (auto& h : hosts_) {
      h->comm.reset();
      h->transport->Shutdown();
    }
  }
  static uint64_t Tag() { return DeviceCommTag(TransferTagKey(kSecret, kOp)); }
  std::future<absl::StatusOr<std::unique_ptr<DeviceComm>>> Bootstrap(
      int i, const std::string& secret, const std::vector<std::string>& members,
      milliseconds timeout, std::function<bool()> cancelled = nullptr) {
    return std::async(std::launch::async, [=, this] {
      Host& h = *hosts_[i];
      return BootstrapDeviceComm(h.transport.get(), h.factory.get(), secret, kOp, h.id, members,
                                 /*device=*/1, Tag(), cancelled, timeout);
    });
  }

  std::vector<std::unique_ptr<Host>> hosts_;
};

std::vector<uint8_t> Pattern(size_t n, int seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 13 + 7 * i + (i >> 10));
  return v;
}

TEST_F(DeviceCommBootstrapTest, ThreeHostsJoinInHostOrderAndMoveARingOfDeviceBytes) {
  const std::vector<std::string> members = {"h2", "h0", "h1"};  // any order: ranks by id
  std::vector<std::future<absl::StatusOr<std::unique_ptr<DeviceComm>>>> f;
  for (int i = 0; i < 3; ++i) f.push_back(Bootstrap(i, kSecret, members, milliseconds(20000)));
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::unique_ptr<DeviceComm>> c = f[i].get();
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ((*c)->rank(), i);
    EXPECT_EQ((*c)->nranks(), 3);
    EXPECT_EQ((*c)->device(), 1);
    hosts_[i]->comm = *std::move(c);
  }
  const std::vector<size_t> sizes = {0, 1, 3333, (size_t{1} << 20) + 7};
  std::vector<std::vector<void*>> src(3), dst(3);
  for (int i = 0; i < 3; ++i) {
    Host& h = *hosts_[i];
    for (size_t k = 0; k < sizes.size(); ++k) {
      const size_t n = sizes[k];
      src[i].push_back(h.device.Malloc(1, n).value());
      dst[i].push_back(h.device.Malloc(1, n).value());
      const std::vector<uint8_t> bytes = Pattern(n, 4 * i + static_cast<int>(k));
      ASSERT_TRUE(
          h.device.MemcpyAsync(src[i][k], bytes.data(), n, CopyKind::kHostToDevice, h.stream).ok());
      ASSERT_TRUE(h.device.MemsetAsync(dst[i][k], 0xab, n, h.stream).ok());
      ASSERT_TRUE(h.device.StreamSynchronize(h.stream).ok());  // `bytes` is read by then
    }
  }
  std::vector<std::future<absl::Status>> done;
  for (int i = 0; i < 3; ++i) {
    done.push_back(std::async(std::launch::async, [&, i] {
      Host& h = *hosts_[i];
      return RingStep(*h.comm, h.device, h.stream, src[i], dst[i], sizes);
    }));
  }
  for (auto& d : done) {
    absl::Status s = d.get();
    ASSERT_TRUE(s.ok()) << s;
  }
  for (int i = 0; i < 3; ++i) {
    Host& h = *hosts_[i];
    const int from = (i + 2) % 3;
    for (size_t k = 0; k < sizes.size(); ++k) {
      std::vector<uint8_t> got(sizes[k]);
      ASSERT_TRUE(h.device
                      .MemcpyAsync(got.data(), dst[i][k], sizes[k], CopyKind::kDeviceToHost,
                                   h.stream)
                      .ok());
      ASSERT_TRUE(h.device.StreamSynchronize(h.stream).ok());
      EXPECT_EQ(got, Pattern(sizes[k], 4 * from + static_cast<int>(k)))
          << "host " << h.id << ", " << sizes[k] << " bytes";
    }
  }
}

// Rank 0 with another operation's secret (on the right tag, as an outsider
// that learned it would): its id is refused naming it.
TEST_F(DeviceCommBootstrapTest, AnIdMACedWithAnotherSecretIsRefusedNamingItsSender) {
  // Rank 0 then waits in Init for a rank that never joins, until its timeout.
  auto h0 = Bootstrap(0, kOtherSecret, {"h0", "h1"}, milliseconds(1000));
  absl::StatusOr<std::unique_ptr<DeviceComm>> h1 =
      Bootstrap(1, kSecret, {"h0", "h1"}, milliseconds(20000)).get();
  EXPECT_EQ(h1.status().code(), absl::StatusCode::kPermissionDenied) << h1.status();
  EXPECT_TRUE(absl::StrContains(h1.status().message(), "host \"h0\"")) << h1.status();
  absl::StatusOr<std::unique_ptr<DeviceComm>> r0 = h0.get();
  EXPECT_EQ(r0.status().code(), absl::StatusCode::kUnavailable) << r0.status();
  EXPECT_TRUE(absl::StrContains(r0.status().message(), "rank(s) 1 never joined")) << r0.status();
}

TEST_F(DeviceCommBootstrapTest, ARank0ThatNeverSendsIsNamedWithinTheTimeout) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<DeviceComm>> h2 =
      Bootstrap(2, kSecret, {"h0", "h2"}, milliseconds(400)).get();
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(h2.status().code(), absl::StatusCode::kUnavailable) << h2.status();
  EXPECT_TRUE(absl::StrContains(h2.status().message(), "host \"h0\" (rank 0) never sent"))
      << h2.status();
  EXPECT_GE(took, milliseconds(400));
  EXPECT_LT(took, milliseconds(5000));
  // Cancelled while waiting.
  absl::StatusOr<std::unique_ptr<DeviceComm>> h1 =
      Bootstrap(1, kSecret, {"h0", "h1"}, milliseconds(20000), [] { return true; }).get();
  EXPECT_EQ(h1.status().code(), absl::StatusCode::kCancelled) << h1.status();
  // Not a member.
  EXPECT_EQ(Bootstrap(1, kSecret, {"h0", "h2"}, milliseconds(100)).get().status().code(),
            absl::StatusCode::kInvalidArgument);
}

// After the bootstrap, host h1's communicator goes away (its sockets close)
// while h0 waits for its bytes: h0's synchronize fails naming rank 1.
// A factory whose Init fails at once (the host failed right before its
// join: out of memory, say): it never joins.
class NeverJoiningFactory : public FakeCommFactory {
 public:
  using FakeCommFactory::FakeCommFactory;
  absl::StatusOr<std::unique_ptr<DeviceComm>> Init(const std::string&, int, int, int,
                                                   const std::function<bool()>&,
                                                   std::chrono::steady_clock::time_point) override {
    return absl::ResourceExhaustedError("no device memory left (test)");
  }
};

// A host that fails before it joins must not hold the others in Init: they
// give up within the bootstrap's timeout (the factory's own is 10 s),
// naming the rank, or at once on cancel.
TEST_F(DeviceCommBootstrapTest, ARankThatNeverJoinsEndsTheOthersInitAtTheTimeoutOrOnCancel) {
  hosts_[1]->factory = std::make_unique<NeverJoiningFactory>(&hosts_[1]->device);
  auto start = std::chrono::steady_clock::now();
  auto f0 = Bootstrap(0, kSecret, {"h0", "h1"}, milliseconds(1000));
  absl::StatusOr<std::unique_ptr<DeviceComm>> h1 =
      Bootstrap(1, kSecret, {"h0", "h1"}, milliseconds(20000)).get();
  EXPECT_EQ(h1.status().code(), absl::StatusCode::kResourceExhausted) << h1.status();
  absl::StatusOr<std::unique_ptr<DeviceComm>> h0 = f0.get();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(5000));
  EXPECT_EQ(h0.status().code(), absl::StatusCode::kUnavailable) << h0.status();
  EXPECT_TRUE(absl::StrContains(h0.status().message(), "rank(s) 1 never joined")) << h0.status();

  // Cancelled once h1 failed (as the coordinator aborts the operation).
  std::atomic<bool> h1_failed{false};
  start = std::chrono::steady_clock::now();
  f0 = Bootstrap(0, kSecret, {"h0", "h1"}, milliseconds(20000), [&] { return h1_failed.load(); });
  h1 = Bootstrap(1, kSecret, {"h0", "h1"}, milliseconds(20000)).get();
  h1_failed = true;
  h0 = f0.get();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(5000));
  EXPECT_EQ(h0.status().code(), absl::StatusCode::kCancelled) << h0.status();
}

TEST_F(DeviceCommBootstrapTest, APeerWhoseCommunicatorGoesAwayFailsTheReceiveNamingIt) {
  auto f0 = Bootstrap(0, kSecret, {"h0", "h1"}, milliseconds(20000));
  auto f1 = Bootstrap(1, kSecret, {"h0", "h1"}, milliseconds(20000));
  absl::StatusOr<std::unique_ptr<DeviceComm>> c0 = f0.get(), c1 = f1.get();
  ASSERT_TRUE(c0.ok()) << c0.status();
  ASSERT_TRUE(c1.ok()) << c1.status();
  Host& h0 = *hosts_[0];
  void* d = h0.device.Malloc(1, 4096).value();
  ASSERT_TRUE((*c0)->Recv(d, 4096, 1, h0.stream).ok());
  c1->reset();
  absl::Status s = h0.device.StreamSynchronize(h0.stream);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "ncclRecv from peer rank 1")) << s;
}

}  // namespace
}  // namespace reshard::agent
