// SchedulerApi::NoticeHost (docs/scheduler.md, "Host notices"): a host goes
// away at a known time; every job whose current generation has ranks on it
// is moved off before then (onto a spare, or onto its other hosts), or
// told at once why not and what it keeps when the host goes.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "planner/layout.h"
#include "planner/survivor.h"
#include "services/coordinator/logic/deadlines.h"
#include "services/coordinator/logic/error_text.h"
#include "services/coordinator/logic/redundancy.h"
#include "services/coordinator/logic/request_checks.h"
#include "services/coordinator/logic/scheduler_api.h"
#include "services/coordinator/logic/spares.h"
#include "services/coordinator/store/audit.h"

namespace reshard::coordinator {
namespace {

// One way off the leaving host.
struct Move {
  v1::OperationKind kind = v1::OPERATION_KIND_MIGRATE;
  v1::Layout target;
  int spare = -1;    // index in the spares it takes; -1: none
  std::string what;  // "onto spare h9", "onto the job's other hosts"
};

// What the job keeps if `leaving` goes with its state still there.
std::string WhatItKeeps(const v1::Job& job, const std::string& leaving) {
  absl::StatusOr<v1::Layout> survivors = planner::SurvivorLayout(job.layout(), {leaving}, {});
  if (!survivors.ok()) {
    return absl::StrCat("when ", leaving, " goes, no layout is left on the job's other hosts (",
                        survivors.status().message(), ")");
  }
  planner::LostSet lost;
  lost.hosts = {leaving};
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(job.ptc(), job.layout(), *survivors, lost);
  if (plan.ok()) {
    return absl::StrCat("when ", leaving,
                        " goes, a recovery onto the job's other hosts loses nothing: every byte "
                        "of it has a copy there");
  }
  return absl::StrCat("when ", leaving,
                      " goes, the job loses what only it holds: ", plan.status().message());
}

}  // namespace

absl::StatusOr<v1::NoticeHostResponse> SchedulerApi::WithdrawNotice(
    const v1::NoticeHostRequest& request) {
  if (request.leaves_unix_ms() != 0 || request.spare_hosts_size() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("withdraw takes only host_id: leaves_unix_ms is ", request.leaves_unix_ms(),
                     " and spare_hosts names ", request.spare_hosts_size(), " hosts"));
  }
  if (absl::Status s = store_->SetHostLeaves(request.host_id(), 0); !s.ok()) {
    return NameNotFound(
        s, absl::NotFoundError(absl::StrCat("host \"", request.host_id(), "\" is not registered")));
  }
  RESHARD_LOG(INFO) << "host " << request.host_id() << ": notice withdrawn";
  if (AuditRecord* audit = AuditScope::Current(); audit != nullptr) {
    audit->message = "notice withdrawn";
  }
  return v1::NoticeHostResponse();
}

absl::StatusOr<v1::NoticeHostResponse> SchedulerApi::NoticeHost(
    const v1::NoticeHostRequest& request, const KeyScope& keys) {
  if (absl::Status s = RequireNonEmpty("host_id", request.host_id()); !s.ok()) return s;
  if (absl::Status s = CheckIdempotencyKey(request.idempotency_key()); !s.ok()) return s;
  const int64_t now = clock_->NowUnixMs();
  if (request.withdraw()) return WithdrawNotice(request);
  v1::Deadline deadline;
  deadline.set_unix_ms(request.leaves_unix_ms());
  if (request.leaves_unix_ms() == 0) {
    return absl::InvalidArgumentError("leaves_unix_ms is required");
  }
  if (absl::Status s = CheckDeadlineField(deadline, now); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "leaves_unix_ms ", request.leaves_unix_ms(), " (", UnixMsText(request.leaves_unix_ms()),
        ") is not in the future: the coordinator's clock reads ", UnixMsText(now)));
  }
  if (absl::Status s = CheckSpareHosts("spare_hosts", request.spare_hosts(), request.host_id());
      !s.ok()) {
    return s;
  }
  const std::string& leaving = request.host_id();
  if (absl::StatusOr<v1::Host> host = store_->GetHost(leaving); !host.ok()) {
    return NameNotFound(host.status(), absl::NotFoundError(absl::StrCat("host \"", leaving,
                                                                        "\" is not registered")));
  }
  // Marked first: from now on the host is no spare, and no Resize or
  // Migrate places ranks on it.
  if (absl::Status s = store_->SetHostLeaves(leaving, request.leaves_unix_ms()); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::vector<Spare>> alive = AliveSpares(*store_, request.spare_hosts());
  if (!alive.ok()) return alive.status();
  const std::vector<Spare>& spares = *alive;
  std::vector<bool> taken(spares.size(), false);
  absl::StatusOr<std::vector<std::string>> jobs = store_->JobsOnHosts({leaving});
  if (!jobs.ok()) return jobs.status();
  std::sort(jobs->begin(), jobs->end());

  v1::NoticeHostResponse response;
  for (const std::string& job_id : *jobs) {
    absl::StatusOr<v1::Job> job = store_->GetJob(job_id, /*include_ptc=*/true);
    if (absl::IsNotFound(job.status())) continue;  // deleted since
    if (!job.ok()) return job.status();
    v1::HostNoticeJob* entry = response.add_jobs();
    entry->set_job_id(job_id);

    // The ways off, in order: a spare takes the leaving host's place (the
    // same layout otherwise), or the job shrinks onto its other hosts.
    std::vector<Move> moves;
    for (size_t i = 0; i < spares.size(); ++i) {
      if (taken[i]) continue;
      if (std::optional<v1::Layout> t = OntoSpare(job->layout(), leaving, spares[i])) {
        moves.push_back({v1::OPERATION_KIND_MIGRATE, *std::move(t), static_cast<int>(i),
                         absl::StrCat("onto spare ", spares[i].host)});
        break;
      }
    }
    std::vector<std::string> why_not;
    if (absl::StatusOr<v1::Layout> shrunk = planner::SurvivorLayout(job->layout(), {leaving}, {});
        shrunk.ok()) {
      moves.push_back(
          {v1::OPERATION_KIND_RESIZE, *std::move(shrunk), -1, "onto the job's other hosts"});
    } else {
      why_not.push_back(
          absl::StrCat("the job cannot shrink onto its other hosts: ", shrunk.status().message()));
    }
    if (spares.empty()) {
      why_not.push_back("no spare host was offered");
    } else if (moves.empty() || moves.front().spare < 0) {
      why_not.push_back(
          "no offered spare is registered, ALIVE, unused by the job and not given to another "
          "job, with enough devices");
    }

    for (const Move& m : moves) {
      if (absl::Status s = CheckTarget(job->ptc(), m.target); !s.ok()) {
        why_not.push_back(absl::StrCat(m.what, ": ", s.message()));
        continue;
      }
      v1::CostPrediction prediction;
      DeadlineCase c;
      c.job = &*job;
      c.target = &m.target;
      c.lost = JobLostSet(job->lost_hosts(), {}, {});
      absl::Status meets =
          options_.cost == nullptr
              ? absl::UnimplementedError("no cost model to predict the move")
              : CheckDeadline(deadline, c, *options_.cost, *store_, now, &prediction);
      if (!meets.ok()) {
        why_not.push_back(absl::StrCat(m.what, ": ", meets.message()));
        continue;
      }
      // The operation as the scheduler's own Migrate or Resize would
      // create it, the leaving time its deadline (the host's loss would
      // abort it anyway past it).
      // The key is the request's, per job: a retry while the moves run
      // gets the same operations.
      const std::string key = request.idempotency_key().empty()
                                  ? ""
                                  : absl::StrCat(request.idempotency_key(), "/", job_id);
      NewOperation op;
      op.kind = m.kind;
      op.job_id = job_id;
      op.expected_generation = job->generation();
      op.target_layout = m.target;
      op.deadline = deadline;
      // The request a scheduler would have sent (its fingerprint is what a
      // retry is matched by).
      const auto as_request = [&](auto request_of_kind) {
        request_of_kind.set_job_id(job_id);
        request_of_kind.set_expected_generation(job->generation());
        *request_of_kind.mutable_placement() = m.target.placement();
        *request_of_kind.mutable_deadline() = deadline;
        request_of_kind.set_idempotency_key(key);
        return MakeIdempotency(keys, request_of_kind);
      };
      if (m.kind == v1::OPERATION_KIND_MIGRATE) {
        op.idempotency = as_request(v1::MigrateRequest());
      } else {
        v1::ResizeRequest resize;
        *resize.mutable_config() = m.target.config();
        op.idempotency = as_request(std::move(resize));
      }
      absl::StatusOr<v1::Operation> created = CreateOperation(std::move(op));
      if (!created.ok()) {
        why_not.push_back(absl::StrCat(m.what, ": ", created.status().message()));
        break;  // the job's own state refused it (an active operation): no other way helps
      }
      entry->set_operation_id(created->id());
      *entry->mutable_target() = m.target;
      *entry->mutable_prediction() = prediction;
      if (m.spare >= 0) taken[m.spare] = true;
      RESHARD_LOG(INFO) << "job=" << job_id << " operation=" << created->id() << " host " << leaving
                        << " leaves at " << UnixMsText(request.leaves_unix_ms()) << ": moving "
                        << m.what << " (" << LayoutText(m.target) << "), predicted "
                        << prediction.seconds() << " s";
      break;
    }
    if (entry->operation_id().empty()) {
      entry->set_refused(TruncateError(
          absl::StrCat(absl::StrJoin(why_not, "; "), "; ", WhatItKeeps(*job, leaving))));
      RESHARD_LOG(WARNING) << "job=" << job_id << " host " << leaving << " leaves at "
                           << UnixMsText(request.leaves_unix_ms())
                           << ": not moved off it: " << entry->refused();
    }
  }
  if (AuditRecord* audit = AuditScope::Current(); audit != nullptr) {
    int moved = 0;
    for (const v1::HostNoticeJob& j : response.jobs()) moved += j.operation_id().empty() ? 0 : 1;
    audit->message =
        absl::StrCat("host ", leaving, " leaves at ", UnixMsText(request.leaves_unix_ms()), ": ",
                     moved, " of ", response.jobs_size(), " jobs moving off it");
  }
  return response;
}

}  // namespace reshard::coordinator
