// Two-phase (stop-free) operations on the executor (task_phase.h): two
// "hosts" in one process over UCX loopback (executor_fixture.h) prepare
// generation 3 from generation 1 while the old layout goes on to generation
// 2, in which some shards change; the prepared phase, with the steps of the
// unchanged shards pruned the way the coordinator prunes them (from the
// prepare's source checksums), must leave exactly what a plain transfer from
// generation 2 writes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "agent/executor/task_phase.h"
#include "agent/executor/transfer_tags.h"
#include "tests/agent/executor/executor_fixture.h"

namespace reshard::agent {
namespace {

using namespace executor_testing;  // NOLINT: the fixture's helpers
using ::testing::HasSubstr;
using ShardKey = std::pair<int, int>;  // (rank, item)

constexpr char kOp[] = "op-stop-free";

class PrepareTest : public ExecutorTest {
 protected:
  void SetUp() override {
    ExecutorTest::SetUp();
    MakeHosts();
    FillOld();  // generation 1
  }

  // The whole plan as a task of operation `op` from `from` to `to`.
  v1::HostTask Task(const std::string& op, int64_t from, int64_t to) {
    v1::HostTask t = WholeTask();
    t.set_operation_id(op);
    t.set_from_generation(from);
    t.set_to_generation(to);
    return t;
  }

  Host& HostOfOld(int rank) {
    return hosts_[planner::ExpandPlacement(from_.placement())[rank].host() == "h0" ? 0 : 1];
  }
  Host& HostOfNew(int rank) {
    return hosts_[planner::ExpandPlacement(to_.placement())[rank].host() == "h0" ? 0 : 1];
  }
  int NewWorld() { return static_cast<int>(planner::ExpandPlacement(to_.placement()).size()); }

  // Generation `gen` of the old layout, sealed: generation 1's bytes, with
  // every byte of the shards in `changed` altered.
  void WriteOldGeneration(int64_t gen, const std::set<ShardKey>& changed) {
    for (int r = 0; r < 6; ++r) {
      Host& h = HostOfOld(r);
      auto old = h.store->Get({kJob, 1, r});
      ASSERT_TRUE(old.ok()) << old.status();
      auto bufs =
          h.store->CreateAll({RankBufferKey{kJob, gen, r}}, {RankItemBytes(ptc_, from_, r)});
      ASSERT_TRUE(bufs.ok()) << bufs.status();
      RankBuffer& b = *(*bufs)[0];
      std::memcpy(b.data(), (*old)->data(), b.size());
      for (const auto& [rank, item] : changed) {
        if (rank != r) continue;
        ASSERT_GT(b.items()[item].bytes, 0) << "rank " << r << " item " << item;
        for (int64_t i = 0; i < b.items()[item].bytes; ++i) b.item_data(item)[i] ^= 0x5a;
      }
      ASSERT_TRUE(h.store->Seal({kJob, gen, r}, {}).ok());
    }
  }

  // What the coordinator does at the cut-over (docs/coordinator.md, "Agents
  // prepare"): `prepare` made into the prepared phase from generation
  // `from`, without the steps whose source shard has the same checksum and
  // bytes in `from` as the prepare reported, and without zero fills.
  // `also_drop`: step indexes pruned besides (a deliberately wrong pruning).
  v1::HostTask Pruned(const v1::HostTask& prepare, const Results& prepared, int64_t from,
                      const std::set<int64_t>& also_drop = {}) {
    std::map<ShardKey, v1::ShardChecksum> reported;
    for (const auto& r : prepared) {
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) continue;
      for (const v1::ShardChecksum& c : *r) reported[{c.rank(), c.item()}] = c;
    }
    skipped_.clear();
    return TransferPhaseOf(prepare, from, [&](const v1::CopyStep& s) {
      const bool skip = SourceUnchanged(*HostOfOld(s.src_rank()).store, from, s, reported) ||
                        also_drop.count(s.index()) != 0;
      if (skip) skipped_.push_back(s);
      return skip;
    });
  }

  // Every new rank of generation `a` equals, byte for byte, generation `b`.
  // Returns the ranks that differ (and fails unless `expect_equal` is false).
  std::set<int> CompareGenerations(int64_t a, int64_t b, bool expect_equal = true) {
    std::set<int> differ;
    for (int r = 0; r < NewWorld(); ++r) {
      Host& h = HostOfNew(r);
      auto x = h.store->Get({kJob, a, r});
      auto y = h.store->Get({kJob, b, r});
      EXPECT_TRUE(x.ok() && y.ok()) << "rank " << r;
      if (!x.ok() || !y.ok()) continue;
      EXPECT_EQ((*x)->size(), (*y)->size());
      if ((*x)->size() != (*y)->size() ||
          std::memcmp((*x)->data(), (*y)->data(), (*x)->size()) != 0) {
        differ.insert(r);
      }
    }
    if (expect_equal) {
      EXPECT_THAT(differ, ::testing::IsEmpty());
    }
    return differ;
  }

  // The checksums of all hosts' results, by (rank, item).
  static std::map<ShardKey, std::pair<uint64_t, int64_t>> Sums(const Results& results) {
    std::map<ShardKey, std::pair<uint64_t, int64_t>> out;
    for (const auto& r : results) {
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) continue;
      for (const auto& c : *r) out[{c.rank(), c.item()}] = {c.checksum(), c.bytes()};
    }
    return out;
  }

  int Buffers(const Host& h, int64_t gen, bool sealed) {
    int n = 0;
    for (const auto& k : h.store->List()) {
      if (k.generation != gen) continue;
      auto b = h.store->Get(k);
      n += b.ok() && (*b)->sealed() == sealed;
    }
    return n;
  }

  std::vector<v1::CopyStep> skipped_;  // by the last Pruned
};

// The whole cycle: prepare 1 -> 3, generation 2 changes some shards, the
// prepared phase moves only the changed shards' steps, and generation 3 is
// then byte for byte what a plain transfer 2 -> 5 makes.
TEST_F(PrepareTest, PreparedPhaseWithUnchangedStepsPrunedEqualsAPlainTransfer) {
  v1::HostTask prepare = Task(kOp, 1, 3);
  prepare.set_prepare(true);
  const Results prepared = RunHosts(prepare);
  const auto addrs = Addresses();
  const auto old_slots = planner::ExpandPlacement(from_.placement());
  for (size_t i = 0; i < hosts_.size(); ++i) {
    const Host& h = hosts_[i];
    ASSERT_TRUE(prepared[i].ok()) << h.id << ": " << prepared[i].status();
    // The new buffers stay, unsealed.
    EXPECT_EQ(Buffers(h, 3, /*sealed=*/false), 4) << h.id;
    EXPECT_EQ(Buffers(h, 3, /*sealed=*/true), 0) << h.id;
    // One sealed checksum per old shard this host read, equal to the seal.
    std::set<ShardKey> read;
    const v1::HostTask slice = Slice(prepare, h.id, addrs);
    for (const v1::CopyStep& s : slice.plan().steps()) {
      if (old_slots[s.src_rank()].host() == h.id) read.insert({s.src_rank(), s.item()});
    }
    std::set<ShardKey> got;
    for (const v1::ShardChecksum& c : *prepared[i]) {
      EXPECT_TRUE(got.insert({c.rank(), c.item()}).second) << "twice: " << c.ShortDebugString();
      auto old = h.store->Get({kJob, 1, c.rank()});
      ASSERT_TRUE(old.ok()) << h.id << " rank " << c.rank() << ": " << old.status();
      EXPECT_EQ(c.checksum(), (*old)->checksums()[c.item()]) << c.ShortDebugString();
      EXPECT_EQ(c.bytes(), (*old)->items()[c.item()].bytes) << c.ShortDebugString();
    }
    EXPECT_EQ(got, read) << h.id;
  }

  // The old layout trains on: generation 2 changes "w" of rank 0 and "o" of
  // rank 2 (h0; h1 needs some of it) and "m" of rank 4 (h1); every other
  // shard keeps its bytes.
  WriteOldGeneration(2, {{0, 0}, {2, 3}, {4, 2}});
  const v1::HostTask transfer = Pruned(prepare, prepared, 2);
  bool kept_cross = false, skipped_cross = false;
  const auto new_slots = planner::ExpandPlacement(to_.placement());
  auto cross = [&](const v1::CopyStep& s) {
    return old_slots[s.src_rank()].host() != new_slots[s.dsts(0).rank()].host();
  };
  for (const v1::CopyStep& s : transfer.plan().steps()) kept_cross |= cross(s);
  for (const v1::CopyStep& s : skipped_) skipped_cross |= cross(s);
  ASSERT_GT(transfer.plan().steps_size(), 0);
  ASSERT_FALSE(skipped_.empty());
  ASSERT_TRUE(kept_cross && skipped_cross) << kept_cross << skipped_cross;
  const Results done = RunHosts(transfer);
  for (size_t i = 0; i < hosts_.size(); ++i) {
    ASSERT_TRUE(done[i].ok()) << hosts_[i].id << ": " << done[i].status();
    EXPECT_EQ(Buffers(hosts_[i], 3, /*sealed=*/true), 4) << hosts_[i].id;
  }

  // The reference: a plain transfer of generation 2.
  const Results plain = RunHosts(Task("op-plain", 2, 5));
  CompareGenerations(3, 5);
  EXPECT_EQ(Sums(done), Sums(plain));
  // And every new shard is checksummed, whether or not a step wrote it now.
  EXPECT_EQ(Sums(done).size(), Sums(plain).size());
}

// A pruning that also drops one step whose source changed leaves the stale
// pre-copy in its destination: the result differs from the plain transfer.
// (So the equality above is no accident of the pre-copy.)
TEST_F(PrepareTest, PruningAChangedStepLeavesTheStalePreCopy) {
  v1::HostTask prepare = Task(kOp, 1, 3);
  prepare.set_prepare(true);
  const Results prepared = RunHosts(prepare);
  for (const auto& r : prepared) ASSERT_TRUE(r.ok()) << r.status();
  WriteOldGeneration(2, {{0, 0}, {4, 2}});
  // The first step that reads a changed shard.
  const v1::HostTask right = Pruned(prepare, prepared, 2);
  ASSERT_GT(right.plan().steps_size(), 0);
  const v1::CopyStep wrongly = right.plan().steps(0);
  ASSERT_GT(wrongly.bytes(), 0);
  const v1::HostTask wrong = Pruned(prepare, prepared, 2, {wrongly.index()});
  ASSERT_EQ(wrong.plan().steps_size(), right.plan().steps_size() - 1);
  const Results done = RunHosts(wrong);
  for (const auto& r : done) ASSERT_TRUE(r.ok()) << r.status();
  const Results plain = RunHosts(Task("op-plain", 2, 5));
  for (const auto& r : plain) ASSERT_TRUE(r.ok()) << r.status();
  std::set<int> want;
  for (const auto& d : wrongly.dsts()) want.insert(d.rank());
  EXPECT_EQ(CompareGenerations(3, 5, /*expect_equal=*/false), want);
  EXPECT_NE(Sums(done), Sums(plain));
}

// A prepare that fails drops its new buffers, as a plain task does.
TEST_F(PrepareTest, AFailedPrepareDropsItsBuffers) {
  v1::HostTask prepare = Task(kOp, 1, 3);
  prepare.set_prepare(true);
  // h1 never runs its slice, so h0 waits on it until cancelled.
  const v1::HostTask task = Slice(prepare, "h0", Addresses());
  EXPECT_TRUE(absl::IsCancelled(CancelWhileWaiting(hosts_[0], task)));
  EXPECT_EQ(Buffers(hosts_[0], 3, false) + Buffers(hosts_[0], 3, true), 0);
}

// The prepared phase refuses to run without its prepare's buffers: a
// missing, sealed or wrongly sized one is FAILED_PRECONDITION naming job,
// generation and rank, before anything moves or is dropped.
TEST_F(PrepareTest, PreparedPhaseWithoutItsBuffersIsFailedPrecondition) {
  v1::HostTask prepared = Task(kOp, 1, 3);
  prepared.set_prepared(true);
  const v1::HostTask task = Slice(prepared, "h0", Addresses());
  auto run = [&] { return hosts_[0].executor->Execute("h0", task, nullptr, [] { return false; }); };
  // h0 holds new ranks 0-3.
  auto missing = run();
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition) << missing.status();
  EXPECT_THAT(std::string(missing.status().message()),
              ::testing::AllOf(HasSubstr("\"job-x\""), HasSubstr("generation 3 rank 0"),
                               HasSubstr("not found")));

  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(hosts_[0]
                    .store
                    ->CreateAll({RankBufferKey{kJob, 3, r}}, {RankItemBytes(ptc_, to_, r)},
                                ShardStore::Backing::kReserved)
                    .ok());
  }
  ASSERT_TRUE(hosts_[0].store->Seal({kJob, 3, 2}, {}).ok());
  auto sealed = run();
  ASSERT_EQ(sealed.status().code(), absl::StatusCode::kFailedPrecondition) << sealed.status();
  EXPECT_THAT(std::string(sealed.status().message()),
              ::testing::AllOf(HasSubstr("generation 3 rank 2"), HasSubstr("sealed")));

  hosts_[0].store->Drop({kJob, 3, 2});
  std::vector<int64_t> other = RankItemBytes(ptc_, to_, 2);
  other[0] += 8;
  ASSERT_TRUE(hosts_[0].store->CreateAll({RankBufferKey{kJob, 3, 2}}, {other}).ok());
  auto sized = run();
  ASSERT_EQ(sized.status().code(), absl::StatusCode::kFailedPrecondition) << sized.status();
  EXPECT_THAT(std::string(sized.status().message()),
              ::testing::AllOf(HasSubstr("generation 3 rank 2"), HasSubstr("bytes")));
  // Nothing was dropped by the refusals.
  EXPECT_EQ(Buffers(hosts_[0], 3, false), 4);
}

// A message sent under the prepare's tags is not received by the prepared
// phase of the same operation: h0 sends h1, under the prepare's tag of a
// cross-host step's first chunk, bytes of the right length but wrong
// content, and makes sure they arrived (a marker behind them on the same
// endpoint); then both hosts run the prepared phase with every step, and
// generation 3 is exactly the resharded state.
TEST_F(PrepareTest, AMessageUnderThePreparesTagsIsNotTakenByThePreparedPhase) {
  v1::HostTask prepare = Task(kOp, 1, 3);
  prepare.set_prepare(true);
  for (const auto& r : RunHosts(prepare)) ASSERT_TRUE(r.ok()) << r.status();
  v1::HostTask prepared = prepare;
  prepared.set_prepare(false);
  prepared.set_prepared(true);
  ASSERT_NE(TaskTagKey(prepare), TaskTagKey(prepared));

  const auto old_slots = planner::ExpandPlacement(from_.placement());
  const auto new_slots = planner::ExpandPlacement(to_.placement());
  const v1::CopyStep* step = nullptr;
  for (const v1::CopyStep& s : prepare.plan().steps()) {
    if (old_slots[s.src_rank()].host() == "h0" && new_slots[s.dsts(0).rank()].host() == "h1") {
      step = &s;
      break;
    }
  }
  ASSERT_NE(step, nullptr);
  const StepChunks chunks(std::vector<int64_t>(step->shape().begin(), step->shape().end()),
                          prepare.plan().items(step->item()).element_bytes(),
                          TaskExecutor::Options().chunk_bytes);
  const uint64_t stray_tag = TransferTag(TaskTagKey(prepare), step->index(), 0).value();
  // A tag of neither phase (another operation key), received by the test.
  const uint64_t marker_tag = TransferTag(TaskTagKey(prepare) ^ 0x5a5a, 7, 7).value();
  ASSERT_TRUE(hosts_[0].transport->Connect("h1", hosts_[1].transport->LocalAddress()).ok());
  // Shared with the callbacks, which may outlive a failed assertion.
  struct Messages {
    std::vector<uint8_t> stray;
    uint64_t marker = 42, marker_in = 0;
    std::promise<absl::Status> stray_sent, marker_received;
  };
  auto m = std::make_shared<Messages>();
  m->stray.assign(static_cast<size_t>(chunks.Bytes(0)), 0xee);
  auto stray_sent = m->stray_sent.get_future();
  auto marker_received = m->marker_received.get_future();
  hosts_[1].transport->Receive(marker_tag, &m->marker_in, sizeof(m->marker_in),
                               [m](absl::Status s) { m->marker_received.set_value(s); });
  hosts_[0].transport->Send("h1", stray_tag, m->stray.data(), m->stray.size(),
                            [m](absl::Status s) { m->stray_sent.set_value(s); });
  hosts_[0].transport->Send("h1", marker_tag, &m->marker, sizeof(m->marker), [m](absl::Status) {});
  ASSERT_EQ(marker_received.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  ASSERT_TRUE(marker_received.get().ok());
  ASSERT_EQ(m->marker_in, 42u);

  const Results done = RunHosts(prepared);
  for (size_t i = 0; i < hosts_.size(); ++i) {
    ASSERT_TRUE(done[i].ok()) << hosts_[i].id << ": " << done[i].status();
  }
  for (int r = 0; r < NewWorld(); ++r) {
    auto got = HostOfNew(r).store->Get({kJob, 3, r});
    ASSERT_TRUE(got.ok()) << got.status();
    VectorBuffer want((*got)->items(), (*got)->size());
    RenderRank(ptc_, to_, r, 6, &want);
    EXPECT_EQ(0, std::memcmp(want.data(), (*got)->data(), want.size())) << "rank " << r;
  }
  // The stray message was never matched: h1 drops it now, which completes
  // its send (at once if it went eagerly).
  hosts_[1].transport->CancelTags(stray_tag, ~uint64_t{0});
  ASSERT_EQ(stray_sent.wait_for(std::chrono::seconds(30)), std::future_status::ready);
}

// One byte of the pre-copy changes after the prepare (written through the
// buffer's file, as any process that can open it could), in the destination
// of a step received from the other host whose source did not change: the
// prepared phase skips that step, reads its region back, and refuses with
// DATA_LOSS naming job, generation, rank, item and step; its buffers are
// dropped, nothing of generation 3 is sealed there. (Before the check the
// phase sealed and reported the flipped byte.)
TEST_F(PrepareTest, AByteOfASkippedStepChangedAfterThePrepareIsDataLoss) {
  v1::HostTask prepare = Task(kOp, 1, 3);
  prepare.set_prepare(true);
  const Results prepared = RunHosts(prepare);
  for (const auto& r : prepared) ASSERT_TRUE(r.ok()) << r.status();
  WriteOldGeneration(2, {{0, 0}, {4, 2}});
  const v1::HostTask transfer = Pruned(prepare, prepared, 2);
  const auto old_slots = planner::ExpandPlacement(from_.placement());
  const auto new_slots = planner::ExpandPlacement(to_.placement());
  std::optional<v1::CopyStep> victim;
  for (const v1::CopyStep& s : skipped_) {
    if (s.bytes() > 0 && old_slots[s.src_rank()].host() != new_slots[s.dsts(0).rank()].host()) {
      victim = s;
      break;
    }
  }
  ASSERT_TRUE(victim.has_value());
  const int rank = victim->dsts(0).rank();
  const int item = victim->item();
  Host& h = HostOfNew(rank);
  auto buf = h.store->Get({kJob, 3, rank});
  ASSERT_TRUE(buf.ok()) << buf.status();
  const int64_t at = (*buf)->items()[item].offset +
                     victim->dsts(0).region().offset() * prepare.plan().items(item).element_bytes();
  {
    const int fd = ::open((*buf)->path().c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << (*buf)->path() << ": " << std::strerror(errno);
    uint8_t byte = 0;
    ASSERT_EQ(::pread(fd, &byte, 1, at), 1);
    byte ^= 0x01;
    ASSERT_EQ(::pwrite(fd, &byte, 1, at), 1);
    ::close(fd);
  }
  buf->reset();

  const Results done = RunHosts(transfer);
  const size_t i = static_cast<size_t>(&h - hosts_.data());
  ASSERT_EQ(done[i].status().code(), absl::StatusCode::kDataLoss) << done[i].status();
  EXPECT_THAT(std::string(done[i].status().message()),
              ::testing::AllOf(HasSubstr(absl::StrCat("job \"job-x\" generation 3 rank ", rank,
                                                      " item ", item, " (\"",
                                                      prepare.plan().items(item).name(), "\")")),
                               HasSubstr(absl::StrCat("step ", victim->index(), " (received")),
                               HasSubstr("changed after the prepare")));
  EXPECT_EQ(Buffers(h, 3, /*sealed=*/false) + Buffers(h, 3, /*sealed=*/true), 0);
}

// With the transfer secret the two phases also prove themselves and seal
// their steps under different keys, and the whole cycle still reshards.
TEST_F(PrepareTest, BothPhasesWithTheTransferSecret) {
  v1::HostTask prepare = Task(kOp, 1, 3);
  prepare.set_prepare(true);
  prepare.set_transfer_secret(std::string(32, 's'));
  const Results prepared = RunHosts(prepare);
  for (const auto& r : prepared) ASSERT_TRUE(r.ok()) << r.status();
  WriteOldGeneration(2, {{1, 3}, {5, 0}});
  const Results done = RunHosts(Pruned(prepare, prepared, 2));
  for (const auto& r : done) ASSERT_TRUE(r.ok()) << r.status();
  v1::HostTask plain = Task("op-plain", 2, 5);
  plain.set_transfer_secret(std::string(32, 't'));
  EXPECT_EQ(Sums(done), Sums(RunHosts(plain)));
  CompareGenerations(3, 5);
}

}  // namespace
}  // namespace reshard::agent
