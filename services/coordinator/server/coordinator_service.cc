#include "services/coordinator/server/coordinator_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/layout.h"
#include "services/coordinator/logic/audit_api.h"
#include "services/coordinator/logic/operation_states.h"
#include "services/coordinator/logic/request_checks.h"
#include "services/coordinator/server/rpc_status.h"
#include "services/coordinator/server/watch_reactor.h"

namespace reshard::coordinator {
namespace {

// Whose idempotency keys a caller's are (logic/idempotency.h): its tenants,
// a worker's job, or, for a caller scoped to none (an admin), a scope of its
// own. A worker's scope holds an empty name, which no scheduler's or
// viewer's tenants hold (certificates and tokens refuse empty tenants), so
// no tenant and no other job reaches it.
KeyScope KeysOf(const Authorizer& authorizer, const Principal& p) {
  if (p.role == Role::kWorker) return KeyScope{{"", absl::StrCat("worker:", p.job_id)}};
  return authorizer.ScopedToTenants(p) ? KeyScope{p.tenants} : KeyScope{};
}

}  // namespace

absl::Status CoordinatorServiceImpl::InJobTenant(const Principal& p, const char* method,
                                                 const std::string& job_id,
                                                 const v1::Job* read) const {
  // A worker token is for one job: no lookup, and nothing told of another job.
  if (p.role == Role::kWorker) return authorizer_->AuthorizeJob(p, method, job_id, "", {});
  if (!authorizer_->ScopedToTenants(p)) return absl::OkStatus();
  if (read != nullptr) return authorizer_->AuthorizeJob(p, method, read->id(), read->tenant(), {});
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  absl::StatusOr<v1::Job> job = api_->GetJob(request);
  // A missing job is the call's own answer (NotFound, or an idempotent replay).
  if (absl::IsNotFound(job.status())) return absl::OkStatus();
  if (!job.ok()) return job.status();
  return authorizer_->AuthorizeJob(p, method, job->id(), job->tenant(), {});
}

absl::Status CoordinatorServiceImpl::InOperationTenant(const Principal& p, const char* method,
                                                       const std::string& operation_id,
                                                       const v1::Operation* read) const {
  if (!authorizer_->ScopedToTenants(p) && p.role != Role::kWorker) return absl::OkStatus();
  absl::StatusOr<v1::Operation> op = absl::NotFoundError("");
  if (read != nullptr) {
    op = *read;
  } else {
    v1::GetOperationRequest request;
    request.set_operation_id(operation_id);
    op = api_->GetOperation(request);
  }
  if (absl::IsNotFound(op.status())) return absl::OkStatus();
  if (!op.ok()) return op.status();
  absl::Status in_tenant = InJobTenant(p, method, op->job_id());
  if (!absl::IsNotFound(in_tenant)) return in_tenant;
  // Hidden as the operation's own absence: naming its job would tell the
  // caller that the operation exists, and of which job.
  absl::Status hidden =
      absl::NotFoundError(absl::StrCat("operation \"", operation_id, "\" not found"));
  in_tenant.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { hidden.SetPayload(url, payload); });
  return hidden;
}

absl::StatusOr<WatchSlot> CoordinatorServiceImpl::AcquireWatch(const Principal& p,
                                                               const char* method) {
  if (watch_limits_ == nullptr) return WatchSlot();
  // The tenant budget a stream counts against besides its identity's: a
  // scheduler's or viewer's tenants (several: the set of them); a worker
  // token's job's tenant (looked up: every job of a tenant shares its
  // budget); a principal of no tenant (admin) its own (empty here).
  std::string tenant;
  if (authorizer_->ScopedToTenants(p)) {
    std::vector<std::string> tenants = p.tenants;
    std::sort(tenants.begin(), tenants.end());
    tenant = absl::StrJoin(tenants, ",");
  } else if (p.role == Role::kWorker) {
    v1::GetJobRequest request;
    request.set_job_id(p.job_id);
    absl::StatusOr<v1::Job> job = api_->GetJob(request);
    if (!job.ok()) return job.status();
    tenant = job->tenant();
  }
  return watch_limits_->Acquire(p.name, tenant, method);
}

grpc::Status CoordinatorServiceImpl::RegisterJob(grpc::ServerContext* context,
                                                 const v1::RegisterJobRequest* request,
                                                 v1::RegisterJobResponse* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "RegisterJob", *request, "", [&](const Principal& p) {
        if (absl::Status s =
                authorizer_->AuthorizeTenant(p, "RegisterJob", request->spec().tenant());
            !s.ok()) {
          return s;
        }
        if (absl::Status s =
                Unwrap(api_->RegisterJob(*request, KeysOf(*authorizer_, p)), reply);
            !s.ok()) {
          return s;
        }
        if (secrets_ == nullptr) return absl::OkStatus();
        absl::StatusOr<std::string> token = secrets_->WorkerToken(reply->job().id());
        if (!token.ok()) return token.status();
        reply->set_worker_token(*std::move(token));
        return absl::OkStatus();
      });
}

grpc::Status CoordinatorServiceImpl::GetJob(grpc::ServerContext* context,
                                            const v1::GetJobRequest* request, v1::Job* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "GetJob", *request, "", [&](const Principal& p) {
        if (absl::Status s = Unwrap(api_->GetJob(*request), reply); !s.ok()) return s;
        std::vector<std::string> hosts;
        for (const v1::DeviceSlot& slot : planner::ExpandPlacement(reply->layout().placement())) {
          hosts.push_back(slot.host());
        }
        absl::Status allowed =
            authorizer_->AuthorizeJob(p, "GetJob", reply->id(), reply->tenant(), hosts);
        if (!allowed.ok()) {
          reply->Clear();
          return allowed;
        }
        // Agents check workers' tokens against it (docs/security.md).
        if (secrets_ != nullptr && (p.role == Role::kAgent || p.role == Role::kAdmin)) {
          absl::StatusOr<std::string> sha = secrets_->WorkerTokenSha256(reply->id());
          if (!sha.ok()) return sha.status();
          reply->set_worker_token_sha256(*std::move(sha));
        }
        return absl::OkStatus();
      });
}

grpc::Status CoordinatorServiceImpl::ListJobs(grpc::ServerContext* context,
                                              const v1::ListJobsRequest* request,
                                              v1::ListJobsResponse* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "ListJobs", *request, "", [&](const Principal& p) {
        v1::ListJobsRequest scoped = *request;
        // A caller of one tenant lists that tenant; one of several names it.
        if (scoped.tenant().empty() && authorizer_->ScopedToTenants(p) && p.tenants.size() == 1) {
          scoped.set_tenant(p.tenants.front());
        }
        if (scoped.tenant().empty() && authorizer_->ScopedToTenants(p)) {
          return absl::PermissionDeniedError(
              absl::StrCat("ListJobs of every tenant refused to \"", p.name,
                           "\": name one of its tenants in `tenant`"));
        }
        if (absl::Status s = authorizer_->AuthorizeTenant(p, "ListJobs", scoped.tenant());
            !s.ok()) {
          return s;
        }
        return Unwrap(api_->ListJobs(scoped), reply);
      });
}

grpc::Status CoordinatorServiceImpl::DeleteJob(grpc::ServerContext* context,
                                               const v1::DeleteJobRequest* request,
                                               v1::DeleteJobResponse* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "DeleteJob", *request, "",
                     [&](const Principal& p) {
                       if (absl::Status s = InJobTenant(p, "DeleteJob", request->job_id()); !s.ok())
                         return s;
                       return Unwrap(api_->DeleteJob(*request, KeysOf(*authorizer_, p)), reply);
                     });
}

grpc::Status CoordinatorServiceImpl::Resize(grpc::ServerContext* context,
                                            const v1::ResizeRequest* request,
                                            v1::Operation* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "Resize", *request, "",
                     [&](const Principal& p) {
                       if (absl::Status s = InJobTenant(p, "Resize", request->job_id()); !s.ok())
                         return s;
                       return Unwrap(api_->Resize(*request, KeysOf(*authorizer_, p)), reply);
                     });
}

grpc::Status CoordinatorServiceImpl::Checkpoint(grpc::ServerContext* context,
                                                const v1::CheckpointRequest* request,
                                                v1::Operation* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "Checkpoint", *request, "", [&](const Principal& p) {
        if (absl::Status s = InJobTenant(p, "Checkpoint", request->job_id()); !s.ok()) return s;
        return Unwrap(api_->Checkpoint(*request, KeysOf(*authorizer_, p)), reply);
      });
}

grpc::Status CoordinatorServiceImpl::Migrate(grpc::ServerContext* context,
                                             const v1::MigrateRequest* request,
                                             v1::Operation* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "Migrate", *request, "",
                     [&](const Principal& p) {
                       if (absl::Status s = InJobTenant(p, "Migrate", request->job_id()); !s.ok())
                         return s;
                       return Unwrap(api_->Migrate(*request, KeysOf(*authorizer_, p)), reply);
                     });
}

grpc::Status CoordinatorServiceImpl::RecoverFromFailure(
    grpc::ServerContext* context, const v1::RecoverFromFailureRequest* request,
    v1::Operation* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "RecoverFromFailure", *request, "", [&](const Principal& p) {
        if (absl::Status s = InJobTenant(p, "RecoverFromFailure", request->job_id()); !s.ok()) {
          return s;
        }
        return Unwrap(api_->RecoverFromFailure(*request, KeysOf(*authorizer_, p)), reply);
      });
}

grpc::Status CoordinatorServiceImpl::MarkPrepared(grpc::ServerContext* context,
                                                  const v1::MarkPreparedRequest* request,
                                                  v1::Operation* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "MarkPrepared", *request, "", [&](const Principal& p) {
        if (absl::Status s = InOperationTenant(p, "MarkPrepared", request->operation_id());
            !s.ok()) {
          return s;
        }
        return Unwrap(api_->MarkPrepared(*request), reply);
      });
}

grpc::Status CoordinatorServiceImpl::PreviewPlan(grpc::ServerContext* context,
                                                 const v1::PreviewPlanRequest* request,
                                                 v1::PreviewPlanResponse* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "PreviewPlan", *request, "", [&](const Principal& p) {
        if (absl::Status s = InJobTenant(p, "PreviewPlan", request->job_id()); !s.ok()) return s;
        return Unwrap(api_->PreviewPlan(*request), reply);
      });
}

grpc::Status CoordinatorServiceImpl::GetOperation(grpc::ServerContext* context,
                                                  const v1::GetOperationRequest* request,
                                                  v1::Operation* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "GetOperation", *request, "", [&](const Principal& p) {
        if (absl::Status s = InOperationTenant(p, "GetOperation", request->operation_id());
            !s.ok()) {
          return s;
        }
        return Unwrap(api_->GetOperation(*request), reply);
      });
}

namespace {

// A watch stream's admission on the feed's workers (watch_reactor.h):
// RunAdmitted (authentication, the method table, metrics), then `admit`
// (the request's checks, the slot, the tenant), which returns what to watch.
template <typename Msg, typename Request, typename AdmitFn>
grpc::ServerWriteReactor<Msg>* StartWatch(ChangeFeed* feed, KeyFeed<Msg>* key_feed,
                                          typename WatchReactor<Msg>::Final final,
                                          const Authorizer* authorizer,
                                          grpc::CallbackServerContext* context,
                                          CoordinatorMetrics* metrics, const char* method,
                                          const Request* request, AdmitFn admit) {
  using Admission = typename WatchReactor<Msg>::Admission;
  return WatchReactor<Msg>::Start(
      feed, key_feed, final,
      [=]() -> absl::StatusOr<Admission> {
        absl::StatusOr<Admission> admission =
            absl::InternalError(absl::StrCat(method, ": not admitted"));
        const grpc::Status admitted = RunAdmitted(
            authorizer, context, metrics, method, *request, "", [&](const Principal& p) {
              admission = admit(p);
              return admission.status();
            });
        if (!admitted.ok()) return rpc::FromGrpc(admitted);
        return admission;
      });
}

bool OperationIsFinal(const v1::Operation& op) { return IsFinal(op.state()); }

// A watch resumes from a version the watcher saw: one beyond the current is
// a client's mistake (a version of another job, or made up), which would
// otherwise wait silently until the job caught up.
absl::Status CheckFromVersion(const char* what, const std::string& id, int64_t from_version,
                              int64_t current) {
  if (from_version > current) {
    return absl::InvalidArgumentError(absl::StrCat(
        "from_version ", from_version, " is beyond ", what, " \"", id, "\"'s current version ",
        current, ": resume from a version this watch delivered (0: from now)"));
  }
  return absl::OkStatus();
}

}  // namespace

grpc::ServerWriteReactor<v1::Operation>* CoordinatorServiceImpl::WatchOperation(
    grpc::CallbackServerContext* context, const v1::WatchOperationRequest* request) {
  using Admission = WatchReactor<v1::Operation>::Admission;
  return StartWatch<v1::Operation>(
      feed_, &feed_->operations(), &OperationIsFinal, authorizer_, context, metrics_,
      "WatchOperation", request, [this, request](const Principal& p) -> absl::StatusOr<Admission> {
        const std::string& id = request->operation_id();
        if (absl::Status s = RequireNonEmpty("operation_id", id); !s.ok()) return s;
        // The slot first: a refused stream costs no database read. It is
        // held until the stream's reactor is deleted, however it ends.
        absl::StatusOr<WatchSlot> slot = AcquireWatch(p, "WatchOperation");
        if (!slot.ok()) return slot.status();
        if (request->from_version() == 0) {
          if (absl::Status s = InOperationTenant(p, "WatchOperation", id); !s.ok()) return s;
          return Admission{id, 0, *std::move(slot)};
        }
        // A resumed watch: one read serves the tenant and the version checks.
        v1::GetOperationRequest get;
        get.set_operation_id(id);
        absl::StatusOr<v1::Operation> op = api_->GetOperation(get);
        if (absl::Status s = InOperationTenant(p, "WatchOperation", id, op.ok() ? &*op : nullptr);
            !s.ok()) {
          return s;
        }
        if (!op.ok()) return op.status();
        if (absl::Status s =
                CheckFromVersion("operation", id, request->from_version(), op->version());
            !s.ok()) {
          return s;
        }
        return Admission{id, request->from_version(), *std::move(slot)};
      });
}

grpc::ServerWriteReactor<v1::Job>* CoordinatorServiceImpl::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  using Admission = WatchReactor<v1::Job>::Admission;
  return StartWatch<v1::Job>(
      feed_, &feed_->jobs(), nullptr, authorizer_, context, metrics_, "WatchJob", request,
      [this, request](const Principal& p) -> absl::StatusOr<Admission> {
        const std::string& id = request->job_id();
        if (absl::Status s = RequireNonEmpty("job_id", id); !s.ok()) return s;
        absl::StatusOr<WatchSlot> slot = AcquireWatch(p, "WatchJob");  // as WatchOperation
        if (!slot.ok()) return slot.status();
        if (request->from_version() == 0) {
          if (absl::Status s = InJobTenant(p, "WatchJob", id); !s.ok()) return s;
          return Admission{id, 0, *std::move(slot)};
        }
        // A resumed watch: one read serves the tenant and the version checks.
        v1::GetJobRequest get;
        get.set_job_id(id);
        absl::StatusOr<v1::Job> job = api_->GetJob(get);
        if (absl::Status s = InJobTenant(p, "WatchJob", id, job.ok() ? &*job : nullptr); !s.ok()) {
          return s;
        }
        if (!job.ok()) return job.status();
        if (absl::Status s = CheckFromVersion("job", id, request->from_version(), job->version());
            !s.ok()) {
          return s;
        }
        return Admission{id, request->from_version(), *std::move(slot)};
      });
}

grpc::Status CoordinatorServiceImpl::CancelOperation(grpc::ServerContext* context,
                                                     const v1::CancelOperationRequest* request,
                                                     v1::Operation* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "CancelOperation", *request, "", [&](const Principal& p) {
        if (absl::Status s = InOperationTenant(p, "CancelOperation", request->operation_id());
            !s.ok()) {
          return s;
        }
        return Unwrap(api_->CancelOperation(*request, KeysOf(*authorizer_, p)), reply);
      });
}

grpc::Status CoordinatorServiceImpl::ListHosts(grpc::ServerContext* context,
                                               const v1::ListHostsRequest* request,
                                               v1::ListHostsResponse* reply) {
  // Hosts are shared by every tenant: any scheduler or viewer may list them.
  return RunAdmitted(authorizer_, context, metrics_, "ListHosts", *request, "",
                     [&](const Principal&) { return Unwrap(api_->ListHosts(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::SetPolicy(grpc::ServerContext* context,
                                               const v1::SetPolicyRequest* request,
                                               v1::Job* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "SetPolicy", *request, "", [&](const Principal& p) {
        if (absl::Status s = InJobTenant(p, "SetPolicy", request->job_id()); !s.ok()) {
          return s;
        }
        return Unwrap(api_->SetPolicy(*request), reply);
      });
}

grpc::Status CoordinatorServiceImpl::NoticeHost(grpc::ServerContext* context,
                                                const v1::NoticeHostRequest* request,
                                                v1::NoticeHostResponse* reply) {
  // Admin only (auth.cc): it moves the jobs of every tenant on the host.
  return RunAdmitted(authorizer_, context, metrics_, "NoticeHost", *request, "",
                     [&](const Principal& p) {
                       return Unwrap(api_->NoticeHost(*request, KeysOf(*authorizer_, p)), reply);
                     });
}

grpc::Status CoordinatorServiceImpl::ListAudit(grpc::ServerContext* context,
                                               const v1::ListAuditRequest* request,
                                               v1::ListAuditResponse* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "ListAudit", *request, "",
      [&](const Principal& p) -> absl::Status {
        if (authorizer_->audit() == nullptr) {
          return absl::UnimplementedError("ListAudit: no audit trail is kept");
        }
        // A scheduler or viewer sees its tenants' entries.
        std::vector<std::string> tenants;
        if (authorizer_->ScopedToTenants(p)) tenants = p.tenants;
        if (!request->tenant().empty()) {
          if (absl::Status s = authorizer_->AuthorizeTenant(p, "ListAudit", request->tenant());
              !s.ok()) {
            return s;
          }
        }
        return Unwrap(authorizer_->audit()->List(*request, tenants), reply);
      });
}

grpc::Status CoordinatorServiceImpl::CommitStep(grpc::ServerContext* context,
                                                const v1::CommitStepRequest* request,
                                                v1::DatasetState* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "CommitStep", *request, "", [&](const Principal& p) {
        if (absl::Status s = InJobTenant(p, "CommitStep", request->job_id()); !s.ok()) return s;
        return Unwrap(api_->CommitStep(*request), reply);
      });
}

grpc::Status CoordinatorServiceImpl::GetWorkerToken(grpc::ServerContext* context,
                                                    const v1::GetWorkerTokenRequest* request,
                                                    v1::GetWorkerTokenResponse* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "GetWorkerToken", *request, "",
      [&](const Principal& p) -> absl::Status {
        if (secrets_ == nullptr) {
          return absl::UnimplementedError("GetWorkerToken: this coordinator has no worker tokens");
        }
        if (request->job_id().empty()) return absl::InvalidArgumentError("job_id is empty");
        v1::GetJobRequest get;
        get.set_job_id(request->job_id());
        absl::StatusOr<v1::Job> job = api_->GetJob(get);
        if (!job.ok()) return job.status();
        if (absl::Status s =
                authorizer_->AuthorizeJob(p, "GetWorkerToken", job->id(), job->tenant(), {});
            !s.ok()) {
          return s;
        }
        absl::StatusOr<std::string> token = secrets_->WorkerToken(job->id());
        if (!token.ok()) return token.status();
        reply->set_job_id(job->id());
        reply->set_worker_token(*std::move(token));
        return absl::OkStatus();
      });
}

grpc::Status CoordinatorServiceImpl::ReportRankFailure(
    grpc::ServerContext* context, const v1::ReportRankFailureRequest* request,
    v1::RankFailure* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "ReportRankFailure", *request, "", [&](const Principal& p) {
        if (absl::Status s = InJobTenant(p, "ReportRankFailure", request->job_id()); !s.ok()) {
          return s;
        }
        return Unwrap(api_->ReportRankFailure(*request, p.name), reply);
      });
}

grpc::Status CoordinatorServiceImpl::Advise(grpc::ServerContext* context,
                                            const v1::AdviseRequest* request,
                                            v1::AdviseResponse* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "Advise", *request, "",
                     [&](const Principal& p) {
                       if (absl::Status s = InJobTenant(p, "Advise", request->job_id()); !s.ok())
                         return s;
                       return Unwrap(api_->Advise(*request), reply);
                     });
}

}  // namespace reshard::coordinator
