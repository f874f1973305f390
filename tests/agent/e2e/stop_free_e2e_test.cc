// End to end, a stop-free resize with agents that prepare (docs/coordinator.md,
// "Agents prepare"; docs/agent.md, "Two phases"): PostgreSQL, the real
// reshard-coordinator and four real reshard-agent processes. The test plays
// the training workers: it publishes generation 1, asks for a stop-free
// resize, waits for the agents' pre-copy (PREPARED on every host), marks the
// new workers warm, then cuts over with a checkpoint of a later step in
// which some tensors changed and the others did not. The committed
// generation must be that checkpoint's state resharded, byte for byte, and
// the bytes not moved again must be exactly those of the unchanged shards.
// A byte of the pre-copy that changes after the prepare is not committed.
// An operation cancelled after its prepare leaves no buffer of its pending
// generation on any agent.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/shard_store/shard_store.h"
#include "planner/planner.h"
#include "tests/agent/e2e/e2e_fixture.h"

namespace reshard::agent::testing {
namespace {

constexpr int64_t kBatch = 8;

class StopFreeE2eTest : public AgentE2eTest {
 protected:
  // Registers `spec` with a dataset (a cut-over checkpoint carries a step)
  // and publishes generation 1.
  void RegisterWithData(const v1::JobSpec& spec) {
    const v1::DatasetState d = TokensDataset(kBatch);
    v1::Job job;
    ASSERT_NO_FATAL_FAILURE(RegisterAndPublish(spec, &d, &job));
    fingerprint_ = job.dataset_state().layout_fingerprint();
    layout_ = spec.layout();
  }

  // Waits for every agent's PREPARED report, then marks the workers warm.
  v1::Operation Prepare(const v1::Operation& started) {
    v1::Operation op = WaitUntil(
        started.id(), [](const v1::Operation& o) { return o.agents_prepared_unix_ms() > 0; });
    EXPECT_GT(op.agents_prepared_unix_ms(), 0)
        << v1::OperationState_Name(op.state()) << " " << op.error();
    v1::MarkPreparedRequest req;
    req.set_operation_id(started.id());
    grpc::ClientContext ctx;
    grpc::Status s = stub_->MarkPrepared(&ctx, req, &op);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return WaitUntil(started.id(), [](const v1::Operation& o) { return o.prepared_unix_ms() > 0; });
  }

  // The old layout's checkpoint of `step`, cutting over `operation_id`.
  v1::Operation CutOver(const std::string& operation_id, int64_t step) {
    v1::CheckpointRequest req;
    req.set_job_id(job_id_);
    req.set_expected_generation(generation_);
    req.set_with_step(true);
    req.set_step(step);
    req.set_cursor(step * kBatch);
    req.set_layout_fingerprint(fingerprint_);
    req.set_cut_over_operation_id(operation_id);
    return Checkpoint(req);
  }

  // Rank buffer files of `generation` of the job in `host`'s shm dir.
  int Files(const std::string& host, int64_t generation) {
    const std::string prefix = absl::StrCat("reshard-", host, "-", job_id_, "-g", generation, "-r");
    int n = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_ + "/shm-" + host, ec)) {
      const std::string name = e.path().filename().string();
      n += absl::StartsWith(name, prefix) && !absl::EndsWith(name, ".meta");
    }
    return n;
  }
  int FilesEverywhere(int64_t generation) {
    int n = 0;
    for (const char* h : {"h0", "h1", "h2", "h3"}) n += Files(h, generation);
    return n;
  }

  v1::Layout layout_;
  std::string fingerprint_;
};

TEST_F(StopFreeE2eTest, PreCopyThenOnlyTheChangedShardsMoveAtTheCutOver) {
  ASSERT_NO_FATAL_FAILURE(RegisterWithData(test_support::GptJobSpec("gpt", "e2e", {"h0", "h1"})));
  // tp 2 -> 4 onto h0 and h2: local copies on h0, h1 and h0 send to h2.
  const v1::Layout target = MakeLayout(4, 2, 1, {"h0", "h2"}, 4);
  const v1::Operation started = StartResize(target, /*stop_free=*/true);
  ASSERT_FALSE(started.id().empty());
  EXPECT_EQ(started.to_generation(), 3);  // 2 is the cut-over checkpoint's

  const v1::Operation prepared = Prepare(started);
  ASSERT_GT(prepared.prepared_unix_ms(), 0) << prepared.error();
  ASSERT_EQ(prepared.state(), v1::OPERATION_STATE_PLANNED);
  EXPECT_EQ(prepared.prepared_from_generation(), 1);
  EXPECT_GT(prepared.bytes_precopied(), 0);
  // The pre-copy sits in the new hosts' buffers of generation 3, unsealed.
  EXPECT_EQ(Files("h0", 3), 4);
  EXPECT_EQ(Files("h2", 3), 4);

  // Step 1 of the old layout: every tensor of even index changed, the
  // others and the blobs kept their bytes.
  auto step1 = EvenTensorsChanged();
  ASSERT_TRUE(step1.ok()) << step1.status();
  std::set<int> changed;
  for (int i = 0; i < ptc_.tensors_size(); i += 2) changed.insert(i);
  const v1::Operation checkpoint = CutOver(started.id(), 1);
  ASSERT_FALSE(checkpoint.id().empty());
  ASSERT_EQ(checkpoint.to_generation(), 2);
  absl::Status published = PublishCheckpoint(2, *step1);
  ASSERT_TRUE(published.ok()) << published;

  const v1::Operation op = WaitFinal(started.id());
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_COMMITTED) << op.error();
  EXPECT_EQ(op.from_generation(), 2);
  EXPECT_EQ(op.to_generation(), 3);
  // The checkpoint's state, resharded, byte for byte.
  auto want = Reshard(ptc_, *step1, target, {});
  ASSERT_TRUE(want.ok()) << want.status();
  absl::Status v = Verify(sockets_, job_id_, 3, *want);
  EXPECT_TRUE(v.ok()) << v;

  // Not moved again: the steps of the unchanged items, and the zero fills.
  auto plan = planner::PlanTransfer(ptc_, layout_, target, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  int64_t unchanged = 0, moved = 0;
  for (const v1::CopyStep& s : plan->steps()) {
    (changed.count(s.item()) ? moved : unchanged) += s.bytes() * s.dsts_size();
  }
  for (const v1::ZeroFill& f : plan->zero_fills()) {
    unchanged += f.count() * plan->items(f.item()).element_bytes();
  }
  ASSERT_GT(unchanged, 0);
  ASSERT_GT(moved, 0);
  EXPECT_EQ(op.bytes_skipped_unchanged(), unchanged);
  EXPECT_EQ(op.bytes_total(), moved);
}

// One byte of the pre-copy flipped after the agents reported PREPARED (in
// h2's pending buffer file, in a tensor the cut-over checkpoint did not
// change, so every step writing it is skipped): the cut-over must not commit
// it. h2's transfer phase reads back what its prepare wrote and fails with
// DATA_LOSS naming job, generation, rank and item; the operation aborts with
// that error, and the job stays on the checkpoint's generation, intact.
// (Before the check the operation COMMITTED generation 3 with the byte.)
TEST_F(StopFreeE2eTest, APreCopyChangedAfterThePrepareIsNotCommitted) {
  ASSERT_NO_FATAL_FAILURE(RegisterWithData(test_support::GptJobSpec("gpt", "e2e", {"h0", "h1"})));
  const v1::Layout target = MakeLayout(4, 2, 1, {"h0", "h2"}, 4);
  const v1::Operation started = StartResize(target, /*stop_free=*/true);
  ASSERT_FALSE(started.id().empty());
  const v1::Operation prepared = Prepare(started);
  ASSERT_GT(prepared.prepared_unix_ms(), 0) << prepared.error();
  ASSERT_EQ(prepared.state(), v1::OPERATION_STATE_PLANNED);

  // The first byte of the first odd (unchanged) tensor a rank on h2 holds.
  const std::vector<std::string> hosts = RankHosts(target);
  int rank = -1, item = -1;
  int64_t at = 0;
  for (int r = 0; r < static_cast<int>(hosts.size()) && rank < 0; ++r) {
    if (hosts[r] != "h2") continue;
    const std::vector<ItemSlot> slots = LayoutItems(RankItemBytes(ptc_, target, r), nullptr);
    for (int i = 1; i < ptc_.tensors_size(); i += 2) {
      if (slots[i].bytes == 0) continue;
      rank = r, item = i, at = slots[i].offset;
      break;
    }
  }
  ASSERT_GE(rank, 0);
  const std::string path =
      absl::StrCat(dir_, "/shm-h2/", RankBufferFileName("h2", RankBufferKey{job_id_, 3, rank}));
  {
    const int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
    uint8_t byte = 0;
    ASSERT_EQ(::pread(fd, &byte, 1, at), 1);
    byte ^= 0x01;
    ASSERT_EQ(::pwrite(fd, &byte, 1, at), 1);
    ::close(fd);
  }

  // The cut-over checkpoint: the even tensors changed, the odd ones did not.
  auto step1 = EvenTensorsChanged();
  ASSERT_TRUE(step1.ok()) << step1.status();
  const v1::Operation checkpoint = CutOver(started.id(), 1);
  ASSERT_EQ(checkpoint.to_generation(), 2);
  absl::Status published = PublishCheckpoint(2, *step1);
  ASSERT_TRUE(published.ok()) << published;

  const v1::Operation op = WaitFinal(started.id());
  ASSERT_EQ(op.state(), v1::OPERATION_STATE_ABORTED)
      << v1::OperationState_Name(op.state()) << " " << op.error();
  const std::string names = absl::StrCat("job \"", job_id_, "\" generation 3 rank ", rank, " item ",
                                         item, " (\"", ptc_.tensors(item).name(), "\")");
  EXPECT_THAT(op.error(), ::testing::AllOf(::testing::HasSubstr("host \"h2\": DATA_LOSS"),
                                           ::testing::HasSubstr(names),
                                           ::testing::HasSubstr("changed after the prepare")));
  // The job goes on from the checkpoint, byte for byte.
  const v1::Job job = GetJob();
  EXPECT_EQ(job.generation(), 2);
  EXPECT_EQ(job.state(), v1::JOB_STATE_ACTIVE);
  absl::Status v = Verify(sockets_, job_id_, 2, *step1);
  EXPECT_TRUE(v.ok()) << v;
}

TEST_F(StopFreeE2eTest, CancelledAfterItsPrepareLeavesNoBufferOfThePendingGeneration) {
  ASSERT_NO_FATAL_FAILURE(RegisterWithData(test_support::GptJobSpec("gpt", "e2e", {"h0", "h1"})));
  const v1::Layout target = MakeLayout(2, 2, 2, {"h2", "h3"}, 4);
  const v1::Operation started = StartResize(target, /*stop_free=*/true);
  ASSERT_FALSE(started.id().empty());
  const v1::Operation prepared = WaitUntil(
      started.id(), [](const v1::Operation& o) { return o.agents_prepared_unix_ms() > 0; });
  ASSERT_GT(prepared.agents_prepared_unix_ms(), 0) << prepared.error();
  const int64_t pending = started.to_generation();
  ASSERT_EQ(Files("h2", pending) + Files("h3", pending), 8);

  v1::CancelOperationRequest req;
  req.set_operation_id(started.id());
  v1::Operation cancelled;
  grpc::ClientContext ctx;
  grpc::Status s = stub_->CancelOperation(&ctx, req, &cancelled);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(WaitFinal(started.id()).state(), v1::OPERATION_STATE_ABORTED);
  // The agents learn of the discard on a heartbeat (a third of the lease).
  test_support::Eventually([&] { return FilesEverywhere(pending) == 0; });
  EXPECT_EQ(FilesEverywhere(pending), 0);
  // The old layout is intact and current.
  absl::Status v = Verify(sockets_, job_id_, 1, contents_);
  EXPECT_TRUE(v.ok()) << v;
  const v1::Job job = GetJob();
  EXPECT_EQ(job.generation(), 1);
  EXPECT_EQ(job.state(), v1::JOB_STATE_ACTIVE);
}

}  // namespace
}  // namespace reshard::agent::testing
