// Logic behind CoordinatorService (what schedulers call). The gRPC adapter
// (server/) only converts; every check and every status code is decided here.
// Thread-safe: its only state of its own is the hosts' capacities it keeps
// (capacity.h).
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cost/model.h"
#include "planner/planner.h"
#include "reshard/v1/coordinator.pb.h"
#include "services/coordinator/clock.h"
#include "services/coordinator/logic/advise_api.h"
#include "services/coordinator/logic/capacity.h"
#include "services/coordinator/logic/idempotency.h"
#include "services/coordinator/metrics/metrics.h"
#include "services/coordinator/store/store.h"

namespace reshard::coordinator {

class SchedulerApi {
 public:
  struct Options {
    int64_t max_spec_bytes = 64 << 20;  // larger specs: InvalidArgument
    int max_page_size = 1000;
    int default_page_size = 100;
    /// A Resize/Migrate at_step_boundary without its own timeout waits this
    /// long for a checkpoint naming it (docs/coordinator.md, "Checkpoints
    /// and operations").
    int64_t step_boundary_timeout_ms = 120000;
    /// The cost model (docs/scheduler.md; not owned, outlives this); null: PreviewPlan predicts
    /// nothing.
    cost::CostModel* cost = nullptr;
  };

  /// `metrics` may be null.
  SchedulerApi(StorePtr store, const Clock* clock, CoordinatorMetrics* metrics, Options options);

  // The mutating calls take the caller's KeyScope: their idempotency key is
  // looked up and claimed only among that scope's keys (idempotency.h).

  [[nodiscard]] absl::StatusOr<v1::RegisterJobResponse> RegisterJob(
      const v1::RegisterJobRequest& request, const KeyScope& keys = {});
  [[nodiscard]] absl::StatusOr<v1::Job> GetJob(const v1::GetJobRequest& request);
  [[nodiscard]] absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request);
  [[nodiscard]] absl::StatusOr<v1::DeleteJobResponse> DeleteJob(
      const v1::DeleteJobRequest& request, const KeyScope& keys = {});
  [[nodiscard]] absl::StatusOr<v1::Operation> Resize(const v1::ResizeRequest& request,
                                                     const KeyScope& keys = {});
  [[nodiscard]] absl::StatusOr<v1::Operation> Migrate(const v1::MigrateRequest& request,
                                                      const KeyScope& keys = {});
  [[nodiscard]] absl::StatusOr<v1::Operation> RecoverFromFailure(
      const v1::RecoverFromFailureRequest& request, const KeyScope& keys = {});
  /// A CHECKPOINT operation: generation current + 1 on the current layout,
  /// written by the workers. FailedPrecondition unless the job is ACTIVE.
  [[nodiscard]] absl::StatusOr<v1::Operation> Checkpoint(const v1::CheckpointRequest& request,
                                                         const KeyScope& keys = {});
  /// A stop-free operation's new workers are warm (Store::MarkPrepared).
  [[nodiscard]] absl::StatusOr<v1::Operation> MarkPrepared(const v1::MarkPreparedRequest& request);
  [[nodiscard]] absl::StatusOr<v1::PreviewPlanResponse> PreviewPlan(
      const v1::PreviewPlanRequest& request);
  [[nodiscard]] absl::StatusOr<v1::Operation> GetOperation(const v1::GetOperationRequest& request);
  /// Moves an active operation to ABORTED ("cancelled by client").
  /// FailedPrecondition when it is final already. With a key, as every
  /// mutating call: the key is claimed with the move, a retry returns the
  /// operation it cancelled, another request with it is InvalidArgument.
  [[nodiscard]] absl::StatusOr<v1::Operation> CancelOperation(
      const v1::CancelOperationRequest& request, const KeyScope& keys = {});
  [[nodiscard]] absl::StatusOr<v1::ListHostsResponse> ListHosts(
      const v1::ListHostsRequest& request);
  /// Host `host_id` leaves at `leaves_unix_ms`: every job on it is moved
  /// off before then, or told why not (host_notice.cc; docs/scheduler.md,
  /// "Host notices").
  [[nodiscard]] absl::StatusOr<v1::NoticeHostResponse> NoticeHost(
      const v1::NoticeHostRequest& request, const KeyScope& keys = {});
  /// Sets or clears the job's elastic policy (policy_engine.h); returns the
  /// job. InvalidArgument naming a bad field (CheckPolicy); NotFound.
  /// Setting a policy is idempotent: the key is only checked.
  [[nodiscard]] absl::StatusOr<v1::Job> SetPolicy(const v1::SetPolicyRequest& request);
  /// Commits a step boundary's dataset cursor with the current generation
  /// (docs/data.md; rules: store/dataset_commit.h).
  [[nodiscard]] absl::StatusOr<v1::DatasetState> CommitStep(const v1::CommitStepRequest& request);
  /// Rank `rank` of the job's current generation died (rank_failures.cc):
  /// recorded with `reported_by` (the caller's identity) and returned;
  /// GetJob and WatchJob show it in Job.failed_ranks. InvalidArgument naming
  /// `rank` and its value outside 0..world-1; NotFound for a missing job.
  [[nodiscard]] absl::StatusOr<v1::RankFailure> ReportRankFailure(
      const v1::ReportRankFailureRequest& request, const std::string& reported_by);
  /// The advisor's Pareto set for a job (AdviseApi::Advise).
  [[nodiscard]] absl::StatusOr<v1::AdviseResponse> Advise(const v1::AdviseRequest& request);

 private:
  /// The job with its PTC; NotFound names the job.
  [[nodiscard]] absl::StatusOr<v1::Job> LoadJobWithPtc(const std::string& job_id);
  // Resize and Migrate: checks the request's job id, placement presence and
  // expected generation, then loads the job with its PTC.
  [[nodiscard]] absl::StatusOr<v1::Job> LoadForNewPlacement(const std::string& job_id,
                                                            bool has_placement,
                                                            int64_t expected_generation);
  /// A Resize, Migrate or Recover target: a valid layout for `ptc`
  /// (InvalidArgument) whose hosts can hold it (ResourceExhausted).
  [[nodiscard]] absl::Status CheckTarget(const v1::Ptc& ptc, const v1::Layout& target);
  /// FAILED_PRECONDITION when `target` places ranks on a host with a notice
  /// (Host.leaves_unix_ms): what a Resize or Migrate may not do. A recovery
  /// may (the host is still the job's until it goes).
  [[nodiscard]] absl::Status CheckNoLeavingHost(const v1::Layout& target);
  absl::StatusOr<v1::NoticeHostResponse> WithdrawNotice(const v1::NoticeHostRequest& request);
  /// OK when `deadline` is unset or the cost model predicts the move of
  /// `job` to `target` (`lost`: as the driver plans it) ends by it;
  /// FailedPrecondition naming the prediction and the alternative
  /// otherwise (deadlines.h); Unimplemented without a cost model.
  [[nodiscard]] absl::Status CheckMeetsDeadline(const v1::Deadline& deadline, const v1::Job& job,
                                                const v1::Layout& target, planner::LostSet lost,
                                                bool could_be_stop_free);
  /// Whether `operation_id` is an operation asked to stop at a step
  /// boundary (its checkpoint needs no with_step).
  bool NamesStepBoundaryOperation(const std::string& operation_id);
  /// Cancels the job's active operation when its elastic policy made it:
  /// a scheduler's own call always wins. Errors only logged.
  void SupersedePolicyOperation(const std::string& job_id);
  /// Mints the id and asks the store (which checks existence, idempotency,
  /// generation and the active operation atomically); a call that is not
  /// the policy's own and not a checkpoint first supersedes the policy's
  /// operation in flight.
  [[nodiscard]] absl::StatusOr<v1::Operation> CreateOperation(NewOperation op);
  [[nodiscard]] absl::StatusOr<v1::Layout> RecoveryTarget(
      const v1::RecoverFromFailureRequest& request, const v1::Job& job);
  /// The hosts where a lost rank of the request may restart in place.
  [[nodiscard]] absl::StatusOr<std::set<std::string>> InPlaceHosts(
      const v1::RecoverFromFailureRequest& request, const v1::Job& job);
  /// FailedPrecondition when `target` gives up the job's redundancy and the
  /// request does not accept it (redundancy.h).
  [[nodiscard]] absl::Status CheckKeepsRedundancy(const v1::RecoverFromFailureRequest& request,
                                                  const v1::Job& job, const v1::Layout& target,
                                                  const std::set<std::string>& in_place_hosts);

  /// Resize with `choose`: the advisor's best layout for the horizon.
  [[nodiscard]] absl::StatusOr<v1::Operation> ResizeChosen(const v1::ResizeRequest& request,
                                                           const KeyScope& keys);

  StorePtr store_;
  AdviseApi advise_;
  HostCapacities capacities_;
  const Clock* clock_;
  CoordinatorMetrics* metrics_;
  Options options_;
};

}  // namespace reshard::coordinator
