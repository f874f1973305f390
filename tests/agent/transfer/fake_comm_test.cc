// The fake device communicator (fake_comm.h) between ranks in threads and,
// for a peer's death, in a real child process (transfer_comm_peer) that the
// test kills: NCCL's semantics (grouped ring sends, completion at the
// stream's synchronize, errors naming the peer), exact bytes read back
// through the device API.
#include "agent/transfer/fake_comm.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "agent/transfer/backend.h"
#include "tests/agent/transfer/comm_ring.h"
#include "tests/support/process.h"

namespace reshard::agent {
namespace {

using std::chrono::milliseconds;

// One rank: its own fake device (as its own agent would have), factory,
// stream and communicator.
struct Rank {
  FakeDeviceApi device{FakeDeviceApi::Options{1, int64_t{64} << 20}};
  std::unique_ptr<FakeCommFactory> factory;
  std::unique_ptr<DeviceComm> comm;
  DeviceStream stream;

  explicit Rank(milliseconds init_timeout = milliseconds(20000)) {
    FakeCommFactory::Options o;
    o.init_timeout = init_timeout;
    factory = std::make_unique<FakeCommFactory>(&device, o);
    stream = device.CreateStream(0).value();
  }
  ~Rank() { comm.reset(); }

  // Device memory holding `bytes`.
  void* Upload(const std::vector<uint8_t>& bytes) {
    void* d = device.Malloc(0, std::max<size_t>(bytes.size(), 1)).value();
    EXPECT_TRUE(
        device.MemcpyAsync(d, bytes.data(), bytes.size(), CopyKind::kHostToDevice, stream).ok());
    EXPECT_TRUE(device.StreamSynchronize(stream).ok());
    return d;
  }
  std::vector<uint8_t> Download(void* d, size_t n) {
    std::vector<uint8_t> out(n);
    EXPECT_TRUE(device.MemcpyAsync(out.data(), d, n, CopyKind::kDeviceToHost, stream).ok());
    EXPECT_TRUE(device.StreamSynchronize(stream).ok());
    return out;
  }
};

std::vector<uint8_t> Pattern(size_t n, int seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + 31 * i + (i >> 9));
  return v;
}

// Initializes `ranks` (all of them, each in its own thread: Init is collective).
void InitAll(std::vector<std::unique_ptr<Rank>>& ranks) {
  const std::string id = ranks[0]->factory->NewId().value();
  const int n = static_cast<int>(ranks.size());
  std::vector<std::future<absl::StatusOr<std::unique_ptr<DeviceComm>>>> f;
  for (int r = 0; r < n; ++r) {
    f.push_back(
        std::async(std::launch::async, [&, r] { return ranks[r]->factory->Init(id, n, r, 0); }));
  }
  for (int r = 0; r < n; ++r) {
    absl::StatusOr<std::unique_ptr<DeviceComm>> c = f[r].get();
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ((*c)->rank(), r);
    EXPECT_EQ((*c)->nranks(), n);
    ranks[r]->comm = *std::move(c);
  }
}

TEST(FakeCommTest, AGroupedRingMovesExactBytesOfEverySize) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < 3; ++r) ranks.push_back(std::make_unique<Rank>());
  InitAll(ranks);
  // Several transfers to one peer in one group: they match in order.
  const std::vector<size_t> sizes = {0, 1, 4097, (size_t{1} << 20) + 3};
  std::vector<std::vector<void*>> src(3), dst(3);
  for (int r = 0; r < 3; ++r) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      src[r].push_back(ranks[r]->Upload(Pattern(sizes[k], 10 * r + static_cast<int>(k))));
      dst[r].push_back(ranks[r]->Upload(std::vector<uint8_t>(sizes[k], 0xee)));
    }
  }
  std::vector<std::future<absl::Status>> done;
  for (int r = 0; r < 3; ++r) {
    done.push_back(std::async(std::launch::async, [&, r] {
      Rank& me = *ranks[r];
      return RingStep(*me.comm, me.device, me.stream, src[r], dst[r], sizes);
    }));
  }
  for (auto& d : done) {
    absl::Status s = d.get();
    EXPECT_TRUE(s.ok()) << s;
  }
  for (int r = 0; r < 3; ++r) {
    const int from = (r + 2) % 3;
    for (size_t k = 0; k < sizes.size(); ++k) {
      EXPECT_EQ(ranks[r]->Download(dst[r][k], sizes[k]),
                Pattern(sizes[k], 10 * from + static_cast<int>(k)))
          << "rank " << r << " size " << sizes[k];
    }
  }
}

TEST(FakeCommTest, AReceiveLandsOnlyInStreamOrder) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < 2; ++r) ranks.push_back(std::make_unique<Rank>());
  InitAll(ranks);
  const std::vector<uint8_t> bytes = Pattern(777, 5);
  void* src = ranks[0]->Upload(bytes);
  void* dst = ranks[1]->Upload(std::vector<uint8_t>(777, 0));
  std::function<void()> release = ranks[1]->device.HoldStream(ranks[1]->stream);
  ASSERT_TRUE(ranks[1]->comm->Recv(dst, 777, 0, ranks[1]->stream).ok());
  ASSERT_TRUE(ranks[0]->comm->Send(src, 777, 1, ranks[0]->stream).ok());
  ASSERT_TRUE(ranks[0]->device.StreamSynchronize(ranks[0]->stream).ok());  // in the socket
  // The receiver's stream has not run the receive: its memory is unchanged.
  EXPECT_EQ(*ranks[1]->device.HostView("test", dst, 1, 0).value(), 0);
  release();
  ASSERT_TRUE(ranks[1]->device.StreamSynchronize(ranks[1]->stream).ok());
  EXPECT_EQ(ranks[1]->Download(dst, 777), bytes);
}

TEST(FakeCommTest, MismatchedSizesAndBadArgumentsAreRefusedNamingThem) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < 2; ++r) ranks.push_back(std::make_unique<Rank>());
  InitAll(ranks);
  void* a = ranks[0]->Upload(Pattern(64, 1));
  void* b = ranks[1]->Upload(Pattern(64, 2));
  absl::Status self = ranks[0]->comm->Send(a, 64, 0, ranks[0]->stream);
  EXPECT_EQ(self.code(), absl::StatusCode::kInvalidArgument) << self;
  int host_byte = 0;
  absl::Status host = ranks[0]->comm->Send(&host_byte, 1, 1, ranks[0]->stream);
  EXPECT_EQ(host.code(), absl::StatusCode::kInvalidArgument) << host;
  ASSERT_TRUE(ranks[0]->comm->Send(a, 64, 1, ranks[0]->stream).ok());
  ASSERT_TRUE(ranks[1]->comm->Recv(b, 32, 0, ranks[1]->stream).ok());
  absl::Status s = ranks[1]->device.StreamSynchronize(ranks[1]->stream);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "ncclRecv from peer rank 0")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "sent 64 bytes")) << s;
}

TEST(FakeCommTest, ARankThatNeverJoinsFailsInitNamingIt) {
  Rank root(milliseconds(300));
  const std::string id = root.factory->NewId().value();
  absl::StatusOr<std::unique_ptr<DeviceComm>> c = root.factory->Init(id, 3, 0, 0);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "rank(s) 1, 2 never joined")) << c.status();
  // Rank 0 only on the factory that made the id.
  Rank other;
  EXPECT_EQ(other.factory->Init(root.factory->NewId().value(), 2, 0, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// A host that failed before its bootstrap never joins: a cancel ends the
// others' Init at once (the factory's own timeout is a minute), naming the
// ranks that had not joined; so does a deadline, as UNAVAILABLE; and a
// rank waiting for rank 0 ends on cancel too.
TEST(FakeCommTest, ACancelOrADeadlineEndsInitWhileARankNeverJoins) {
  using Clock = std::chrono::steady_clock;
  Rank root(milliseconds(60000));
  int polls = 0;
  const std::function<bool()> cancel_soon = [&] { return ++polls > 3; };
  auto start = Clock::now();
  absl::StatusOr<std::unique_ptr<DeviceComm>> c = root.factory->Init(
      root.factory->NewId().value(), 3, 0, 0, cancel_soon, DeviceCommFactory::kNoDeadline);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kCancelled) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "rank(s) 1, 2 had not joined")) << c.status();
  EXPECT_EQ(polls, 4);

  start = Clock::now();
  c = root.factory->Init(root.factory->NewId().value(), 3, 0, 0, nullptr,
                         Clock::now() + milliseconds(300));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "rank(s) 1, 2 never joined within"))
      << c.status();

  // Rank 1 reaches rank 0's listener, but rank 0 never runs Init.
  Rank member(milliseconds(60000));
  polls = 0;
  start = Clock::now();
  c = member.factory->Init(root.factory->NewId().value(), 2, 1, 0, cancel_soon,
                           DeviceCommFactory::kNoDeadline);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kCancelled) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "waiting for rank 0")) << c.status();
}

TEST(FakeCommTest, AbortFailsATransferInFlight) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < 2; ++r) ranks.push_back(std::make_unique<Rank>());
  InitAll(ranks);
  void* d = ranks[0]->Upload(std::vector<uint8_t>(100, 0));
  ASSERT_TRUE(ranks[0]->comm->Recv(d, 100, 1, ranks[0]->stream).ok());  // never sent
  ranks[0]->comm->Abort();
  absl::Status s = ranks[0]->device.StreamSynchronize(ranks[0]->stream);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(ranks[0]->comm->Send(d, 100, 1, ranks[0]->stream).code(), absl::StatusCode::kAborted);
}

// A child process that is rank 1 of 2 (stdin and stdout on pipes).
class CommPeer {
 public:
  explicit CommPeer(const std::string& id) {
    test_support::SpawnOptions o;
    o.argv = {RESHARD_COMM_PEER_PATH, absl::BytesToHexString(id), "2", "1"};
    o.in = test_support::Stream::Pipe();
    o.out = test_support::Stream::Pipe();
    absl::StatusOr<test_support::ChildProcess> child = test_support::ChildProcess::Spawn(o);
    EXPECT_TRUE(child.ok()) << child.status();
    if (child.ok()) child_ = *std::move(child);
  }
  // The byte the peer writes once it joined (bounded wait).
  bool Joined() {
    pollfd p{child_.out_fd(), POLLIN, 0};
    char c = 0;
    return poll(&p, 1, 30000) == 1 && read(child_.out_fd(), &c, 1) == 1 && c == 'r';
  }
  void Kill() {
    absl::StatusOr<int> status = child_.Kill();
    EXPECT_TRUE(status.ok()) << status.status();
  }

 private:
  test_support::ChildProcess child_;  // killed and reaped when destroyed
};

TEST(FakeCommTest, APeerThatDiesFailsTheSynchronizeNamingIt) {
  Rank root;
  const std::string id = root.factory->NewId().value();
  CommPeer peer(id);
  absl::StatusOr<std::unique_ptr<DeviceComm>> c = root.factory->Init(id, 2, 0, 0);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(peer.Joined());
  root.comm = *std::move(c);
  void* d = root.Upload(std::vector<uint8_t>(1 << 16, 0));
  ASSERT_TRUE(root.comm->Recv(d, 1 << 16, 1, root.stream).ok());
  peer.Kill();
  absl::Status s = root.device.StreamSynchronize(root.stream);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "ncclRecv from peer rank 1")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "65536 bytes")) << s;
  // The communicator is broken: later transfers fail at once.
  EXPECT_EQ(root.comm->Send(d, 16, 1, root.stream).code(), absl::StatusCode::kUnavailable);
}

TEST(FakeCommTest, TheFactoryFollowsTheDeviceApi) {
  FakeDeviceApi fake(FakeDeviceApi::Options{});
  std::string why;
  std::unique_ptr<DeviceCommFactory> f = MakeDeviceCommFactory(&fake, &why);
  ASSERT_NE(f, nullptr) << why;
  EXPECT_EQ(f->capabilities().name, "fake");
  const BackendCapabilities c = DeviceCommBackendCapabilities(*f);
  EXPECT_EQ(c.name, "fake-nccl");  // as advertised (backend.h)
  EXPECT_EQ(c.memory_kinds, std::vector<MemoryKind>{MemoryKind::kCuda});
  EXPECT_TRUE(c.remote);
  EXPECT_TRUE(c.used_by_executor);
  EXPECT_EQ(MakeDeviceCommFactory(nullptr, &why), nullptr);
  EXPECT_EQ(why, "no device API");
}

}  // namespace
}  // namespace reshard::agent
