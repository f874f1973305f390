// Two "hosts" in one process (two shard stores in temp dirs, two UCX
// transports over loopback) execute their slices of a real plan; every new
// byte is checked against the global tensors (executor_fixture.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "tests/agent/executor/executor_fixture.h"

namespace reshard::agent {
namespace {

using namespace executor_testing;  // NOLINT: the fixture's helpers

TEST_F(ExecutorTest, TwoHostsReshardTp2To4AndDp3To2) {
  MakeHosts();
  FillOld();
  const v1::HostTask whole = WholeTask();
  ASSERT_GT(whole.plan().stats().bytes_cross_host(), 0);
  ASSERT_GT(whole.plan().zero_fills_size(), 0);
  ExpectResharded(whole, 6);
}

// With the operation's transfer secret (as the coordinator sends it), every
// sender proves itself to every receiver first, and tags derive from it.
TEST_F(ExecutorTest, HostsWithTheTransferSecretProveThemselvesAndReshard) {
  MakeHosts();
  FillOld();
  v1::HostTask whole = WholeTask();
  whole.set_transfer_secret(std::string(32, 'k'));
  ExpectResharded(whole, 6);
}

// A host whose task carries another secret (not a peer of the operation)
// gets no data from, and gives none to, the others: each side fails naming
// the peer whose proof never came, drops its new buffers, and keeps the old
// generation.
TEST_F(ExecutorTest, AHostWithAnotherSecretIsRefusedAndNothingIsCommitted) {
  proof_timeout_ms_ = 1500;
  MakeHosts();
  FillOld();
  v1::HostTask whole = WholeTask();
  ASSERT_GT(whole.plan().stats().bytes_cross_host(), 0);
  const auto addrs = Addresses();
  // h1 receives from h0: it must fail on its own. Then the operation is
  // aborted (cancelled() turns true), as the coordinator does on a failure.
  std::atomic<bool> aborted{false};
  std::vector<std::future<absl::StatusOr<std::vector<v1::ShardChecksum>>>> runs;
  for (auto& h : hosts_) {
    v1::HostTask task = Slice(whole, h.id, addrs);
    task.set_transfer_secret(std::string(32, h.id == "h0" ? 'f' : 'k'));
    runs.push_back(std::async(std::launch::async, [&h, task, &aborted] {
      return h.executor->Execute(h.id, task, nullptr, [&] { return aborted.load(); });
    }));
  }
  auto h1 = runs[1].get();
  aborted = true;
  EXPECT_EQ(h1.status().code(), absl::StatusCode::kDeadlineExceeded) << h1.status();
  EXPECT_THAT(std::string(h1.status().message()), ::testing::HasSubstr("\"h0\""));
  auto h0 = runs[0].get();
  EXPECT_FALSE(h0.ok());
  for (const Host& h : hosts_) EXPECT_EQ(NewBuffers(h), 0) << h.id;
  // The old generation is intact.
  const auto slots = planner::ExpandPlacement(from_.placement());
  for (int r = 0; r < static_cast<int>(slots.size()); ++r) {
    Host& h = hosts_[slots[r].host() == "h0" ? 0 : 1];
    auto got = h.store->Get({kJob, 1, r});
    ASSERT_TRUE(got.ok()) << got.status();
    VectorBuffer want((*got)->items(), (*got)->size());
    RenderRank(ptc_, from_, r, 6, &want);
    EXPECT_EQ(0, std::memcmp(want.data(), (*got)->data(), want.size())) << "rank " << r;
  }
}

// Cross-host steps larger than the chunk size, strided at both ends and
// fanned out to two ranks of one host, travel as many chunks whose
// boundaries fall inside rows (1000 bytes against rows of 1024, 96 and 16);
// local steps are copied in pieces of the same size.
TEST_F(ExecutorTest, ChunkedStridedAndFanOutStepsAreByteExact) {
  ptc_ = ExecutorPtc(256);
  v1::TensorSpec c = Tensor("c", {64, 96});
  SetTpSplit(&c, 1);  // columns 32 each -> 48 each: strided at both ends
  *ptc_.add_tensors() = c;
  from_ = MakeLayoutOnHosts(3, 1, 1, 3);  // h0: ranks 0-2, nothing on h1
  to_ = MakeLayoutOnHosts(2, 1, 4, 4);    // h0: dp 0-1, h1: dp 2-3 (replicas side by side)
  constexpr int64_t kChunk = 1000;
  MakeHosts(int64_t{1} << 30, kChunk);
  FillOld();
  const v1::HostTask whole = WholeTask();
  bool large = false, fan_out = false, strided = false, large_local = false;
  const auto old_slots = planner::ExpandPlacement(from_.placement());
  const auto new_slots = planner::ExpandPlacement(to_.placement());
  for (const v1::CopyStep& s : whole.plan().steps()) {
    if (old_slots[s.src_rank()].host() == new_slots[s.dsts(0).rank()].host()) {
      large_local |= s.bytes() > kChunk;
      continue;
    }
    const std::vector<int64_t> shape(s.shape().begin(), s.shape().end());
    large |= s.bytes() > kChunk;
    fan_out |= s.dsts_size() > 1;
    const std::vector<int64_t> src(s.src().strides().begin(), s.src().strides().end());
    const std::vector<int64_t> dst(s.dsts(0).region().strides().begin(),
                                   s.dsts(0).region().strides().end());
    strided |= s.bytes() > kChunk && !IsContiguous(shape, src) && !IsContiguous(shape, dst);
  }
  ASSERT_TRUE(large && fan_out && strided && large_local)
      << large << fan_out << strided << large_local;
  ExpectResharded(whole, 3);
}

TEST_F(ExecutorTest, StepIndexBeyondTheTagIsInvalidArgumentBeforeAnythingIsMade) {
  MakeHosts();
  FillOld();
  v1::HostTask whole = WholeTask();
  const auto old_slots = planner::ExpandPlacement(from_.placement());
  const auto new_slots = planner::ExpandPlacement(to_.placement());
  bool changed = false;
  for (v1::CopyStep& s : *whole.mutable_plan()->mutable_steps()) {
    if (old_slots[s.src_rank()].host() != new_slots[s.dsts(0).rank()].host()) {
      s.set_index(kMaxTaggedSteps);
      changed = true;
      break;
    }
  }
  ASSERT_TRUE(changed);
  const v1::HostTask task = Slice(whole, "h0", Addresses());
  auto result = hosts_[0].executor->Execute("h0", task, nullptr, [] { return false; });
  ASSERT_TRUE(absl::IsInvalidArgument(result.status())) << result.status();
  EXPECT_NE(std::string(result.status().message()).find("tag"), std::string::npos)
      << result.status();
  EXPECT_EQ(NewBuffers(hosts_[0]), 0);
}

TEST_F(ExecutorTest, ATaskWhosePlanRepeatsIsInvalidArgumentBeforeAnythingIsMade) {
  MakeHosts();
  FillOld();
  v1::HostTask task = Slice(WholeTask(), "h0", Addresses());
  task.mutable_plan()->mutable_replicas()->set_count(2);
  auto result = hosts_[0].executor->Execute("h0", task, nullptr, [] { return false; });
  ASSERT_TRUE(absl::IsInvalidArgument(result.status())) << result.status();
  EXPECT_NE(std::string(result.status().message()).find("repeats over 2 replicas"),
            std::string::npos)
      << result.status();
  EXPECT_EQ(NewBuffers(hosts_[0]), 0);
}

TEST_F(ExecutorTest, MissingOldShardIsNotFoundAndLeavesNoNewBuffers) {
  MakeHosts();
  FillOld(/*skip_rank=*/1);
  const v1::HostTask task = Slice(WholeTask(), "h0", Addresses());
  auto result = hosts_[0].executor->Execute("h0", task, nullptr, [] { return false; });
  ASSERT_TRUE(absl::IsNotFound(result.status())) << result.status();
  EXPECT_NE(std::string(result.status().message()).find("rank 1"), std::string::npos)
      << result.status();
  EXPECT_EQ(NewBuffers(hosts_[0]), 0);
}

TEST_F(ExecutorTest, MemoryLimitIsResourceExhaustedBeforeAnyByteMoves) {
  // Room for the old generation (3 ranks) but not for 4 new ones as well.
  const int64_t old_bytes = [&] {
    int64_t n = 0;
    for (int64_t b : RankItemBytes(ptc_, from_, 0)) n += (b + 63) / 64 * 64;
    return n;
  }();
  MakeHosts(old_bytes * 3 + 4096);
  FillOld();
  const v1::HostTask task = Slice(WholeTask(), "h0", Addresses());
  int64_t max_done = 0;
  auto result = hosts_[0].executor->Execute(
      "h0", task, [&](int64_t done, int64_t) { max_done = std::max(max_done, done); },
      [] { return false; });
  ASSERT_TRUE(absl::IsResourceExhausted(result.status())) << result.status();
  EXPECT_EQ(max_done, 0);
  EXPECT_EQ(NewBuffers(hosts_[0]), 0);
  EXPECT_EQ(hosts_[1].transport->pending(), 0u);
}

TEST_F(ExecutorTest, PeerDiesMidTransferFailsAndDropsNewBuffers) {
  MakeHosts();
  FillOld();
  const v1::HostTask task = Slice(WholeTask(), "h0", Addresses());
  // h1 never runs its slice: h0's receives wait on it; then h1 dies.
  WaitingOn waiting_on;
  auto run = std::async(std::launch::async, [&] {
    auto r = hosts_[0].executor->Execute(
        "h0", task, nullptr, [] { return false; }, waiting_on.Callback());
    waiting_on.Finished();
    return r;
  });
  // What a stalled task reports: the step it waits on, and the peer.
  const ::testing::Matcher<std::string> stalled =
      ::testing::MatchesRegex("step [0-9]+ \\((receive from|send to) host \"h1\"\\)");
  EXPECT_THAT(waiting_on.WaitFor([&](const std::string& w) { return stalled.Matches(w); }),
              stalled);
  ASSERT_EQ(run.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  hosts_[1].transport->Shutdown();
  ASSERT_EQ(run.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "hangs";
  auto result = run.get();
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::IsUnavailable(result.status())) << result.status();
  EXPECT_EQ(NewBuffers(hosts_[0]), 0);
  // The old generation is untouched.
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(hosts_[0].store->Get({kJob, 1, r}).ok());
}

TEST_F(ExecutorTest, CancelledStopsAndDropsNewBuffers) {
  MakeHosts();
  FillOld();
  const v1::HostTask task = Slice(WholeTask(), "h0", Addresses());
  EXPECT_TRUE(absl::IsCancelled(CancelWhileWaiting(hosts_[0], task)));
  EXPECT_EQ(NewBuffers(hosts_[0]), 0);
}

std::string OldFile(const Host& h, int rank) {
  return (h.dir / RankBufferFileName(h.id, RankBufferKey{kJob, 1, rank})).string();
}

// Issue 9, defect 1: a source whose bytes no longer match its sealed
// checksum (written as root, after the seal) fails the task with DataLoss.
TEST_F(ExecutorTest, SourceChangedAfterItsSealIsDataLossAndNothingIsKept) {
  MakeHosts();
  FillOld();
  {
    const int fd = ::open(OldFile(hosts_[0], 0).c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    const uint8_t b = 0x5a;
    ASSERT_EQ(::pwrite(fd, &b, 1, 3), 1);  // inside item 0 ("w")
    ::close(fd);
  }
  auto results = RunHosts(WholeTask(), /*abort_on_failure=*/false);
  ASSERT_EQ(results[0].status().code(), absl::StatusCode::kDataLoss) << results[0].status();
  EXPECT_THAT(std::string(results[0].status().message()),
              ::testing::AllOf(::testing::HasSubstr("rank 0"), ::testing::HasSubstr("\"w\"")));
  EXPECT_EQ(NewBuffers(hosts_[0]), 0);
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(hosts_[0].store->Get({kJob, 1, r}).ok());
}

// A process that asks to write (or truncate) a source while the task reads
// it breaks the task's read lease: DataLoss, and the writer waits meanwhile.
TEST_F(ExecutorTest, WriterArrivingDuringTheTaskIsDataLoss) {
  MakeHosts();
  FillOld();
  const std::string victim = OldFile(hosts_[0], 1);
  int open_errno = 0;
  bool tried = false;
  auto results = RunHosts(WholeTask(), /*abort_on_failure=*/false, [&](int64_t, int64_t) {
    if (tried) return;
    tried = true;
    // O_NONBLOCK: fails with EWOULDBLOCK at once, and still breaks the lease.
    const int fd = ::open(victim.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
    open_errno = fd < 0 ? errno : 0;
    if (fd >= 0) ::close(fd);
  });
  EXPECT_TRUE(tried);
  EXPECT_EQ(open_errno, EWOULDBLOCK) << "the lease must hold writers off while the task reads";
  ASSERT_EQ(results[0].status().code(), absl::StatusCode::kDataLoss) << results[0].status();
  EXPECT_EQ(NewBuffers(hosts_[0]), 0);
  // Once the task is over, writers get through again.
  const int fd = ::open(victim.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  EXPECT_GE(fd, 0) << std::strerror(errno);
  if (fd >= 0) ::close(fd);
}

TEST_F(ExecutorTest, TruncatedSourceIsDataLossBeforeAnythingIsMade) {
  MakeHosts();
  FillOld();
  ASSERT_EQ(::truncate(OldFile(hosts_[0], 2).c_str(), 0), 0);
  const v1::HostTask task = Slice(WholeTask(), "h0", Addresses());
  auto result = hosts_[0].executor->Execute("h0", task, nullptr, [] { return false; });
  ASSERT_EQ(result.status().code(), absl::StatusCode::kDataLoss) << result.status();
  EXPECT_EQ(NewBuffers(hosts_[0]), 0);
}

TEST_F(ExecutorTest, UnsealedSourceIsFailedPrecondition) {
  MakeHosts();
  FillOld(/*skip_rank=*/0);
  ASSERT_TRUE(hosts_[0]
                  .store->CreateAll({RankBufferKey{kJob, 1, 0}}, {RankItemBytes(ptc_, from_, 0)})
                  .ok());
  const v1::HostTask task = Slice(WholeTask(), "h0", Addresses());
  auto result = hosts_[0].executor->Execute("h0", task, nullptr, [] { return false; });
  ASSERT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
  EXPECT_THAT(std::string(result.status().message()), ::testing::HasSubstr("not sealed"));
}

// Issue 9, defect 5: buffers an earlier attempt left (unsealed or sealed)
// do not fail the task with AlreadyExists; they are made again.
TEST_F(ExecutorTest, LeftoversOfAnEarlierAttemptAreDiscarded) {
  MakeHosts();
  FillOld();
  for (int r : {0, 3}) {
    ASSERT_TRUE(hosts_[0]
                    .store
                    ->CreateAll({RankBufferKey{kJob, 2, r}}, {RankItemBytes(ptc_, to_, r)},
                                ShardStore::Backing::kReserved)
                    .ok());
  }
  ASSERT_TRUE(hosts_[0].store->Seal({kJob, 2, 3}, {}).ok());
  ExpectResharded(WholeTask(), 6);
}

TEST(OperationTagKeyTest, StableAndDistinct) {
  EXPECT_EQ(OperationTagKey("op-1"), OperationTagKey("op-1"));
  EXPECT_NE(OperationTagKey("op-1"), OperationTagKey("op-2"));
}

}  // namespace
}  // namespace reshard::agent
