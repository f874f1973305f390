// One open WatchJob stream, and a change every watcher of a job sees, for
// the change feed's tests against the real coordinator binary
// (change_feed_server_test.cc, tests/fault/feed_replicas_test.cc).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "grpcpp/grpcpp.h"
#include "tests/coordinator/server/server_fixture.h"

namespace reshard::coordinator::testing {

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
inline void ReportRank(CoordinatorStub* stub, const std::string& job_id, int rank) {
  v1::ReportRankFailureRequest report;
  report.set_job_id(job_id);
  report.set_rank(rank);
  report.set_reason(absl::StrCat("rank ", rank, " exited"));
  v1::RankFailure recorded;
  const grpc::Status s = stub->ReportRankFailure(Ctx().get(), report, &recorded);
  ASSERT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
}

}  // namespace reshard::coordinator::testing
