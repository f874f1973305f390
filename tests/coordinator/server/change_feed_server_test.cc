// The change feed through the real reshard-coordinator binary (issue 21;
// docs/coordinator.md, "Change feed"): a thousand WatchJob streams hold no
// thread of the replica and one committed change reaches all of them; a
// job's versions count its own changes only, on every replica (issue 31,
// defect 8). (A watcher whose replica is killed:
// tests/fault/feed_replicas_test.cc.)
#include <signal.h>

#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "tests/coordinator/server/job_watch.h"
#include "tests/coordinator/server/server_fixture.h"
#include "tests/support/jobs.h"

namespace reshard::coordinator::testing {
namespace {

using test_support::GptJobSpec;

/// Threads of process `pid` (/proc/PID/status).
std::optional<int> ThreadsOf(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    int threads = 0;
    if (line.rfind("Threads:", 0) == 0 && absl::SimpleAtoi(line.substr(8), &threads)) {
      return threads;
    }
  }
  return std::nullopt;
}

class ChangeFeedServerTest : public ServerTest {};

TEST_F(ChangeFeedServerTest, AThousandStreamsHoldNoThreadAndOneChangeReachesAll) {
  std::unique_ptr<CoordinatorProcess> c = StartCoordinator();
  ASSERT_NE(c, nullptr);
  auto admin = CoordinatorClient(c->address());
  const v1::Job job = Register(admin.get(), GptJobSpec("watched", "team-a"));
  const std::optional<int> threads_before = ThreadsOf(c->pid());
  ASSERT_TRUE(threads_before.has_value());

  constexpr int kStreams = 1000;
  std::vector<std::unique_ptr<JobWatch>> watches;
  for (int i = 0; i < kStreams; ++i) {
    watches.push_back(std::make_unique<JobWatch>(admin.get(), job.id()));
    std::optional<v1::Job> first = watches.back()->Next();
    ASSERT_TRUE(first.has_value()) << "stream " << i;
    ASSERT_EQ(first->version(), job.version()) << "stream " << i;
  }
  // A thread per stream (before the change feed) would be 1000 more.
  const std::optional<int> threads_open = ThreadsOf(c->pid());
  ASSERT_TRUE(threads_open.has_value());
  EXPECT_LT(*threads_open - *threads_before, 20)
      << "threads before " << *threads_before << ", with " << kStreams << " streams "
      << *threads_open;

  ReportRank(admin.get(), job.id(), 3);
  for (int i = 0; i < kStreams; ++i) {
    std::optional<v1::Job> next = watches[i]->Next();
    ASSERT_TRUE(next.has_value()) << "stream " << i;
    ASSERT_EQ(next->failed_ranks_size(), 1) << "stream " << i;
    EXPECT_EQ(next->failed_ranks(0).rank(), 3);
    EXPECT_GT(next->version(), job.version());
  }
}

// A job's version counts the job's own committed changes, one each, on
// every replica; another tenant's changes between two of them show nowhere
// (before migration 0020 every change of every job took the next number of
// one sequence, so the gap told a tenant how many changes others made). A
// watch resumed on another replica from the last version it saw, after the
// one it watched on died, gets the state with exactly the changes it missed,
// then the next change.
TEST_F(ChangeFeedServerTest, AJobsVersionsCountItsOwnChangesAndResumeOnAnotherReplica) {
  std::unique_ptr<CoordinatorProcess> a = StartCoordinator();
  ASSERT_NE(a, nullptr);
  std::unique_ptr<CoordinatorProcess> b = StartCoordinator();
  ASSERT_NE(b, nullptr);
  auto via_a = CoordinatorClient(a->address());
  auto via_b = CoordinatorClient(b->address());
  const v1::Job mine = Register(via_a.get(), GptJobSpec("mine", "team-a"));
  const v1::Job theirs = Register(via_b.get(), GptJobSpec("theirs", "team-b"));
  EXPECT_EQ(mine.version(), 1);
  EXPECT_EQ(theirs.version(), 1);

  auto on_a = std::make_unique<JobWatch>(via_a.get(), mine.id());
  std::optional<v1::Job> seen = on_a->Next();
  ASSERT_TRUE(seen.has_value());
  ASSERT_EQ(seen->version(), 1);
  for (int i = 0; i < 3; ++i) {
    ReportRank(via_b.get(), theirs.id(), 2 * i);
    ReportRank(via_b.get(), theirs.id(), 2 * i + 1);
    ReportRank(via_a.get(), mine.id(), i);
    seen = on_a->Next();
    ASSERT_TRUE(seen.has_value());
    EXPECT_EQ(seen->failed_ranks_size(), i + 1);
    EXPECT_EQ(seen->version(), 2 + i) << "after " << i + 1 << " changes of its own";
  }
  EXPECT_EQ(GetJob(via_b.get(), theirs.id()).version(), 7);

  // A dies with the stream open; two changes of the job (and the other
  // tenant's) commit through B while the watcher is away.
  a->Kill();
  on_a.reset();
  ReportRank(via_b.get(), theirs.id(), 6);
  ReportRank(via_b.get(), mine.id(), 3);
  ReportRank(via_b.get(), theirs.id(), 7);
  ReportRank(via_b.get(), mine.id(), 4);
  JobWatch resumed(via_b.get(), mine.id(), seen->version());
  std::optional<v1::Job> missed = resumed.Next();
  ASSERT_TRUE(missed.has_value());
  EXPECT_EQ(missed->version(), seen->version() + 2);
  EXPECT_EQ(missed->failed_ranks_size(), 5);
  ReportRank(via_b.get(), mine.id(), 5);
  std::optional<v1::Job> next = resumed.Next();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->version(), seen->version() + 3);
  EXPECT_EQ(next->failed_ranks_size(), 6);

  // A replica started afterwards resumes from the same versions.
  std::unique_ptr<CoordinatorProcess> c = StartCoordinator();
  ASSERT_NE(c, nullptr);
  auto via_c = CoordinatorClient(c->address());
  JobWatch restarted(via_c.get(), mine.id(), seen->version());
  std::optional<v1::Job> from_c = restarted.Next();
  ASSERT_TRUE(from_c.has_value());
  EXPECT_EQ(from_c->version(), next->version());
  EXPECT_EQ(from_c->failed_ranks_size(), 6);
}

}  // namespace
}  // namespace reshard::coordinator::testing
