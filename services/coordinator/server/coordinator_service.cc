#include "services/coordinator/server/coordinator_service.h"

#include "planner/layout.h"
#include "services/coordinator/server/rpc_status.h"

namespace reshard::coordinator {

grpc::Status CoordinatorServiceImpl::RegisterJob(grpc::ServerContext* context,
                                                 const v1::RegisterJobRequest* request,
                                                 v1::RegisterJobResponse* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "RegisterJob", "",
                     [&](const Principal&) { return Unwrap(api_->RegisterJob(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::GetJob(grpc::ServerContext* context,
                                            const v1::GetJobRequest* request, v1::Job* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "GetJob", "", [&](const Principal& p) {
    if (absl::Status s = Unwrap(api_->GetJob(*request), reply); !s.ok()) return s;
    std::vector<std::string> hosts;
    for (const v1::DeviceSlot& slot : planner::ExpandPlacement(reply->layout().placement())) {
      hosts.push_back(slot.host());
    }
    absl::Status allowed =
        authorizer_->AuthorizeJob(p, "GetJob", reply->id(), reply->tenant(), hosts);
    if (!allowed.ok()) reply->Clear();
    return allowed;
  });
}

grpc::Status CoordinatorServiceImpl::ListJobs(grpc::ServerContext* context,
                                              const v1::ListJobsRequest* request,
                                              v1::ListJobsResponse* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "ListJobs", "",
                     [&](const Principal&) { return Unwrap(api_->ListJobs(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::DeleteJob(grpc::ServerContext* context,
                                               const v1::DeleteJobRequest* request,
                                               v1::DeleteJobResponse* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "DeleteJob", "",
                     [&](const Principal&) { return Unwrap(api_->DeleteJob(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::Resize(grpc::ServerContext* context,
                                            const v1::ResizeRequest* request,
                                            v1::Operation* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "Resize", "",
                     [&](const Principal&) { return Unwrap(api_->Resize(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::Migrate(grpc::ServerContext* context,
                                             const v1::MigrateRequest* request,
                                             v1::Operation* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "Migrate", "",
                     [&](const Principal&) { return Unwrap(api_->Migrate(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::RecoverFromFailure(
    grpc::ServerContext* context, const v1::RecoverFromFailureRequest* request,
    v1::Operation* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "RecoverFromFailure", "",
      [&](const Principal&) { return Unwrap(api_->RecoverFromFailure(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::PreviewPlan(grpc::ServerContext* context,
                                                 const v1::PreviewPlanRequest* request,
                                                 v1::PreviewPlanResponse* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "PreviewPlan", "",
                     [&](const Principal&) { return Unwrap(api_->PreviewPlan(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::GetOperation(grpc::ServerContext* context,
                                                  const v1::GetOperationRequest* request,
                                                  v1::Operation* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "GetOperation", "",
                     [&](const Principal&) { return Unwrap(api_->GetOperation(*request), reply); });
}

grpc::Status CoordinatorServiceImpl::WatchOperation(grpc::ServerContext* context,
                                                    const v1::WatchOperationRequest* request,
                                                    grpc::ServerWriter<v1::Operation>* writer) {
  return RunAdmitted(authorizer_, context, metrics_, "WatchOperation", "", [&](const Principal&) {
    return api_->WatchOperation(
        *request, [writer](const v1::Operation& op) { return writer->Write(op); },
        [this, context] { return stopping_.load() || context->IsCancelled(); });
  });
}

grpc::Status CoordinatorServiceImpl::CancelOperation(grpc::ServerContext* context,
                                                     const v1::CancelOperationRequest* request,
                                                     v1::Operation* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "CancelOperation", "", [&](const Principal&) {
    return Unwrap(api_->CancelOperation(*request), reply);
  });
}

grpc::Status CoordinatorServiceImpl::ListHosts(grpc::ServerContext* context,
                                               const v1::ListHostsRequest* request,
                                               v1::ListHostsResponse* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "ListHosts", "",
                     [&](const Principal&) { return Unwrap(api_->ListHosts(*request), reply); });
}

}  // namespace reshard::coordinator
