// gRPC adapter for CoordinatorService (what schedulers call): each handler
// turns the request into a SchedulerApi call and its status into the reply.
// Each call passes the Authorizer (auth.h) first; every other code is
// decided by SchedulerApi.
// Thread-safe (the API is); BeginShutdown() may be called from any thread.
#pragma once

#include "reshard/v1/coordinator.grpc.pb.h"
#include "services/coordinator/logic/change_feed.h"
#include "services/coordinator/logic/cluster_secrets.h"
#include "services/coordinator/logic/scheduler_api.h"
#include "services/coordinator/metrics/metrics.h"
#include "services/coordinator/server/auth.h"
#include "services/coordinator/server/stream_limits.h"

namespace reshard::coordinator {

// WatchJob and WatchOperation run on gRPC's callback API (watch_reactor.h):
// an open stream holds no thread, only its subscription to the change feed.
using CoordinatorServiceBase = v1::CoordinatorService::WithCallbackMethod_WatchJob<
    v1::CoordinatorService::WithCallbackMethod_WatchOperation<v1::CoordinatorService::Service>>;

class CoordinatorServiceImpl final : public CoordinatorServiceBase {
 public:
  /// `api`, `authorizer` and `feed` must outlive this; `metrics` may be
  /// null; `secrets` (may be null: no worker tokens, GetWorkerToken is
  /// UNIMPLEMENTED) derives worker tokens; `watch_limits` (may be null: no
  /// limit) bounds the open WatchJob and WatchOperation streams. Shutting
  /// `feed` down ends the open watch streams (UNAVAILABLE).
  CoordinatorServiceImpl(SchedulerApi* api, const Authorizer* authorizer,
                         CoordinatorMetrics* metrics, ChangeFeed* feed,
                         ClusterSecrets* secrets = nullptr,
                         WatchStreamLimits* watch_limits = nullptr)
      : api_(api),
        authorizer_(authorizer),
        metrics_(metrics),
        feed_(feed),
        secrets_(secrets),
        watch_limits_(watch_limits) {}

  grpc::Status RegisterJob(grpc::ServerContext* context, const v1::RegisterJobRequest* request,
                           v1::RegisterJobResponse* reply) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* reply) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* reply) override;
  grpc::Status DeleteJob(grpc::ServerContext* context, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* reply) override;
  grpc::Status Resize(grpc::ServerContext* context, const v1::ResizeRequest* request,
                      v1::Operation* reply) override;
  grpc::Status Migrate(grpc::ServerContext* context, const v1::MigrateRequest* request,
                       v1::Operation* reply) override;
  grpc::Status RecoverFromFailure(grpc::ServerContext* context,
                                  const v1::RecoverFromFailureRequest* request,
                                  v1::Operation* reply) override;
  grpc::Status Checkpoint(grpc::ServerContext* context, const v1::CheckpointRequest* request,
                          v1::Operation* reply) override;
  grpc::Status MarkPrepared(grpc::ServerContext* context, const v1::MarkPreparedRequest* request,
                            v1::Operation* reply) override;
  grpc::Status PreviewPlan(grpc::ServerContext* context, const v1::PreviewPlanRequest* request,
                           v1::PreviewPlanResponse* reply) override;
  grpc::Status GetOperation(grpc::ServerContext* context, const v1::GetOperationRequest* request,
                            v1::Operation* reply) override;
  grpc::ServerWriteReactor<v1::Operation>* WatchOperation(
      grpc::CallbackServerContext* context, const v1::WatchOperationRequest* request) override;
  grpc::ServerWriteReactor<v1::Job>* WatchJob(grpc::CallbackServerContext* context,
                                              const v1::WatchJobRequest* request) override;
  grpc::Status CancelOperation(grpc::ServerContext* context,
                               const v1::CancelOperationRequest* request,
                               v1::Operation* reply) override;
  grpc::Status ListHosts(grpc::ServerContext* context, const v1::ListHostsRequest* request,
                         v1::ListHostsResponse* reply) override;
  grpc::Status NoticeHost(grpc::ServerContext* context, const v1::NoticeHostRequest* request,
                          v1::NoticeHostResponse* reply) override;
  grpc::Status SetPolicy(grpc::ServerContext* context, const v1::SetPolicyRequest* request,
                         v1::Job* reply) override;
  grpc::Status ListAudit(grpc::ServerContext* context, const v1::ListAuditRequest* request,
                         v1::ListAuditResponse* reply) override;
  grpc::Status CommitStep(grpc::ServerContext* context, const v1::CommitStepRequest* request,
                          v1::DatasetState* reply) override;
  grpc::Status GetWorkerToken(grpc::ServerContext* context,
                              const v1::GetWorkerTokenRequest* request,
                              v1::GetWorkerTokenResponse* reply) override;
  grpc::Status Advise(grpc::ServerContext* context, const v1::AdviseRequest* request,
                      v1::AdviseResponse* reply) override;
  grpc::Status ReportRankFailure(grpc::ServerContext* context,
                                 const v1::ReportRankFailureRequest* request,
                                 v1::RankFailure* reply) override;

 private:
  SchedulerApi* api_;
  /// A scheduler's or viewer's call on job `job_id` / operation
  /// `operation_id` stays within its tenants, a worker's on the job of its
  /// token (Authorizer::AuthorizeJob); others pass. A missing job or
  /// operation passes: the call answers it. `read`: the job (operation)
  /// as the caller already read it, so that it is not read again.
  absl::Status InJobTenant(const Principal& p, const char* method, const std::string& job_id,
                           const v1::Job* read = nullptr) const;
  absl::Status InOperationTenant(const Principal& p, const char* method,
                                 const std::string& operation_id,
                                 const v1::Operation* read = nullptr) const;
  /// A slot for one more watch stream of `p` (WatchStreamLimits::Acquire);
  /// an empty slot when there is no limit.
  absl::StatusOr<WatchSlot> AcquireWatch(const Principal& p, const char* method);

  const Authorizer* authorizer_;
  CoordinatorMetrics* metrics_;
  ChangeFeed* feed_;
  ClusterSecrets* secrets_;
  WatchStreamLimits* watch_limits_;
};

}  // namespace reshard::coordinator
