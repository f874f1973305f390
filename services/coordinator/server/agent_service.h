// gRPC adapter for AgentService (what host agents call): each handler turns
// the request into an AgentApi call and its status into the reply. Each call
// passes the Authorizer (auth.h) first, with the host the request speaks
// for: an agent speaks only for its own host. WaitForTasks and Heartbeat run
// on gRPC's callback API: a waiting poll holds no thread (TaskWaits), and a
// heartbeat waits for its batch's one store call without one
// (HeartbeatBatcher). Thread-safe (the API is).
#pragma once

#include "reshard/v1/agent.grpc.pb.h"
#include "services/coordinator/logic/agent_api.h"
#include "services/coordinator/logic/heartbeat_batcher.h"
#include "services/coordinator/logic/task_waits.h"
#include "services/coordinator/metrics/metrics.h"
#include "services/coordinator/server/auth.h"

namespace reshard::coordinator {

/// Workers that run WaitForTasks' admission and store reads (TaskWaits).
inline constexpr int kTaskWaitWorkers = 4;

class AgentServiceImpl final
    : public v1::AgentService::WithCallbackMethod_Heartbeat<
          v1::AgentService::WithCallbackMethod_WaitForTasks<v1::AgentService::Service>> {
 public:
  /// `api` and `authorizer` must outlive this; `metrics` may be null.
  /// Destroy it after the gRPC server stopped (its polls answer at the
  /// notifier's Shutdown, or at the latest here).
  AgentServiceImpl(AgentApi* api, const Authorizer* authorizer, CoordinatorMetrics* metrics,
                   HeartbeatBatcher::Options heartbeats = {})
      : api_(api),
        authorizer_(authorizer),
        metrics_(metrics),
        heartbeats_(api, heartbeats),
        waits_(api, kTaskWaitWorkers) {}

  grpc::Status RegisterAgent(grpc::ServerContext* context, const v1::RegisterAgentRequest* request,
                             v1::RegisterAgentResponse* reply) override;
  /// Answered once its batch committed (HeartbeatBatcher).
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* reply) override;
  grpc::Status GetTask(grpc::ServerContext* context, const v1::GetTaskRequest* request,
                       v1::HostTask* reply) override;
  grpc::Status ReportProgress(grpc::ServerContext* context,
                              const v1::ReportProgressRequest* request,
                              v1::ReportProgressResponse* reply) override;
  /// Long poll (AgentApi::WaitForTasks's answer) holding no thread while it
  /// waits; ends with CANCELLED when the client cancels.
  grpc::ServerUnaryReactor* WaitForTasks(grpc::CallbackServerContext* context,
                                         const v1::WaitForTasksRequest* request,
                                         v1::WaitForTasksResponse* reply) override;

  /// WaitForTasks polls waiting now.
  size_t waiting_polls() { return waits_.waiting(); }
  /// Store reads WaitForTasks made (TaskWaits::store_reads).
  uint64_t poll_store_reads() { return waits_.store_reads(); }
  /// Heartbeat batches written so far.
  HeartbeatBatcher::Stats heartbeat_stats() { return heartbeats_.stats(); }
  int64_t heartbeat_lag_ms() { return heartbeats_.LagMs(); }

 private:
  class WaitReactor;

  AgentApi* api_;
  const Authorizer* authorizer_;
  CoordinatorMetrics* metrics_;
  HeartbeatBatcher heartbeats_;
  TaskWaits waits_;  // its workers call heartbeats_: stopped first
};

}  // namespace reshard::coordinator
