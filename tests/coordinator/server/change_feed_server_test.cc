// The change feed through the real reshard-coordinator binary (issue 21;
// docs/coordinator.md, "Change feed"): a thousand WatchJob streams hold no
// thread of the replica and one committed change reaches all of them. (A
// watcher whose replica is killed: tests/fault/feed_replicas_test.cc.)
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

}  // namespace
}  // namespace reshard::coordinator::testing
