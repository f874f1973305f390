// The change feed (logic/change_feed.h; docs/coordinator.md, "Change feed")
// against the real PostgreSQL: the triggers of migrations/0016 announce
// every committed change, one LISTEN connection hands them to the feed, and
// one read serves every watcher of a key. Also: a resume from a version, a
// lost notification caught by the safety poll, a listener whose connection
// is killed, a deleted job, an operation followed to its final state.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/harness/eventually.h"
#include "tests/coordinator/logic/feed_fixture.h"
#include "tests/coordinator/logic/logic_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::MakeLayout;
using test_support::TwoLayerJob;

class ChangeFeedTest : public LogicTest {
 protected:
  void TearDown() override {
    feed_.Stop();
    LogicTest::TearDown();
  }
  void StartFeed(bool listen = true) { feed_.Start(dsn_, store_, listen); }

  /// A change that GetJob shows: the job's state.
  void ChangeJob(const std::string& job_id, v1::JobState state) {
    ASSERT_TRUE(store_->SetJobState(job_id, state).ok());
  }

  TestFeed feed_;
};

// Versions are per key (migration 0020): each change of a job or an
// operation advances its own version by one.
TEST_F(ChangeFeedTest, EveryChangeTakesTheKeysNextVersion) {
  const v1::Job job = Register(TwoLayerJob("versions"));
  EXPECT_GT(job.version(), 0);
  ChangeJob(job.id(), v1::JOB_STATE_DEGRADED);
  const v1::Job degraded = Job(job.id());
  EXPECT_EQ(degraded.version(), job.version() + 1);
  // An operation has versions of its own, and creating it changes its job
  // (active_operation_id) and so the job's version.
  absl::StatusOr<v1::Operation> op = ResizeTo(degraded, MakeLayout(2, 2, 1, {"h2", "h3"}, 2));
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(op->version(), 1);
  EXPECT_EQ(op->phase(), "PENDING");  // the state machine's name (operation_machine.h)
  const v1::Job reconfiguring = Job(job.id());
  EXPECT_EQ(reconfiguring.active_operation_id(), op->id());
  EXPECT_EQ(reconfiguring.version(), degraded.version() + 1);
  // Cancelling it changes both again.
  v1::CancelOperationRequest cancel;
  cancel.set_operation_id(op->id());
  ASSERT_TRUE(api_->CancelOperation(cancel).ok());
  EXPECT_GT(Op(op->id()).version(), op->version());
  EXPECT_EQ(Op(op->id()).phase(), "ABORTED");
  EXPECT_GT(Job(job.id()).version(), reconfiguring.version());
  EXPECT_EQ(Job(job.id()).active_operation_id(), "");
}

TEST_F(ChangeFeedTest, OneReadServesEveryWatcherAndNothingIsReadWithoutAChange) {
  const v1::Job job = Register(TwoLayerJob("many"));
  ASSERT_NO_FATAL_FAILURE(StartFeed());  // after the registration's notification
  constexpr int kWatchers = 50;
  std::vector<std::unique_ptr<Recorder<v1::Job>>> watchers;
  for (int i = 0; i < kWatchers; ++i) {
    watchers.push_back(std::make_unique<Recorder<v1::Job>>());
    feed_.feed->jobs().Subscribe(job.id(), 0, watchers.back().get());
  }
  auto all_saw = [&](int64_t version) {
    return std::all_of(watchers.begin(), watchers.end(),
                       [&](const auto& w) { return w->last().version() == version; });
  };
  ASSERT_TRUE(Eventually([&] { return all_saw(job.version()); }));
  EXPECT_EQ(feed_.feed->jobs().reads(), 1);
  EXPECT_EQ(feed_.feed->jobs().subscribers(), kWatchers);
  // The safety poll finds nothing moved: no read.
  ASSERT_TRUE(feed_.feed->Resync().ok());
  EXPECT_EQ(feed_.feed->jobs().reads(), 1);

  // One committed change: one more read, every watcher handed the new state.
  ChangeJob(job.id(), v1::JOB_STATE_DEGRADED);
  const v1::Job degraded = Job(job.id());
  ASSERT_TRUE(Eventually([&] { return all_saw(degraded.version()); }));
  EXPECT_EQ(feed_.feed->jobs().reads(), 2);
  for (const auto& w : watchers) {
    ASSERT_EQ(w->count(), 2u);
    EXPECT_EQ(w->states()[1].state(), v1::JOB_STATE_DEGRADED);
  }
  for (const auto& w : watchers) feed_.feed->jobs().Unsubscribe(job.id(), w.get());
  EXPECT_EQ(feed_.feed->jobs().subscribers(), 0);
  EXPECT_TRUE(feed_.feed->jobs().Watched().empty());
}

TEST_F(ChangeFeedTest, AResumeFromAVersionGetsOnlyWhatIsNewer) {
  const v1::Job job = Register(TwoLayerJob("resume"));
  ASSERT_NO_FATAL_FAILURE(StartFeed());
  // Saw the registration already: nothing until the next change.
  Recorder<v1::Job> current;
  feed_.feed->jobs().Subscribe(job.id(), job.version(), &current);
  // Saw nothing: the state at once.
  Recorder<v1::Job> fresh;
  feed_.feed->jobs().Subscribe(job.id(), 0, &fresh);
  ASSERT_TRUE(Eventually([&] { return fresh.count() == 1; }));
  EXPECT_EQ(fresh.last().version(), job.version());
  EXPECT_EQ(current.count(), 0u);

  ChangeJob(job.id(), v1::JOB_STATE_DEGRADED);
  ASSERT_TRUE(Eventually([&] { return current.count() == 1; }));
  EXPECT_EQ(current.last().state(), v1::JOB_STATE_DEGRADED);
  EXPECT_GT(current.last().version(), job.version());
  feed_.feed->jobs().Unsubscribe(job.id(), &current);
  feed_.feed->jobs().Unsubscribe(job.id(), &fresh);
}

TEST_F(ChangeFeedTest, ALostNotificationIsCaughtByTheSafetyPoll) {
  const v1::Job job = Register(TwoLayerJob("lost"));
  ASSERT_NO_FATAL_FAILURE(StartFeed(/*listen=*/false));  // every notification lost
  Recorder<v1::Job> watcher;
  feed_.feed->jobs().Subscribe(job.id(), 0, &watcher);
  ASSERT_TRUE(Eventually([&] { return watcher.count() == 1; }));
  ChangeJob(job.id(), v1::JOB_STATE_DEGRADED);
  ASSERT_TRUE(feed_.feed->Resync().ok());
  ASSERT_TRUE(Eventually([&] { return watcher.count() == 2; }));
  EXPECT_EQ(watcher.last().state(), v1::JOB_STATE_DEGRADED);
  EXPECT_EQ(feed_.feed->jobs().reads(), 2);
  feed_.feed->jobs().Unsubscribe(job.id(), &watcher);
}

TEST_F(ChangeFeedTest, TheListenerReconnectsAndWhatChangedMeanwhileIsReRead) {
  const v1::Job job = Register(TwoLayerJob("reconnect"));
  ASSERT_NO_FATAL_FAILURE(StartFeed());
  Recorder<v1::Job> watcher;
  feed_.feed->jobs().Subscribe(job.id(), 0, &watcher);
  ASSERT_TRUE(Eventually([&] { return watcher.count() == 1; }));
  ASSERT_EQ(TerminateListeners(dsn_), 1u);
  // While the listener is away a change commits; the reconnect re-reads.
  ChangeJob(job.id(), v1::JOB_STATE_DEGRADED);
  ASSERT_TRUE(Eventually([&] { return feed_.listener->connections() == 2; }));
  ASSERT_TRUE(Eventually([&] { return watcher.last().state() == v1::JOB_STATE_DEGRADED; }));
  // And later changes arrive through the new connection.
  ChangeJob(job.id(), v1::JOB_STATE_ACTIVE);
  ASSERT_TRUE(Eventually([&] { return watcher.last().state() == v1::JOB_STATE_ACTIVE; }));
  feed_.feed->jobs().Unsubscribe(job.id(), &watcher);
}

TEST_F(ChangeFeedTest, ADeletedJobEndsItsWatchesWithNotFound) {
  const v1::Job job = Register(TwoLayerJob("deleted"));
  ASSERT_NO_FATAL_FAILURE(StartFeed());
  Recorder<v1::Job> watcher;
  feed_.feed->jobs().Subscribe(job.id(), 0, &watcher);
  ASSERT_TRUE(Eventually([&] { return watcher.count() == 1; }));
  v1::DeleteJobRequest remove;
  remove.set_job_id(job.id());
  ASSERT_TRUE(api_->DeleteJob(remove).ok());
  ASSERT_TRUE(Eventually([&] { return watcher.ended(); }));
  EXPECT_EQ(watcher.end().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(watcher.end().message()), ::testing::HasSubstr(job.id()));
  EXPECT_EQ(feed_.feed->jobs().subscribers(), 0);
  // A watch of a job that never existed ends the same way.
  Recorder<v1::Job> nobody;
  feed_.feed->jobs().Subscribe("no-such-job", 0, &nobody);
  ASSERT_TRUE(Eventually([&] { return nobody.ended(); }));
  EXPECT_EQ(nobody.end().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(nobody.count(), 0u);
}

TEST_F(ChangeFeedTest, AnOperationIsFollowedToItsFinalState) {
  const v1::Job job = Register(TwoLayerJob("op"));
  absl::StatusOr<v1::Operation> op = ResizeTo(job, MakeLayout(2, 2, 1, {"h2", "h3"}, 2));
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_NO_FATAL_FAILURE(StartFeed());
  Recorder<v1::Operation> watcher;
  Recorder<v1::Job> job_watcher;
  feed_.feed->operations().Subscribe(op->id(), 0, &watcher);
  feed_.feed->jobs().Subscribe(job.id(), 0, &job_watcher);
  ASSERT_TRUE(Eventually([&] { return watcher.count() == 1 && job_watcher.count() == 1; }));
  EXPECT_EQ(watcher.last().state(), v1::OPERATION_STATE_PENDING);
  EXPECT_EQ(job_watcher.last().active_operation_id(), op->id());
  v1::CancelOperationRequest cancel;
  cancel.set_operation_id(op->id());
  ASSERT_TRUE(api_->CancelOperation(cancel).ok());
  ASSERT_TRUE(Eventually([&] { return watcher.last().state() == v1::OPERATION_STATE_ABORTED; }));
  // The job shows it too: no active operation any more.
  ASSERT_TRUE(Eventually([&] { return job_watcher.last().active_operation_id().empty(); }));
  std::vector<v1::Operation> seen = watcher.states();
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GT(seen[i].version(), seen[i - 1].version());
  feed_.feed->operations().Unsubscribe(op->id(), &watcher);
  feed_.feed->jobs().Unsubscribe(job.id(), &job_watcher);
}

// What wakes the leader's driver for a new operation (created through any
// replica): its announcement, once, and none for its later changes.
TEST_F(ChangeFeedTest, ANewOperationIsAnnouncedAsNewOnce) {
  const v1::Job job = Register(TwoLayerJob("created"));
  ASSERT_NO_FATAL_FAILURE(StartFeed());
  Recorder<v1::Job> job_watcher;
  feed_.feed->jobs().Subscribe(job.id(), 0, &job_watcher);
  ASSERT_TRUE(Eventually([&] { return job_watcher.count() == 1; }));
  absl::StatusOr<v1::Operation> op = ResizeTo(job, MakeLayout(2, 2, 1, {"h2", "h3"}, 2));
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_TRUE(Eventually([&] { return !feed_.Created().empty(); }));
  // The cancel's transaction announces the operation ('o:') and then its
  // job ('j:'): once the job's watcher sees the cancel, the listener has
  // handled every announcement of that transaction.
  v1::CancelOperationRequest cancel;
  cancel.set_operation_id(op->id());
  ASSERT_TRUE(api_->CancelOperation(cancel).ok());
  ASSERT_TRUE(Eventually([&] {
    return job_watcher.count() >= 2 && job_watcher.last().active_operation_id().empty();
  }));
  EXPECT_EQ(feed_.Created(), std::vector<std::string>{op->id()});
  feed_.feed->jobs().Unsubscribe(job.id(), &job_watcher);
}

TEST_F(ChangeFeedTest, ShutdownEndsEveryWatchAndRefusesNewOnes) {
  const v1::Job job = Register(TwoLayerJob("shutdown"));
  ASSERT_NO_FATAL_FAILURE(StartFeed());
  Recorder<v1::Job> watcher;
  feed_.feed->jobs().Subscribe(job.id(), 0, &watcher);
  ASSERT_TRUE(Eventually([&] { return watcher.count() == 1; }));
  feed_.listener->Stop();
  feed_.feed->Shutdown();
  EXPECT_TRUE(watcher.ended());
  EXPECT_EQ(watcher.end().code(), absl::StatusCode::kUnavailable);
  Recorder<v1::Job> late;
  feed_.feed->jobs().Subscribe(job.id(), 0, &late);
  EXPECT_TRUE(late.ended());
  EXPECT_EQ(late.end().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace reshard::coordinator::testing
