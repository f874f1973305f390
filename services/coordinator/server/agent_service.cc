#include "services/coordinator/server/agent_service.h"

#include "services/coordinator/logic/request_checks.h"
#include "services/coordinator/server/rpc_status.h"
#include "services/coordinator/store/call_class.h"

namespace reshard::coordinator {

// Every admitted call's store calls are agent-class: the store keeps
// connections for them that client calls cannot take (call_class.h), so
// heartbeats and progress never wait behind clients. (Authorization itself
// runs as a client call: an unadmitted caller never reaches the reserve.)

grpc::Status AgentServiceImpl::RegisterAgent(grpc::ServerContext* context,
                                             const v1::RegisterAgentRequest* request,
                                             v1::RegisterAgentResponse* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "RegisterAgent", *request,
                     request->host().host_id(), [&](const Principal&) {
                       CallClassScope agent_calls(CallClass::kAgent);
                       // Field limits first (request_checks.h); AgentApi does the rest.
                       if (absl::Status s = CheckHostFields(request->host()); !s.ok()) return s;
                       return Unwrap(api_->RegisterAgent(*request), reply);
                     });
}

grpc::Status AgentServiceImpl::Heartbeat(grpc::ServerContext* context,
                                         const v1::HeartbeatRequest* request,
                                         v1::HeartbeatResponse* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "Heartbeat", *request, request->host_id(),
                     [&](const Principal&) {
                       CallClassScope agent_calls(CallClass::kAgent);
                       return Unwrap(api_->Heartbeat(*request), reply);
                     });
}

grpc::Status AgentServiceImpl::GetTask(grpc::ServerContext* context,
                                       const v1::GetTaskRequest* request, v1::HostTask* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "GetTask", *request, request->host_id(),
                     [&](const Principal&) {
                       CallClassScope agent_calls(CallClass::kAgent);
                       return Unwrap(api_->GetTask(*request), reply);
                     });
}

grpc::Status AgentServiceImpl::ReportProgress(grpc::ServerContext* context,
                                              const v1::ReportProgressRequest* request,
                                              v1::ReportProgressResponse* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "ReportProgress", *request,
                     request->host_id(), [&](const Principal&) {
                       CallClassScope agent_calls(CallClass::kAgent);
                       return Unwrap(api_->ReportProgress(*request), reply);
                     });
}

grpc::Status AgentServiceImpl::WaitForTasks(grpc::ServerContext* context,
                                            const v1::WaitForTasksRequest* request,
                                            v1::WaitForTasksResponse* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "WaitForTasks", *request, request->host_id(),
      [&](const Principal&) {
        CallClassScope agent_calls(CallClass::kAgent);
        return Unwrap(api_->WaitForTasks(*request, [context] { return context->IsCancelled(); }),
                      reply);
      });
}

}  // namespace reshard::coordinator
