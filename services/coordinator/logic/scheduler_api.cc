#include "services/coordinator/logic/scheduler_api.h"

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/rpc/enum_name.h"
#include "planner/layout.h"
#include "planner/planner.h"
#include "planner/survivor.h"
#include "planner/validate.h"
#include "services/coordinator/logic/capacity.h"
#include "services/coordinator/logic/cost_estimates.h"
#include "services/coordinator/logic/dataset_state.h"
#include "services/coordinator/logic/deadlines.h"
#include "services/coordinator/logic/error_text.h"
#include "services/coordinator/logic/idempotency.h"
#include "services/coordinator/logic/ids.h"
#include "services/coordinator/logic/operation_finish.h"
#include "services/coordinator/logic/operation_states.h"
#include "services/coordinator/logic/policy_engine.h"
#include "services/coordinator/logic/redundancy.h"
#include "services/coordinator/logic/request_checks.h"
#include "services/coordinator/logic/task.h"
#include "services/coordinator/store/audit.h"
#include "services/coordinator/store/state_memory.h"

namespace reshard::coordinator {
namespace {

// A cancel races the driver's own transitions; each lost race means the
// operation moved, so a handful of re-reads always settles it.
constexpr int kCancelAttempts = 8;

constexpr char kCancelledByClient[] = "cancelled by client";

// A step-boundary wait is bounded: a training loop that never publishes
// must not hold the job for more than a day.
constexpr int64_t kMaxStepBoundaryTimeoutMs = 24LL * 3600 * 1000;

// The at_step_boundary fields of a Resize or Migrate request, checked before
// anything is read.
template <typename Request>
absl::Status CheckStepBoundary(const Request& request) {
  if (request.step_boundary_timeout_ms() < 0 ||
      request.step_boundary_timeout_ms() > kMaxStepBoundaryTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step_boundary_timeout_ms is ", request.step_boundary_timeout_ms(), "; it must be in [0, ",
        kMaxStepBoundaryTimeoutMs, "] (0: the coordinator's --step-boundary-timeout-ms)"));
  }
  if (request.step_boundary_timeout_ms() != 0 && !request.at_step_boundary()) {
    return absl::InvalidArgumentError("step_boundary_timeout_ms needs at_step_boundary");
  }
  if (request.at_step_boundary() && request.stop_free()) {
    return absl::InvalidArgumentError(
        "at_step_boundary and stop_free: a stop-free operation cuts over at a step boundary "
        "already (cut_over_operation_id); give one of them");
  }
  return absl::OkStatus();
}

// The operation of a Resize or Migrate request (they share these fields).
// A step-boundary wait runs until `now_ms` + its timeout (the store starts
// it at the release instead when the operation is queued).
template <typename Request>
NewOperation PlacementOperation(v1::OperationKind kind, const Request& request, v1::Layout target,
                                Idempotency idempotency, int64_t default_boundary_timeout_ms,
                                int64_t now_ms) {
  NewOperation op;
  op.kind = kind;
  op.job_id = request.job_id();
  op.expected_generation = request.expected_generation();
  op.target_layout = std::move(target);
  op.idempotency = std::move(idempotency);
  op.stop_free = request.stop_free();
  op.deadline = request.deadline();
  op.at_step_boundary = request.at_step_boundary();
  if (op.at_step_boundary) {
    op.step_boundary_timeout_ms = request.step_boundary_timeout_ms() > 0
                                      ? request.step_boundary_timeout_ms()
                                      : default_boundary_timeout_ms;
    op.step_boundary_deadline_unix_ms = now_ms + op.step_boundary_timeout_ms;
  }
  return op;
}

// JobLostSet of a request's lost hosts and ranks.
planner::LostSet LostOf(const v1::Job& job,
                        const google::protobuf::RepeatedPtrField<std::string>& hosts,
                        const google::protobuf::RepeatedField<int32_t>& ranks) {
  return JobLostSet(job.lost_hosts(), {hosts.begin(), hosts.end()}, {ranks.begin(), ranks.end()});
}

}  // namespace

SchedulerApi::SchedulerApi(StorePtr store, const Clock* clock, CoordinatorMetrics* metrics,
                           Options options)
    : store_(std::move(store)),
      advise_(store_),
      capacities_(store_),
      clock_(clock),
      metrics_(metrics),
      options_(options) {}

absl::StatusOr<v1::RegisterJobResponse> SchedulerApi::RegisterJob(
    const v1::RegisterJobRequest& request, const KeyScope& keys) {
  // Size first: validating or hashing a huge spec is the cost the limit avoids.
  const size_t spec_bytes = request.spec().ByteSizeLong();
  if (static_cast<int64_t>(spec_bytes) > options_.max_spec_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("spec is ", spec_bytes,
                                                   " bytes serialized; the limit is ",
                                                   options_.max_spec_bytes, " (max_spec_bytes)"));
  }
  if (!request.has_spec()) return absl::InvalidArgumentError("spec is required");
  if (absl::Status s = CheckIdempotencyKey(request.idempotency_key()); !s.ok()) return s;
  if (absl::Status s = planner::ValidateJobSpec(request.spec()); !s.ok()) return s;
  if (absl::Status s = CheckStateMemory(request.spec().state_memory()); !s.ok()) return s;
  if (request.spec().has_policy()) {
    if (absl::Status s = CheckPolicy(request.spec().policy(), "spec.policy"); !s.ok()) return s;
    if (request.spec().policy().has_advise()) {
      if (absl::Status s = CheckPolicyAdvice(request.spec().policy().advise(), request.spec().ptc(),
                                             "spec.policy");
          !s.ok()) {
        return s;
      }
    }
  }
  std::optional<v1::DatasetState> dataset_state;
  if (request.has_dataset_state()) {
    dataset_state = request.dataset_state();
    if (absl::Status s = NormalizeDatasetState(&*dataset_state); !s.ok()) return s;
  }
  if (absl::Status s =
          capacities_.CheckFits(request.spec().ptc(), request.spec().layout(), "layout");
      !s.ok()) {
    return s;
  }

  const std::string job_id = NewId();
  absl::StatusOr<v1::Job> job =
      store_->CreateJob(job_id, request.spec(), MakeIdempotency(keys, request),
                        dataset_state.has_value() ? &*dataset_state : nullptr);
  if (!job.ok()) return job.status();
  job->clear_ptc();  // the caller sent it; do not echo megabytes back
  RESHARD_LOG(INFO) << "job=" << job->id() << " registered tenant=\"" << job->tenant()
                    << "\" name=\"" << job->name() << "\" generation=" << job->generation()
                    << (job->id() == job_id ? "" : " (idempotent retry)");
  v1::RegisterJobResponse response;
  *response.mutable_job() = *std::move(job);
  return response;
}

absl::StatusOr<v1::Job> SchedulerApi::GetJob(const v1::GetJobRequest& request) {
  if (absl::Status s = RequireNonEmpty("job_id", request.job_id()); !s.ok()) return s;
  absl::StatusOr<v1::Job> job = store_->GetJob(request.job_id(), request.include_ptc());
  if (!job.ok()) return NameNotFound(job.status(), JobNotFound(request.job_id()));
  return job;
}

absl::StatusOr<v1::ListJobsResponse> SchedulerApi::ListJobs(const v1::ListJobsRequest& request) {
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size is ", request.page_size(), "; it must be >= 0 (0: default)"));
  }
  if (!v1::JobState_IsValid(request.state())) {
    return absl::InvalidArgumentError(
        absl::StrCat("state ", static_cast<int>(request.state()), " is not a known JobState"));
  }
  // The token is the last job id of the previous page; anything else was not
  // made by this service.
  if (!request.page_token().empty() && !LooksLikeId(request.page_token())) {
    return absl::InvalidArgumentError(absl::StrCat("page_token \"",
                                                   TruncateError(request.page_token(), 64),
                                                   "\" is not a token ListJobs returned"));
  }
  ListJobsQuery query;
  query.tenant = request.tenant();
  query.state = request.state();
  query.page_size = request.page_size() == 0
                        ? options_.default_page_size
                        : std::min<int>(request.page_size(), options_.max_page_size);
  query.after_job_id = request.page_token();
  absl::StatusOr<JobPage> page = store_->ListJobs(query);
  if (!page.ok()) return page.status();
  v1::ListJobsResponse response;
  for (v1::Job& job : page->jobs) *response.add_jobs() = std::move(job);
  response.set_next_page_token(page->next_after_job_id);
  return response;
}

absl::StatusOr<v1::DeleteJobResponse> SchedulerApi::DeleteJob(const v1::DeleteJobRequest& request,
                                                              const KeyScope& keys) {
  if (absl::Status s = RequireNonEmpty("job_id", request.job_id()); !s.ok()) return s;
  if (absl::Status s = CheckIdempotencyKey(request.idempotency_key()); !s.ok()) return s;
  if (absl::Status s = store_->DeleteJob(request.job_id(), MakeIdempotency(keys, request));
      !s.ok()) {
    return NameNotFound(s, JobNotFound(request.job_id()));
  }
  RESHARD_LOG(INFO) << "job=" << request.job_id() << " deleted";
  return v1::DeleteJobResponse();
}

absl::StatusOr<v1::Job> SchedulerApi::LoadJobWithPtc(const std::string& job_id) {
  absl::StatusOr<v1::Job> job = store_->GetJob(job_id, /*include_ptc=*/true);
  if (!job.ok()) return NameNotFound(job.status(), JobNotFound(job_id));
  return job;
}

absl::StatusOr<v1::Job> SchedulerApi::LoadForNewPlacement(const std::string& job_id,
                                                          bool has_placement,
                                                          int64_t expected_generation) {
  if (absl::Status s = RequireNonEmpty("job_id", job_id); !s.ok()) return s;
  if (!has_placement) return absl::InvalidArgumentError("placement is required");
  if (absl::Status s = CheckExpectedGeneration(expected_generation); !s.ok()) return s;
  return LoadJobWithPtc(job_id);
}

absl::Status SchedulerApi::CheckTarget(const v1::Ptc& ptc, const v1::Layout& target) {
  if (absl::Status s = planner::ValidateLayout(ptc, target, "target"); !s.ok()) return s;
  return capacities_.CheckFits(ptc, target, "target");
}

absl::Status SchedulerApi::CheckNoLeavingHost(const v1::Layout& target) {
  std::vector<std::string> ids;
  for (const v1::DeviceSlot& s : planner::ExpandPlacement(target.placement())) {
    if (std::find(ids.begin(), ids.end(), s.host()) == ids.end()) ids.push_back(s.host());
  }
  absl::StatusOr<std::vector<v1::Host>> hosts = store_->GetHosts(ids);
  if (!hosts.ok()) return hosts.status();
  for (const v1::Host& h : *hosts) {
    if (h.leaves_unix_ms() == 0) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "target.placement: host \"", h.host_id(), "\" leaves at ", UnixMsText(h.leaves_unix_ms()),
        " (a host notice): no new layout places ranks on it; withdraw the notice first "
        "(NoticeHost withdraw, reshardctl hosts notice ",
        h.host_id(), " --withdraw)"));
  }
  return absl::OkStatus();
}

absl::Status SchedulerApi::CheckMeetsDeadline(const v1::Deadline& deadline, const v1::Job& job,
                                              const v1::Layout& target, planner::LostSet lost,
                                              bool could_be_stop_free) {
  if (deadline.unix_ms() == 0) return absl::OkStatus();
  if (options_.cost == nullptr) {
    return absl::UnimplementedError(
        "deadline: this coordinator runs without a cost model and cannot predict the operation");
  }
  DeadlineCase c;
  c.job = &job;
  c.target = &target;
  c.lost = std::move(lost);
  c.could_be_stop_free = could_be_stop_free;
  absl::Status s = CheckDeadline(deadline, c, *options_.cost, *store_, clock_->NowUnixMs());
  if (!s.ok()) RESHARD_LOG(INFO) << "job=" << job.id() << " refused by its deadline: " << s;
  return s;
}

absl::StatusOr<v1::Operation> SchedulerApi::Resize(const v1::ResizeRequest& request,
                                                   const KeyScope& keys) {
  if (absl::Status s = CheckIdempotencyKey(request.idempotency_key()); !s.ok()) return s;
  if (absl::Status s = CheckStepBoundary(request); !s.ok()) return s;
  if (absl::Status s = CheckDeadlineField(request.deadline(), clock_->NowUnixMs()); !s.ok()) {
    return s;
  }
  if (request.has_choose()) return ResizeChosen(request, keys);
  absl::StatusOr<v1::Job> job =
      LoadForNewPlacement(request.job_id(), request.has_placement(), request.expected_generation());
  if (!job.ok()) return job.status();

  v1::Layout target;
  *target.mutable_config() = request.has_config() ? request.config() : job->layout().config();
  *target.mutable_placement() = request.placement();
  // Without a config the target borrows the current one, which is only
  // meaningful for the generation the request names. For a stale request
  // (or a retry of one that already committed) the store answers Aborted or
  // the first result, so do not judge it against another generation.
  if (request.has_config() || job->generation() == request.expected_generation()) {
    if (absl::Status s = CheckTarget(job->ptc(), target); !s.ok()) return s;
    if (absl::Status s = CheckNoLeavingHost(target); !s.ok()) return s;
  }
  if (job->generation() == request.expected_generation()) {
    if (absl::Status s =
            CheckMeetsDeadline(request.deadline(), *job, target,
                               JobLostSet(job->lost_hosts(), {}, {}), !request.stop_free());
        !s.ok()) {
      return s;
    }
  }
  return CreateOperation(PlacementOperation(v1::OPERATION_KIND_RESIZE, request, std::move(target),
                                            MakeIdempotency(keys, request),
                                            options_.step_boundary_timeout_ms,
                                            clock_->NowUnixMs()));
}

absl::StatusOr<v1::Operation> SchedulerApi::ResizeChosen(const v1::ResizeRequest& request,
                                                         const KeyScope& keys) {
  if (absl::Status s = RequireNonEmpty("job_id", request.job_id()); !s.ok()) return s;
  if (request.has_placement() || request.has_config()) {
    return absl::InvalidArgumentError(
        "choose: placement and config must be unset (the coordinator picks the layout)");
  }
  if (!request.choose().job_id().empty() && request.choose().job_id() != request.job_id()) {
    return absl::InvalidArgumentError(
        absl::StrCat("choose.job_id \"", TruncateError(request.choose().job_id(), 64),
                     "\": must be empty or equal job_id \"", request.job_id(), "\""));
  }
  if (absl::Status s = CheckExpectedGeneration(request.expected_generation()); !s.ok()) return s;
  absl::StatusOr<v1::Job> job = LoadJobWithPtc(request.job_id());
  if (!job.ok()) return job.status();
  // The advice is about the current generation; a stale request (or the
  // retry of one that committed) gets the store's answer, Aborted or the
  // first result, whatever target it carries.
  v1::Layout target = job->layout();
  if (job->generation() == request.expected_generation()) {
    absl::StatusOr<v1::Layout> chosen = advise_.Choose(request.choose(), *job);
    if (!chosen.ok()) return chosen.status();
    if (absl::Status s = CheckTarget(job->ptc(), *chosen); !s.ok()) return s;
    if (absl::Status s = CheckNoLeavingHost(*chosen); !s.ok()) return s;
    if (absl::Status s =
            CheckMeetsDeadline(request.deadline(), *job, *chosen,
                               JobLostSet(job->lost_hosts(), {}, {}), !request.stop_free());
        !s.ok()) {
      return s;
    }
    target = *std::move(chosen);
  }
  return CreateOperation(PlacementOperation(v1::OPERATION_KIND_RESIZE, request, std::move(target),
                                            MakeIdempotency(keys, request),
                                            options_.step_boundary_timeout_ms,
                                            clock_->NowUnixMs()));
}

absl::StatusOr<v1::Operation> SchedulerApi::Migrate(const v1::MigrateRequest& request,
                                                    const KeyScope& keys) {
  if (absl::Status s = CheckIdempotencyKey(request.idempotency_key()); !s.ok()) return s;
  if (absl::Status s = CheckStepBoundary(request); !s.ok()) return s;
  if (absl::Status s = CheckDeadlineField(request.deadline(), clock_->NowUnixMs()); !s.ok()) {
    return s;
  }
  absl::StatusOr<v1::Job> job =
      LoadForNewPlacement(request.job_id(), request.has_placement(), request.expected_generation());
  if (!job.ok()) return job.status();

  v1::Layout target;
  *target.mutable_config() = job->layout().config();
  *target.mutable_placement() = request.placement();
  // As in Resize: the config comes from the generation the request names.
  if (job->generation() == request.expected_generation()) {
    if (absl::Status s = CheckMigrateWorld(target.config(), target.placement()); !s.ok()) return s;
    if (absl::Status s = CheckTarget(job->ptc(), target); !s.ok()) return s;
    if (absl::Status s = CheckNoLeavingHost(target); !s.ok()) return s;
    if (absl::Status s =
            CheckMeetsDeadline(request.deadline(), *job, target,
                               JobLostSet(job->lost_hosts(), {}, {}), !request.stop_free());
        !s.ok()) {
      return s;
    }
  }
  return CreateOperation(PlacementOperation(v1::OPERATION_KIND_MIGRATE, request, std::move(target),
                                            MakeIdempotency(keys, request),
                                            options_.step_boundary_timeout_ms,
                                            clock_->NowUnixMs()));
}

// The request's target, or without one the survivors of the current
// generation (planner/survivor.h, the one survivor policy).
absl::StatusOr<v1::Layout> SchedulerApi::RecoveryTarget(
    const v1::RecoverFromFailureRequest& request, const v1::Job& job) {
  if (request.has_target() && request.has_choose()) {
    return absl::InvalidArgumentError("target and choose: give one of them, or neither");
  }
  if (request.has_target()) return request.target();
  if (job.generation() != request.expected_generation()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", job.id(), "\": expected_generation ", request.expected_generation(),
        " is not the current generation ", job.generation(),
        "; without a target the coordinator recovers the current generation's survivors"));
  }
  if (request.has_choose()) {
    planner::LostSet lost = LostOf(job, request.lost_hosts(), request.lost_ranks());
    return advise_.Choose(request.choose(), job, &lost);
  }
  absl::StatusOr<v1::Layout> target = planner::SurvivorLayout(
      job.layout(), {request.lost_hosts().begin(), request.lost_hosts().end()},
      {request.lost_ranks().begin(), request.lost_ranks().end()});
  if (!target.ok()) {
    return absl::Status(target.status().code(),
                        absl::StrCat("job \"", job.id(), "\": ", target.status().message()));
  }
  return target;
}

// The hosts of the request's lost ranks where a rank may restart in place:
// ALIVE, and named lost neither by the request nor by the job.
absl::StatusOr<std::set<std::string>> SchedulerApi::InPlaceHosts(
    const v1::RecoverFromFailureRequest& request, const v1::Job& job) {
  const std::vector<v1::DeviceSlot> slots = planner::ExpandPlacement(job.layout().placement());
  std::set<std::string> candidates;
  for (int32_t rank : request.lost_ranks()) {
    if (rank < 0 || rank >= static_cast<int64_t>(slots.size())) continue;
    const std::string& host = slots[rank].host();
    const auto named = [&](const auto& hosts) {
      return std::find(hosts.begin(), hosts.end(), host) != hosts.end();
    };
    if (!named(request.lost_hosts()) && !named(job.lost_hosts())) candidates.insert(host);
  }
  std::set<std::string> alive;
  for (const std::string& host : candidates) {
    absl::StatusOr<v1::Host> h = store_->GetHost(host);
    if (absl::IsNotFound(h.status())) continue;
    if (!h.ok()) return h.status();
    if (h->state() == v1::HOST_STATE_ALIVE) alive.insert(host);
  }
  return alive;
}

// A recovery keeps the job's redundancy (HSDP replicas, surviving the loss
// of any one host) unless the request accepts the loss; an accepted one is
// written to the audit trail and the log.
absl::Status SchedulerApi::CheckKeepsRedundancy(const v1::RecoverFromFailureRequest& request,
                                                const v1::Job& job, const v1::Layout& target,
                                                const std::set<std::string>& in_place_hosts) {
  absl::StatusOr<std::vector<std::string>> lost = RedundancyLost(job.ptc(), job.layout(), target);
  if (!lost.ok()) {
    // The layouts passed CheckTarget: a planner error here is the check's
    // own, and the recovery the caller asked for is not held hostage to it.
    RESHARD_LOG(WARNING) << "job=" << job.id() << " redundancy check skipped: " << lost.status();
    return absl::OkStatus();
  }
  if (lost->empty()) return absl::OkStatus();
  const std::string what = absl::StrJoin(*lost, " and ");
  if (request.accept_degraded()) {
    const std::string note =
        absl::StrCat("accept_degraded: the recovery to ", LayoutText(target), " gives up ", what);
    if (AuditRecord* audit = AuditScope::Current(); audit != nullptr) audit->message = note;
    RESHARD_LOG(WARNING) << "job=" << job.id() << " " << note;
    return absl::OkStatus();
  }
  const planner::LostSet lost_set = LostOf(job, request.lost_hosts(), request.lost_ranks());
  std::optional<v1::Layout> keeping =
      KeepingLayout(job.ptc(), job.layout(), lost_set, in_place_hosts);
  if (keeping.has_value() && !capacities_.CheckFits(job.ptc(), *keeping, "target").ok()) {
    keeping.reset();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "job \"", job.id(), "\": the recovery to ", LayoutText(target), " loses ", what,
      keeping.has_value() ? absl::StrCat("; a target that keeps it: ", LayoutText(*keeping))
                          : "; no layout on the surviving hosts keeps it",
      "; set accept_degraded to recover anyway"));
}

absl::StatusOr<v1::Operation> SchedulerApi::RecoverFromFailure(
    const v1::RecoverFromFailureRequest& request, const KeyScope& keys) {
  if (absl::Status s = RequireNonEmpty("job_id", request.job_id()); !s.ok()) return s;
  if (absl::Status s = CheckLostFields(request.lost_hosts(), request.lost_ranks()); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckExpectedGeneration(request.expected_generation()); !s.ok()) return s;
  if (absl::Status s = CheckIdempotencyKey(request.idempotency_key()); !s.ok()) return s;
  if (absl::Status s = CheckDeadlineField(request.deadline(), clock_->NowUnixMs()); !s.ok()) {
    return s;
  }
  absl::StatusOr<v1::Job> job = LoadJobWithPtc(request.job_id());
  if (!job.ok()) return job.status();

  absl::StatusOr<v1::Layout> target = RecoveryTarget(request, *job);
  if (!target.ok()) return target.status();
  if (absl::Status s = CheckTarget(job->ptc(), *target); !s.ok()) return s;
  // Lost ranks and hosts are of the generation the request names; whether
  // the survivors still hold everything is the planner's call (the
  // operation FAILS, naming the tensors, when they do not).
  if (job->generation() == request.expected_generation()) {
    absl::StatusOr<std::set<std::string>> in_place = InPlaceHosts(request, *job);
    if (!in_place.ok()) return in_place.status();
    if (absl::Status s = CheckLostAgainst(job->layout(), *target, request.lost_hosts(),
                                          request.lost_ranks(), *in_place);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckKeepsRedundancy(request, *job, *target, *in_place); !s.ok()) {
      return s;
    }
    if (absl::Status s =
            CheckMeetsDeadline(request.deadline(), *job, *target,
                               LostOf(*job, request.lost_hosts(), request.lost_ranks()), false);
        !s.ok()) {
      return s;
    }
  }
  NewOperation op;
  op.kind = v1::OPERATION_KIND_RECOVER;
  op.job_id = request.job_id();
  op.expected_generation = request.expected_generation();
  op.target_layout = *std::move(target);
  op.lost_hosts.assign(request.lost_hosts().begin(), request.lost_hosts().end());
  op.lost_ranks.assign(request.lost_ranks().begin(), request.lost_ranks().end());
  op.idempotency = MakeIdempotency(keys, request);
  op.deadline = request.deadline();
  return CreateOperation(std::move(op));
}

absl::StatusOr<v1::Operation> SchedulerApi::Checkpoint(const v1::CheckpointRequest& request,
                                                       const KeyScope& keys) {
  if (absl::Status s = RequireNonEmpty("job_id", request.job_id()); !s.ok()) return s;
  if (absl::Status s = CheckExpectedGeneration(request.expected_generation()); !s.ok()) return s;
  if (absl::Status s = CheckIdempotencyKey(request.idempotency_key()); !s.ok()) return s;
  // The step is checked field by field as a CommitStep of it would be.
  std::optional<StepCommit> step;
  if (request.with_step()) {
    v1::CommitStepRequest as_commit;
    as_commit.set_job_id(request.job_id());
    as_commit.set_generation(request.expected_generation());
    as_commit.set_step(request.step());
    as_commit.set_cursor(request.cursor());
    as_commit.set_layout_fingerprint(request.layout_fingerprint());
    if (absl::Status s = CheckCommitStepRequest(as_commit); !s.ok()) return s;
    step = ToStepCommit(as_commit);
  } else if (request.step() != 0 || request.cursor() != 0 ||
             !request.layout_fingerprint().empty()) {
    return absl::InvalidArgumentError("step, cursor and layout_fingerprint need with_step");
  }
  if (!request.cut_over_operation_id().empty() && !request.with_step() &&
      !NamesStepBoundaryOperation(request.cut_over_operation_id())) {
    return absl::InvalidArgumentError(
        absl::StrCat("cut_over_operation_id \"", TruncateError(request.cut_over_operation_id(), 64),
                     "\" needs with_step: a cut-over publishes the state of a step boundary"));
  }
  absl::StatusOr<v1::Job> job = store_->GetJob(request.job_id(), /*include_ptc=*/false);
  if (!job.ok()) return NameNotFound(job.status(), JobNotFound(request.job_id()));
  if (job->state() == v1::JOB_STATE_DEGRADED || job->state() == v1::JOB_STATE_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", job->id(), "\" is ", v1::JobState_Name(job->state()),
                     ": a checkpoint needs every rank of the current generation; recover first"));
  }
  NewOperation op;
  op.kind = v1::OPERATION_KIND_CHECKPOINT;
  op.job_id = request.job_id();
  op.expected_generation = request.expected_generation();
  op.target_layout = job->layout();
  op.idempotency = MakeIdempotency(keys, request);
  op.step = std::move(step);
  op.cut_over_operation_id = request.cut_over_operation_id();
  return CreateOperation(std::move(op));
}

bool SchedulerApi::NamesStepBoundaryOperation(const std::string& operation_id) {
  // A step boundary need not carry a dataset step (docs/coordinator.md,
  // "Checkpoints and operations"); a stop-free cut-over must. Whether the
  // operation still waits is the store's call.
  absl::StatusOr<OperationRecord> record = store_->GetOperation(operation_id, false);
  return record.ok() && record->op.step_boundary() != v1::STEP_BOUNDARY_UNSPECIFIED;
}

absl::StatusOr<v1::Operation> SchedulerApi::MarkPrepared(const v1::MarkPreparedRequest& request) {
  if (absl::Status s = RequireNonEmpty("operation_id", request.operation_id()); !s.ok()) return s;
  absl::StatusOr<v1::Operation> op = store_->MarkPrepared(request.operation_id());
  if (!op.ok()) return NameNotFound(op.status(), OperationNotFound(request.operation_id()));
  RESHARD_LOG(INFO) << "job=" << op->job_id() << " operation=" << op->id()
                    << " prepared: the new workers are warm after " << op->prepare_seconds()
                    << " s; waiting for the cut-over";
  return op;
}

void SchedulerApi::SupersedePolicyOperation(const std::string& job_id) {
  absl::StatusOr<v1::Job> job = store_->GetJob(job_id, /*include_ptc=*/false);
  if (!job.ok() || job->active_operation_id().empty()) return;
  absl::StatusOr<OperationRecord> active = store_->GetOperation(job->active_operation_id(), false);
  if (!active.ok() || !IsPolicyKey(active->op.idempotency_key())) return;
  OperationEnding ending;
  ending.event = OpEvent::kCancelled;
  ending.error = "superseded by a scheduler's call (docs/scheduler.md, \"Elastic policies\")";
  absl::Status s =
      FinishOperation(*store_, metrics_, active->op, ending, clock_->NowUnixMs(), options_.cost);
  RESHARD_LOG(INFO) << "job=" << job_id << " operation=" << active->op.id()
                    << " of the job's policy superseded by a scheduler's call: " << s;
}

absl::StatusOr<v1::Operation> SchedulerApi::CreateOperation(NewOperation op) {
  // A scheduler's own call always wins over the job's policy; a checkpoint
  // is the training loop's, and may be the policy's operation's cut-over.
  if (op.kind != v1::OPERATION_KIND_CHECKPOINT && !IsPolicyKey(op.idempotency.key)) {
    SupersedePolicyOperation(op.job_id);
  }
  op.operation_id = NewId();
  const std::string minted = op.operation_id;
  absl::StatusOr<v1::Operation> created = store_->CreateOperation(op);
  if (!created.ok()) {
    RESHARD_LOG(INFO) << "job=" << op.job_id << " " << rpc::EnumShortName(op.kind)
                      << " refused: " << created.status();
    return NameNotFound(created.status(), JobNotFound(op.job_id));
  }
  if (created->checkpoint_folded()) {
    RESHARD_LOG(INFO) << "job=" << created->job_id() << " checkpoint folded into the cut-over of "
                      << rpc::EnumShortName(created->kind()) << " operation=" << created->id();
    return created;
  }
  RESHARD_LOG(INFO) << "job=" << created->job_id() << " operation=" << created->id() << " "
                    << rpc::EnumShortName(created->kind())
                    << (created->id() == minted ? " created" : " returned for idempotent retry")
                    << (created->queued_behind_operation_id().empty()
                            ? ""
                            : " queued behind checkpoint " + created->queued_behind_operation_id())
                    << " state=" << rpc::EnumShortName(created->state())
                    << " from_generation=" << created->from_generation();
  return created;
}

absl::StatusOr<v1::PreviewPlanResponse> SchedulerApi::PreviewPlan(
    const v1::PreviewPlanRequest& request) {
  if (absl::Status s = RequireNonEmpty("job_id", request.job_id()); !s.ok()) return s;
  if (!request.has_target()) return absl::InvalidArgumentError("target is required");
  if (!request.lost_hosts().empty() || !request.lost_ranks().empty()) {
    if (absl::Status s = CheckLostFields(request.lost_hosts(), request.lost_ranks()); !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<v1::Job> job = LoadJobWithPtc(request.job_id());
  if (!job.ok()) return job.status();
  planner::LostSet lost;
  lost.hosts.assign(request.lost_hosts().begin(), request.lost_hosts().end());
  lost.ranks.assign(request.lost_ranks().begin(), request.lost_ranks().end());
  // As the driver plans it: a lost rank whose device the target reuses
  // restarts in place from its agent's buffer (redundancy.h).
  absl::StatusOr<planner::Plan> plan =
      planner::MakePlan(job->ptc(), job->layout(), request.target(),
                        PlannerLostSet(job->layout(), request.target(), lost));
  if (!plan.ok()) return plan.status();
  v1::PreviewPlanResponse response;
  *response.mutable_stats() = planner::StatsOf(*plan);
  if (options_.cost != nullptr) {
    *response.mutable_prediction() =
        PredictPlan(*options_.cost, *store_, *plan, job->layout(), request.target());
  }
  return response;
}

absl::StatusOr<v1::Operation> SchedulerApi::GetOperation(const v1::GetOperationRequest& request) {
  if (absl::Status s = RequireNonEmpty("operation_id", request.operation_id()); !s.ok()) return s;
  absl::StatusOr<OperationRecord> record =
      store_->GetOperation(request.operation_id(), /*include_plan=*/false);
  if (!record.ok()) return NameNotFound(record.status(), OperationNotFound(request.operation_id()));
  // Each host's task and its route (docs/coordinator.md, "The route of each
  // host's task"): here only, not in list or watch answers (a row per host).
  absl::StatusOr<std::vector<HostProgress>> hosts = store_->GetHostProgress(request.operation_id());
  if (!hosts.ok()) return hosts.status();
  for (const HostProgress& h : *hosts) {
    v1::OperationHost* out = record->op.add_hosts();
    out->set_host_id(h.host_id);
    out->set_state(h.state);
    out->set_bytes_done(h.bytes_done);
    out->set_bytes_total(h.bytes_total);
    out->set_waiting_on(h.waiting_on);
    out->set_route(h.route);
    out->set_route_reason(h.route_reason);
    out->set_error(h.error);
  }
  record->op.set_eta_unix_ms(EtaUnixMs(record->op, clock_->NowUnixMs()));
  return std::move(record->op);
}

absl::StatusOr<v1::Operation> SchedulerApi::CancelOperation(
    const v1::CancelOperationRequest& request, const KeyScope& keys) {
  const std::string& id = request.operation_id();
  if (absl::Status s = RequireNonEmpty("operation_id", id); !s.ok()) return s;
  if (absl::Status s = CheckIdempotencyKey(request.idempotency_key()); !s.ok()) return s;
  const Idempotency idem = MakeIdempotency(keys, request);
  for (int attempt = 0; attempt < kCancelAttempts; ++attempt) {
    absl::StatusOr<OperationRecord> record = store_->GetOperation(id, /*include_plan=*/false);
    if (!record.ok()) return NameNotFound(record.status(), OperationNotFound(id));
    const v1::Operation& op = record->op;
    // The key, as for every mutating call: a retry gets the operation it
    // cancelled; a key this scope used for another request moves nothing.
    // Read after the operation: a concurrent retry that moved it first has
    // committed its key by the time the operation reads final here.
    if (!idem.key.empty()) {
      absl::StatusOr<std::optional<std::string>> first = store_->LookupIdempotencyKey(idem);
      if (!first.ok()) return first.status();
      if (first->has_value()) {
        absl::StatusOr<OperationRecord> done = store_->GetOperation(**first, false);
        if (!done.ok()) return NameNotFound(done.status(), OperationNotFound(**first));
        return std::move(done->op);
      }
    }
    if (IsFinal(op.state())) {
      // Cancelling is idempotent in effect: an operation a client cancelled
      // is what any later cancel with a key asks for, so a cancel with a
      // fresh key (SDKs make one per call) gets it back rather than an error;
      // one without a key learns that it is final.
      if (!idem.key.empty() && op.state() == v1::OPERATION_STATE_ABORTED &&
          op.error() == kCancelledByClient) {
        return op;
      }
      return absl::FailedPreconditionError(absl::StrCat("operation \"", id, "\" is already ",
                                                        rpc::EnumShortName(op.state()),
                                                        "; only an active operation can be "
                                                        "cancelled"));
    }
    // The one way to end an operation (operation_finish.h), the driver's too.
    OperationEnding ending;
    ending.event = OpEvent::kCancelled;
    ending.error = kCancelledByClient;
    ending.idempotency = idem;  // claimed with the move
    absl::Status moved =
        FinishOperation(*store_, metrics_, op, ending, clock_->NowUnixMs(), options_.cost);
    // The driver moved it first, or a concurrent call took the key: look again.
    if (absl::IsAborted(moved)) continue;
    if (!moved.ok()) return moved;
    absl::StatusOr<OperationRecord> after = store_->GetOperation(id, /*include_plan=*/false);
    if (!after.ok()) return NameNotFound(after.status(), OperationNotFound(id));
    return std::move(after->op);
  }
  return absl::AbortedError(absl::StrCat("operation \"", id, "\" kept changing during ",
                                         kCancelAttempts, " cancel attempts; retry"));
}

absl::StatusOr<v1::Job> SchedulerApi::SetPolicy(const v1::SetPolicyRequest& request) {
  if (absl::Status s = RequireNonEmpty("job_id", request.job_id()); !s.ok()) return s;
  if (absl::Status s = CheckIdempotencyKey(request.idempotency_key()); !s.ok()) return s;
  // The job first: a missing one answers as another tenant's does.
  const bool advised = request.has_policy() && request.policy().has_advise();
  absl::StatusOr<v1::Job> found = store_->GetJob(request.job_id(), /*include_ptc=*/advised);
  if (!found.ok()) return NameNotFound(found.status(), JobNotFound(request.job_id()));
  if (request.has_policy()) {
    if (absl::Status s = CheckPolicy(request.policy(), "policy"); !s.ok()) return s;
    if (advised) {
      if (absl::Status s = CheckPolicyAdvice(request.policy().advise(), found->ptc(), "policy");
          !s.ok()) {
        return s;
      }
    }
  }
  absl::StatusOr<v1::Job> job =
      store_->SetJobPolicy(request.job_id(), request.has_policy() ? &request.policy() : nullptr);
  if (!job.ok()) return NameNotFound(job.status(), JobNotFound(request.job_id()));
  RESHARD_LOG(INFO) << "job=" << job->id() << " policy "
                    << (request.has_policy() ? "set" : "cleared");
  return job;
}

absl::StatusOr<v1::ListHostsResponse> SchedulerApi::ListHosts(const v1::ListHostsRequest&) {
  absl::StatusOr<std::vector<v1::Host>> hosts = store_->ListHosts();
  if (!hosts.ok()) return hosts.status();
  v1::ListHostsResponse response;
  for (v1::Host& host : *hosts) *response.add_hosts() = std::move(host);
  return response;
}

absl::StatusOr<v1::AdviseResponse> SchedulerApi::Advise(const v1::AdviseRequest& request) {
  return advise_.Advise(request);
}

absl::StatusOr<v1::DatasetState> SchedulerApi::CommitStep(const v1::CommitStepRequest& request) {
  if (absl::Status s = CheckCommitStepRequest(request); !s.ok()) return s;
  absl::StatusOr<v1::DatasetState> state = store_->CommitStep(ToStepCommit(request));
  if (!state.ok()) return NameNotFound(state.status(), JobNotFound(request.job_id()));
  return state;
}

}  // namespace reshard::coordinator
