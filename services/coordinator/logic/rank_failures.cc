// SchedulerApi::ReportRankFailure (scheduler_api.h): a training process or a
// scheduler says a rank of the job's current generation died. Checked here,
// recorded by the store (Store::RecordRankFailure) with the caller's audit
// row; WatchJob sends the job again because its failed_ranks changed.
#include "absl/strings/str_cat.h"
#include "planner/layout.h"
#include "services/coordinator/logic/error_text.h"
#include "services/coordinator/logic/request_checks.h"
#include "services/coordinator/logic/scheduler_api.h"

namespace reshard::coordinator {
namespace {

// Reasons are kept to this many bytes (a traceback's head is enough).
constexpr size_t kMaxReasonBytes = 1024;
// An operation may commit between the read of the world and the record
// (Aborted): each attempt re-reads the generation.
constexpr int kRecordAttempts = 4;

}  // namespace

absl::StatusOr<v1::RankFailure> SchedulerApi::ReportRankFailure(
    const v1::ReportRankFailureRequest& request, const std::string& reported_by) {
  const std::string& job_id = request.job_id();
  if (absl::Status s = RequireNonEmpty("job_id", job_id); !s.ok()) return s;
  if (request.rank() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", request.rank(), " is negative: a rank is >= 0"));
  }
  absl::Status last;
  for (int attempt = 0; attempt < kRecordAttempts; ++attempt) {
    absl::StatusOr<v1::Job> job = store_->GetJob(job_id, /*include_ptc=*/false);
    if (!job.ok()) return NameNotFound(job.status(), JobNotFound(job_id));
    const int64_t world = planner::WorldSize(job->layout().config());
    if (request.rank() >= world) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", request.rank(), " is outside job \"", job_id, "\"'s world: generation ",
          job->generation(), " has ", world, " ranks (0..", world - 1, ")"));
    }
    RankFailureReport report;
    report.job_id = job_id;
    report.generation = job->generation();
    report.rank = request.rank();
    report.reason = TruncateError(request.reason(), kMaxReasonBytes);
    report.reported_by = reported_by;
    absl::StatusOr<v1::RankFailure> recorded = store_->RecordRankFailure(report);
    if (!absl::IsAborted(recorded.status())) {
      return recorded.ok() ? recorded : NameNotFound(recorded.status(), JobNotFound(job_id));
    }
    last = recorded.status();
  }
  return last;
}

}  // namespace reshard::coordinator
