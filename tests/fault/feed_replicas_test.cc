// A watcher of a job whose coordinator replica is killed (issue 21, item 6;
// docs/coordinator.md, "Change feed"): two replicas on one database; a
// change committed through one reaches a watcher of the other; the first is
// SIGKILLed with a stream open, a change commits while its watcher is away,
// and the watcher, resuming on the other replica from the last version it
// saw, gets that change and nothing it had seen.
#include "tests/coordinator/server/job_watch.h"
#include "tests/coordinator/server/server_fixture.h"
#include "tests/coordinator/server/test_jobs.h"

namespace reshard::coordinator::testing {
namespace {

class FeedReplicasTest : public ServerTest {};

TEST_F(FeedReplicasTest, AWatcherResumesOnAnotherReplicaAndMissesNothing) {
  std::unique_ptr<CoordinatorProcess> a = StartCoordinator();
  ASSERT_NE(a, nullptr);
  std::unique_ptr<CoordinatorProcess> b = StartCoordinator();
  ASSERT_NE(b, nullptr);
  auto via_a = CoordinatorClient(a->address());
  auto via_b = CoordinatorClient(b->address());
  const v1::Job job = Register(via_a.get(), test_support::GptJobSpec("replicas", "team-a"));

  auto on_a = std::make_unique<JobWatch>(via_a.get(), job.id());
  JobWatch on_b(via_b.get(), job.id());
  std::optional<v1::Job> seen_a = on_a->Next();
  ASSERT_TRUE(seen_a.has_value());
  ASSERT_TRUE(on_b.Next().has_value());

  // Committed through A, seen by B's watcher.
  ReportRank(via_a.get(), job.id(), 1);
  std::optional<v1::Job> cross = on_b.Next();
  ASSERT_TRUE(cross.has_value());
  EXPECT_EQ(cross->failed_ranks_size(), 1);
  seen_a = on_a->Next();
  ASSERT_TRUE(seen_a.has_value());
  EXPECT_EQ(seen_a->version(), cross->version());

  // A dies; while its watcher is away, a change commits through B.
  a->Kill();
  on_a.reset();
  ReportRank(via_b.get(), job.id(), 2);
  JobWatch resumed(via_b.get(), job.id(), seen_a->version());
  std::optional<v1::Job> missed = resumed.Next();
  ASSERT_TRUE(missed.has_value());
  EXPECT_EQ(missed->failed_ranks_size(), 2);
  EXPECT_GT(missed->version(), seen_a->version());

  // From the newest version: the first message is the next change, not the
  // state already seen.
  JobWatch caught_up(via_b.get(), job.id(), missed->version());
  ReportRank(via_b.get(), job.id(), 4);
  std::optional<v1::Job> next = caught_up.Next();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->failed_ranks_size(), 3);
  EXPECT_GT(next->version(), missed->version());
}

}  // namespace
}  // namespace reshard::coordinator::testing
