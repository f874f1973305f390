#include "services/coordinator/server/agent_service.h"

#include "services/coordinator/logic/request_checks.h"
#include "services/coordinator/server/rpc_status.h"

namespace reshard::coordinator {

grpc::Status AgentServiceImpl::RegisterAgent(grpc::ServerContext* context,
                                             const v1::RegisterAgentRequest* request,
                                             v1::RegisterAgentResponse* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "RegisterAgent", *request,
                     request->host().host_id(), [&](const Principal&) {
                       // Field limits first (request_checks.h); AgentApi does the rest.
                       if (absl::Status s = CheckHostFields(request->host()); !s.ok()) return s;
                       return Unwrap(api_->RegisterAgent(*request), reply);
                     });
}

grpc::Status AgentServiceImpl::Heartbeat(grpc::ServerContext* context,
                                         const v1::HeartbeatRequest* request,
                                         v1::HeartbeatResponse* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "Heartbeat", *request, request->host_id(),
                     [&](const Principal&) { return Unwrap(api_->Heartbeat(*request), reply); });
}

grpc::Status AgentServiceImpl::GetTask(grpc::ServerContext* context,
                                       const v1::GetTaskRequest* request, v1::HostTask* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "GetTask", *request, request->host_id(),
                     [&](const Principal&) { return Unwrap(api_->GetTask(*request), reply); });
}

grpc::Status AgentServiceImpl::ReportProgress(grpc::ServerContext* context,
                                              const v1::ReportProgressRequest* request,
                                              v1::ReportProgressResponse* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "ReportProgress", *request, request->host_id(),
      [&](const Principal&) { return Unwrap(api_->ReportProgress(*request), reply); });
}

grpc::Status AgentServiceImpl::WaitForTasks(grpc::ServerContext* context,
                                            const v1::WaitForTasksRequest* request,
                                            v1::WaitForTasksResponse* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "WaitForTasks", *request, request->host_id(),
      [&](const Principal&) {
        return Unwrap(api_->WaitForTasks(*request, [context] { return context->IsCancelled(); }),
                      reply);
      });
}

}  // namespace reshard::coordinator
