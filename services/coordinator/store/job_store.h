// The jobs aggregate of the Store (store.h): a job, its PTC, its
// generations' layouts and dataset states, and its ranks reported dead.
// PgStore (pg_jobs.cc, pg_dataset_state.cc, pg_rank_failures.cc) and
// MemoryStore (memory_jobs.cc) implement it; errors as store.h says.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "reshard/v1/agent.pb.h"
#include "reshard/v1/coordinator.pb.h"
#include "reshard/v1/ptc.pb.h"
#include "services/coordinator/store/dataset_commit.h"
#include "services/coordinator/store/idempotency.h"

namespace reshard::coordinator {

struct ListJobsQuery {
  std::string tenant;                              // empty: all
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;  // unspecified: all
  int page_size = 100;
  std::string after_job_id;  // page token: list job ids greater than this
};

struct JobPage {
  std::vector<v1::Job> jobs;
  std::string next_after_job_id;  // empty on the last page
};

enum class GenerationState : int16_t {
  kCurrent = 1,    // the job's committed generation
  kPending = 2,    // being built by an operation
  kRetired = 3,    // superseded; agents may free its buffers
  kDiscarded = 4,  // its operation aborted; agents drop its buffers
};

/// A rank reported dead (Store::RecordRankFailure).
struct RankFailureReport {
  std::string job_id;
  int64_t generation = 0;
  int rank = 0;
  std::string reason;
  std::string reported_by;  // the caller's identity
};

class JobStore {
 public:
  virtual ~JobStore() = default;

  /// Creates job `job_id` with generation 1 = spec.layout (state ACTIVE) and
  /// its PTC. With a key seen before for the same request: returns that job.
  /// AlreadyExists when (tenant, name) is taken.
  /// With `dataset_state` (may be null): generation 1's dataset state, in
  /// the same transaction (docs/data.md).
  [[nodiscard]] virtual absl::StatusOr<v1::Job> CreateJob(
      const std::string& job_id, const v1::JobSpec& spec, const Idempotency& idem,
      const v1::DatasetState* dataset_state = nullptr) = 0;
  /// The job with its current layout, lost hosts (hosts of the current
  /// generation whose state is LOST) and active operation; the PTC only when
  /// `include_ptc`.
  [[nodiscard]] virtual absl::StatusOr<v1::Job> GetJob(const std::string& job_id,
                                                       bool include_ptc) = 0;
  [[nodiscard]] virtual absl::StatusOr<v1::Ptc> GetPtc(const std::string& job_id) = 0;
  /// The change feed's safety poll (logic/change_feed.h): the version
  /// (Job.version) of each of `job_ids` that exists; a missing job is
  /// absent from the map. Every change to what GetJob shows takes a larger
  /// version. The default reads each job; a store answers in one query.
  [[nodiscard]] virtual absl::StatusOr<std::map<std::string, int64_t>> JobVersions(
      const std::vector<std::string>& job_ids) {
    std::map<std::string, int64_t> versions;
    for (const std::string& id : job_ids) {
      absl::StatusOr<v1::Job> job = GetJob(id, /*include_ptc=*/false);
      if (absl::IsNotFound(job.status())) continue;
      if (!job.ok()) return job.status();
      versions.emplace(id, job->version());
    }
    return versions;
  }
  [[nodiscard]] virtual absl::StatusOr<JobPage> ListJobs(const ListJobsQuery& query) = 0;
  /// Deletes the job and everything under it. FailedPrecondition while an
  /// operation is active. With a key: the key is recorded in the same
  /// transaction (without a job, so it outlives the job); a retry with the
  /// same key and request returns OK again; a key used for another request
  /// (or method) is InvalidArgument, before the job is looked at.
  [[nodiscard]] virtual absl::Status DeleteJob(const std::string& job_id,
                                               const Idempotency& idem = {}) = 0;
  /// Sets a job's state (e.g. DEGRADED when its hosts are lost).
  [[nodiscard]] virtual absl::Status SetJobState(const std::string& job_id, v1::JobState state) = 0;
  /// Sets the job's elastic policy (null: none) with the caller's audit
  /// row, and returns the job. NotFound for a missing job.
  [[nodiscard]] virtual absl::StatusOr<v1::Job> SetJobPolicy(const std::string& job_id,
                                                             const v1::ElasticPolicy* policy) = 0;
  /// Sets what the policy did last or waits for (Job.policy_status); a
  /// status equal to the stored one changes nothing (the job keeps its
  /// version). NotFound for a missing job.
  [[nodiscard]] virtual absl::Status SetPolicyStatus(const std::string& job_id,
                                                     const std::string& status) = 0;
  /// The ids of the jobs that have a policy, ascending.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> JobsWithPolicy() = 0;
  /// Commits a step boundary's cursor with the job's current generation
  /// (CheckStepCommit's rules, dataset_commit.h, under the job's row lock)
  /// and returns the dataset state. NotFound for a missing job;
  /// FailedPrecondition when the job has no dataset state or a rule refuses.
  [[nodiscard]] virtual absl::StatusOr<v1::DatasetState> CommitStep(const StepCommit& commit) = 0;
  /// Records that rank `report.rank` of the job's generation
  /// `report.generation` died (a repeated report of the rank replaces its
  /// reason and time), with the caller's audit row, and returns the record;
  /// GetJob lists the current generation's in Job.failed_ranks. NotFound
  /// for a missing job; Aborted when the job's current generation is not
  /// `report.generation` (re-read it and retry).
  [[nodiscard]] virtual absl::StatusOr<v1::RankFailure> RecordRankFailure(
      const RankFailureReport& report) = 0;
  /// Counts of jobs by state, for metrics.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::pair<v1::JobState, int64_t>>>
  CountJobsByState() = 0;
  /// The shard checksums recorded for a generation (by RecordHostProgress),
  /// rank ascending; empty for a generation no operation built.
  [[nodiscard]] virtual absl::StatusOr<std::vector<v1::ShardChecksum>> GetGenerationChecksums(
      const std::string& job_id, int64_t generation) = 0;
};

}  // namespace reshard::coordinator
