// Items a rank buffer holds zeros of for its worker to regenerate
// (ShardStore::MarkRegenerated, TransferPlan.regenerate): recorded on the
// executor's unsealed buffers only, kept by sealing and by a reopened store
// (an agent restart).
#include <string>
#include <utility>
#include <vector>

#include "agent/shard_store/shard_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/shard_store/store_fixture.h"

namespace reshard::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class RegeneratedTest : public ShardStoreTest {
 protected:
  // Seals an agent-written buffer from its bytes, as the executor does.
  static absl::Status SealWritten(ShardStore& store, RankBuffer& b) {
    std::vector<uint64_t> sums;
    for (const ItemSlot& s : b.items()) {
      sums.push_back(Checksum(b.data() + s.offset, static_cast<size_t>(s.bytes)));
    }
    return store.SealWritten(b.key(), sums).status();
  }
};

TEST_F(RegeneratedTest, SealingAndAReopenedStoreKeepTheRecord) {
  {
    auto store = OpenStore();
    auto created = store->CreateAll({Key(0), Key(1)}, {{64, 16, 8}, {64, 16, 8}});
    ASSERT_TRUE(created.ok()) << created.status();
    ASSERT_TRUE(store->MarkRegenerated(Key(1), {2}).ok());
    ASSERT_TRUE(store->MarkRegenerated(Key(1), {1, 2}).ok());  // adds, once each
    EXPECT_THAT((*created)[1]->regenerated(), ElementsAre(1, 2));
    EXPECT_THAT((*created)[0]->regenerated(), IsEmpty());
    for (const RankBufferPtr& b : *created) ASSERT_TRUE(SealWritten(*store, *b).ok());
    absl::StatusOr<RankBufferPtr> sealed = store->Get(Key(1));
    ASSERT_TRUE(sealed.ok()) << sealed.status();
    EXPECT_TRUE((*sealed)->sealed());
    EXPECT_THAT((*sealed)->regenerated(), ElementsAre(1, 2));
  }
  // The agent restarts: the sidecar brings the record back.
  auto store = OpenStore();
  absl::StatusOr<RankBufferPtr> b1 = store->Get(Key(1));
  ASSERT_TRUE(b1.ok()) << b1.status();
  EXPECT_TRUE((*b1)->sealed());
  EXPECT_THAT((*b1)->regenerated(), ElementsAre(1, 2));
  absl::StatusOr<RankBufferPtr> b0 = store->Get(Key(0));
  ASSERT_TRUE(b0.ok()) << b0.status();
  EXPECT_THAT((*b0)->regenerated(), IsEmpty());
}

TEST_F(RegeneratedTest, OnlyTheExecutorsUnsealedBuffersTakeARecord) {
  auto store = OpenStore();
  auto mine = store->CreateAll({Key(0), Key(1)}, {{64, 8}, {64, 8}});
  ASSERT_TRUE(mine.ok()) << mine.status();
  auto published = store->CreateAll({Key(2)}, {{64, 8}}, ShardStore::Backing::kPrefaulted,
                                    ShardStore::Writer::kWorker);
  ASSERT_TRUE(published.ok()) << published.status();
  ASSERT_TRUE(SealWritten(*store, *(*mine)[1]).ok());

  absl::Status s = store->MarkRegenerated(Key(2), {1});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("written by a worker"));
  s = store->MarkRegenerated(Key(1), {1});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("sealed"));
  s = store->MarkRegenerated(Key(0), {2});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("item 2"));
  EXPECT_EQ(store->MarkRegenerated(Key(0), {-1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->MarkRegenerated(Key(7), {0}).code(), absl::StatusCode::kNotFound);
  // Nothing to record is no call at all, whatever the buffer.
  EXPECT_TRUE(store->MarkRegenerated(Key(1), {}).ok());
  EXPECT_THAT((*mine)[0]->regenerated(), IsEmpty());
  EXPECT_THAT((*published)[0]->regenerated(), IsEmpty());
}

// The executor's hook: a plan's entries of this host's ranks, no others.
TEST_F(RegeneratedTest, PlanEntriesGoToTheirRanksBuffers) {
  auto store = OpenStore();
  ASSERT_TRUE(store->CreateAll({Key(2, 3), Key(3, 3)}, {{8, 8, 8}, {8, 8, 8}}).ok());
  google::protobuf::RepeatedPtrField<v1::Regenerate> plan;
  for (auto [rank, item] :
       std::vector<std::pair<int, int>>{{0, 2}, {2, 2}, {3, 1}, {3, 2}, {5, 0}}) {
    v1::Regenerate* g = plan.Add();
    g->set_rank(rank);
    g->set_item(item);
  }
  ASSERT_TRUE(MarkRegenerated(*store, {Key(2, 3), Key(3, 3)}, plan).ok());
  EXPECT_THAT((*store->Get(Key(2, 3)))->regenerated(), ElementsAre(2));
  EXPECT_THAT((*store->Get(Key(3, 3)))->regenerated(), ElementsAre(1, 2));

  v1::Regenerate* bad = plan.Add();
  bad->set_rank(2);
  bad->set_item(3);
  absl::Status s = MarkRegenerated(*store, {Key(2, 3)}, plan);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("rank 2"));
}

}  // namespace
}  // namespace reshard::agent
