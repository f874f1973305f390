// The shard store's hooks the worker service relies on (issue 19): a worker
// may seal only a buffer made for it (SealForWorker), and every drop tells
// the listener which (job, generation) went and whether the job still has a
// buffer here.
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "agent/shard_store/shard_store.h"
#include "gtest/gtest.h"
#include "tests/agent/shard_store/store_fixture.h"

namespace reshard::agent {
namespace {

class StoreHooksTest : public ShardStoreTest {};

// A buffer the agent made (an operation's destination, written by the
// executor) cannot be sealed for a worker, before or after the agent sealed
// it; the refusal leaves it unsealed and the agent's mapping writable.
TEST_F(StoreHooksTest, SealForWorkerRefusesABufferTheAgentWrites) {
  auto store = OpenStore();
  auto created = store->CreateAll({Key(3, 2)}, {{100, 28}}, ShardStore::Backing::kPrefaulted,
                                  ShardStore::Writer::kAgent);
  ASSERT_TRUE(created.ok()) << created.status();
  RankBufferPtr b = (*created)[0];
  absl::StatusOr<std::vector<uint64_t>> sealed = store->SealForWorker(Key(3, 2), {});
  EXPECT_EQ(sealed.status().code(), absl::StatusCode::kFailedPrecondition) << sealed.status();
  const std::string message(sealed.status().message());
  EXPECT_TRUE(absl::StrContains(message, "job \"job-1\" generation 2 rank 3")) << message;
  EXPECT_FALSE(b->sealed());
  Fill(*b, 0, 5);  // still the agent's to write (a read-only mapping would SIGSEGV)
  Fill(*b, 1, 6);
  std::vector<uint64_t> sums = {Checksum(b->item_data(0), 100), Checksum(b->item_data(1), 28)};
  ASSERT_TRUE(store->SealWritten(Key(3, 2), sums).ok());
  EXPECT_EQ(store->SealForWorker(Key(3, 2), {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->SealForWorker(Key(9, 2), {}).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(StoreHooksTest, SealForWorkerSealsABufferMadeForAWorker) {
  auto store = OpenStore();
  auto created = store->CreateAll({Key(0)}, {{64}}, ShardStore::Backing::kPrefaulted,
                                  ShardStore::Writer::kWorker);
  ASSERT_TRUE(created.ok()) << created.status();
  absl::StatusOr<std::vector<uint64_t>> sealed = store->SealForWorker(Key(0), {});
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  EXPECT_TRUE((*created)[0]->sealed());
  // Sealing it again answers its checksums, as Seal does.
  absl::StatusOr<std::vector<uint64_t>> again = store->SealForWorker(Key(0), {});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *sealed);
}

TEST_F(StoreHooksTest, EveryDropTellsTheListenerWhetherTheJobIsStillHeld) {
  auto store = OpenStore();
  std::vector<std::tuple<std::string, int64_t, bool>> calls;
  store->SetDropListener([&](const std::string& job, int64_t generation, bool held) {
    calls.emplace_back(job, generation, held);
  });
  ASSERT_TRUE(
      store->CreateAll({Key(0, 1), Key(1, 1), Key(0, 2), Key(0, 1, "job-10")}, {{8}, {8}, {8}, {8}})
          .ok());
  store->DropGeneration("job-1", 1);  // released: generation 2 stays
  store->Drop(Key(0, 2));             // the job's last buffer (deleted)
  store->Drop(Key(0, 2));             // idempotent, still told
  store->DropGeneration("job-10", 1);
  using Call = std::tuple<std::string, int64_t, bool>;
  EXPECT_EQ(calls, (std::vector<Call>{Call{"job-1", 1, true}, Call{"job-1", 2, false},
                                      Call{"job-1", 2, false}, Call{"job-10", 1, false}}));
  store->SetDropListener(nullptr);
  store->DropGeneration("job-1", 7);
  EXPECT_EQ(calls.size(), 4u);
}

}  // namespace
}  // namespace reshard::agent
