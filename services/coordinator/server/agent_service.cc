#include "services/coordinator/server/agent_service.h"

#include "services/coordinator/logic/request_checks.h"
#include "services/coordinator/server/rpc_status.h"

namespace reshard::coordinator {

grpc::Status AgentServiceImpl::RegisterAgent(grpc::ServerContext*,
                                             const v1::RegisterAgentRequest* request,
                                             v1::RegisterAgentResponse* reply) {
  return RunRpc(metrics_, "RegisterAgent", [&] {
    // Field limits first (request_checks.h); AgentApi does the rest.
    if (absl::Status s = CheckHostFields(request->host()); !s.ok()) return s;
    return Unwrap(api_->RegisterAgent(*request), reply);
  });
}

grpc::Status AgentServiceImpl::Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                                         v1::HeartbeatResponse* reply) {
  return RunRpc(metrics_, "Heartbeat", [&] { return Unwrap(api_->Heartbeat(*request), reply); });
}

grpc::Status AgentServiceImpl::GetTask(grpc::ServerContext*, const v1::GetTaskRequest* request,
                                       v1::HostTask* reply) {
  return RunRpc(metrics_, "GetTask", [&] { return Unwrap(api_->GetTask(*request), reply); });
}

grpc::Status AgentServiceImpl::ReportProgress(grpc::ServerContext*,
                                              const v1::ReportProgressRequest* request,
                                              v1::ReportProgressResponse* reply) {
  return RunRpc(metrics_, "ReportProgress",
                [&] { return Unwrap(api_->ReportProgress(*request), reply); });
}

}  // namespace reshard::coordinator
