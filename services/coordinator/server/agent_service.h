// gRPC adapter for AgentService (what host agents call): each handler turns
// the request into an AgentApi call and its status into the reply. Each call
// passes the Authorizer (auth.h) first, with the host the request speaks
// for: an agent speaks only for its own host. Thread-safe (the API is).
#pragma once

#include "reshard/v1/agent.grpc.pb.h"
#include "services/coordinator/logic/agent_api.h"
#include "services/coordinator/metrics/metrics.h"
#include "services/coordinator/server/auth.h"

namespace reshard::coordinator {

class AgentServiceImpl final : public v1::AgentService::Service {
 public:
  /// `api` and `authorizer` must outlive this; `metrics` may be null.
  AgentServiceImpl(AgentApi* api, const Authorizer* authorizer, CoordinatorMetrics* metrics)
      : api_(api), authorizer_(authorizer), metrics_(metrics) {}

  grpc::Status RegisterAgent(grpc::ServerContext* context, const v1::RegisterAgentRequest* request,
                             v1::RegisterAgentResponse* reply) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* reply) override;
  grpc::Status GetTask(grpc::ServerContext* context, const v1::GetTaskRequest* request,
                       v1::HostTask* reply) override;
  grpc::Status ReportProgress(grpc::ServerContext* context,
                              const v1::ReportProgressRequest* request,
                              v1::ReportProgressResponse* reply) override;
  /// Long poll (AgentApi::WaitForTasks); ends early when the call is
  /// cancelled (the client left, or the server shuts down).
  grpc::Status WaitForTasks(grpc::ServerContext* context, const v1::WaitForTasksRequest* request,
                            v1::WaitForTasksResponse* reply) override;

 private:
  AgentApi* api_;
  const Authorizer* authorizer_;
  CoordinatorMetrics* metrics_;
};

}  // namespace reshard::coordinator
