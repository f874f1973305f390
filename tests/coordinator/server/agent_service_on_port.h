// An AgentServiceImpl served by a gRPC server in the test's own process, on
// 127.0.0.1 port 0 without TLS, and a stub connected to it: for tests that
// count the process's threads or call AgentApi beside gRPC.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "reshard/v1/agent.grpc.pb.h"
#include "services/coordinator/server/agent_service.h"

namespace reshard::coordinator::testing {

struct AgentServiceOnPort {
  /// `api` and `authorizer` must outlive it; `server` is null when it could
  /// not start.
  AgentServiceOnPort(AgentApi* api, const Authorizer* authorizer, CoordinatorMetrics* metrics,
                     HeartbeatBatcher::Options heartbeats = {})
      : service(api, authorizer, metrics, heartbeats) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    stub = v1::AgentService::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                         grpc::InsecureChannelCredentials()));
  }
  ~AgentServiceOnPort() {
    if (server != nullptr) server->Shutdown(std::chrono::system_clock::now());
  }

  AgentServiceImpl service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::AgentService::Stub> stub;
};

}  // namespace reshard::coordinator::testing
