#include "services/coordinator/server/coordinator_service.h"

#include "services/coordinator/server/rpc_status.h"

namespace reshard::coordinator {

grpc::Status CoordinatorServiceImpl::RegisterJob(grpc::ServerContext*,
                                                 const v1::RegisterJobRequest* request,
                                                 v1::RegisterJobResponse* reply) {
  return RunRpc(metrics_, "RegisterJob",
                [&] { return Unwrap(api_->RegisterJob(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                                            v1::Job* reply) {
  return RunRpc(metrics_, "GetJob", [&] { return Unwrap(api_->GetJob(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::ListJobs(grpc::ServerContext*,
                                              const v1::ListJobsRequest* request,
                                              v1::ListJobsResponse* reply) {
  return RunRpc(metrics_, "ListJobs", [&] { return Unwrap(api_->ListJobs(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::DeleteJob(grpc::ServerContext*,
                                               const v1::DeleteJobRequest* request,
                                               v1::DeleteJobResponse* reply) {
  return RunRpc(metrics_, "DeleteJob", [&] { return Unwrap(api_->DeleteJob(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::Resize(grpc::ServerContext*, const v1::ResizeRequest* request,
                                            v1::Operation* reply) {
  return RunRpc(metrics_, "Resize", [&] { return Unwrap(api_->Resize(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::Migrate(grpc::ServerContext*,
                                             const v1::MigrateRequest* request,
                                             v1::Operation* reply) {
  return RunRpc(metrics_, "Migrate", [&] { return Unwrap(api_->Migrate(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::RecoverFromFailure(
    grpc::ServerContext*, const v1::RecoverFromFailureRequest* request, v1::Operation* reply) {
  return RunRpc(metrics_, "RecoverFromFailure",
                [&] { return Unwrap(api_->RecoverFromFailure(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::PreviewPlan(grpc::ServerContext*,
                                                 const v1::PreviewPlanRequest* request,
                                                 v1::PreviewPlanResponse* reply) {
  return RunRpc(metrics_, "PreviewPlan",
                [&] { return Unwrap(api_->PreviewPlan(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::GetOperation(grpc::ServerContext*,
                                                  const v1::GetOperationRequest* request,
                                                  v1::Operation* reply) {
  return RunRpc(metrics_, "GetOperation",
                [&] { return Unwrap(api_->GetOperation(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::WatchOperation(grpc::ServerContext* context,
                                                    const v1::WatchOperationRequest* request,
                                                    grpc::ServerWriter<v1::Operation>* writer) {
  return RunRpc(metrics_, "WatchOperation", [&] {
    return api_->WatchOperation(
        *request, [writer](const v1::Operation& op) { return writer->Write(op); },
        [this, context] { return stopping_.load() || context->IsCancelled(); });
  });
}

grpc::Status CoordinatorServiceImpl::CancelOperation(grpc::ServerContext*,
                                                     const v1::CancelOperationRequest* request,
                                                     v1::Operation* reply) {
  return RunRpc(metrics_, "CancelOperation",
                [&] { return Unwrap(api_->CancelOperation(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::ListHosts(grpc::ServerContext*,
                                               const v1::ListHostsRequest* request,
                                               v1::ListHostsResponse* reply) {
  return RunRpc(metrics_, "ListHosts", [&] { return Unwrap(api_->ListHosts(*request), reply); });
}

}  // namespace reshard::coordinator
