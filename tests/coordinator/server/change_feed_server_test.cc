// The change feed through the real reshard-coordinator binary (issue 21;
// docs/coordinator.md, "Change feed"): a thousand WatchJob streams hold no
// thread of the replica and one committed change reaches all of them; a
// change committed through one replica reaches a watcher of another; a
// watcher whose replica is killed resumes on the other from the last version
// it saw and misses nothing.
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
#include "tests/coordinator/server/server_fixture.h"
#include "tests/coordinator/server/test_jobs.h"

namespace reshard::coordinator::testing {
namespace {

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

/// One open WatchJob stream.
struct JobWatch {
  JobWatch(CoordinatorStub* stub, const std::string& job_id, int64_t from_version = 0) {
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_from_version(from_version);
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    reader = stub->WatchJob(&context, request);
  }
  ~JobWatch() {
    context.TryCancel();
    v1::Job ignored;
    while (reader->Read(&ignored)) {
    }
    (void)reader->Finish();
  }
  /// The next message; nullopt (with the stream's status in the test log)
  /// when the stream ended instead.
  std::optional<v1::Job> Next() {
    v1::Job job;
    if (reader->Read(&job)) return job;
    const grpc::Status s = reader->Finish();
    ADD_FAILURE() << "the stream ended: " << s.error_code() << " " << s.error_message();
    return std::nullopt;
  }
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::Job>> reader;
};

/// A change every watcher of the job sees: rank `rank` reported dead.
void ReportRank(CoordinatorStub* stub, const std::string& job_id, int rank) {
  v1::ReportRankFailureRequest report;
  report.set_job_id(job_id);
  report.set_rank(rank);
  report.set_reason(absl::StrCat("rank ", rank, " exited"));
  v1::RankFailure recorded;
  const grpc::Status s = stub->ReportRankFailure(Ctx().get(), report, &recorded);
  ASSERT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
}

class ChangeFeedServerTest : public ServerTest {};

TEST_F(ChangeFeedServerTest, AThousandStreamsHoldNoThreadAndOneChangeReachesAll) {
  std::unique_ptr<CoordinatorProcess> c = StartCoordinator();
  ASSERT_NE(c, nullptr);
  auto admin = CoordinatorClient(c->address());
  const v1::Job job = Register(admin.get(), SmallJobSpec("watched", "team-a"));
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

// Two replicas on one database. A change committed through A reaches a
// watcher of B. A is killed with a stream open; a change committed while
// its watcher is away reaches it when it resumes on B from the version it
// saw; a resume from the newest version gets only what comes after.
TEST_F(ChangeFeedServerTest, AWatcherResumesOnAnotherReplicaAndMissesNothing) {
  std::unique_ptr<CoordinatorProcess> a = StartCoordinator();
  ASSERT_NE(a, nullptr);
  std::unique_ptr<CoordinatorProcess> b = StartCoordinator();
  ASSERT_NE(b, nullptr);
  auto via_a = CoordinatorClient(a->address());
  auto via_b = CoordinatorClient(b->address());
  const v1::Job job = Register(via_a.get(), SmallJobSpec("replicas", "team-a"));

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
