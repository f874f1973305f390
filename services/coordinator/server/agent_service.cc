#include "services/coordinator/server/agent_service.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <utility>

#include "common/rpc/status.h"
#include "services/coordinator/logic/request_checks.h"
#include "services/coordinator/server/rpc_status.h"
#include "services/coordinator/store/call_class.h"

namespace reshard::coordinator {

namespace {

// A callback handler's end: what RunRpc records for a synchronous one.
void RecordRpc(CoordinatorMetrics* metrics, const char* method, const absl::Status& status,
               std::chrono::steady_clock::time_point start) {
  if (metrics == nullptr) return;
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  metrics->RpcDone(method, rpc::CodeName(status.code()), seconds.count());
}

}  // namespace

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

grpc::ServerUnaryReactor* AgentServiceImpl::Heartbeat(grpc::CallbackServerContext* context,
                                                      const v1::HeartbeatRequest* request,
                                                      v1::HeartbeatResponse* reply) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const auto start = std::chrono::steady_clock::now();
  auto answer = [this, reactor, start](const absl::Status& status) {
    RecordRpc(metrics_, "Heartbeat", status, start);
    reactor->Finish(ToGrpcStatus(status));
  };
  // Admission may read tokens from the store: on a worker, not on gRPC's thread.
  waits_.Post([this, context, request, reply, answer] {
    const grpc::Status admitted =
        RunAdmitted(authorizer_, context, /*metrics=*/nullptr, "Heartbeat", *request,
                    request->host_id(), [](const Principal&) { return absl::OkStatus(); });
    if (!admitted.ok()) return answer(rpc::FromGrpc(admitted));
    heartbeats_.Submit(*request, [reply, answer](HeartbeatBatcher::Answer result) {
      answer(Unwrap(std::move(result), reply));
    });
  });
  return reactor;
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

// One WaitForTasks call. Its admission (which may read tokens from the
// store) and its store reads run on TaskWaits' workers, never on gRPC's
// callback threads. It deletes itself once gRPC is done with it (OnDone)
// and the worker that started it has let go of it, whichever comes last.
class AgentServiceImpl::WaitReactor final : public grpc::ServerUnaryReactor {
 public:
  WaitReactor(AgentServiceImpl* service, grpc::CallbackServerContext* context,
              const v1::WaitForTasksRequest* request, v1::WaitForTasksResponse* reply)
      : service_(service), context_(context), request_(request), reply_(reply) {}

  /// On a worker: admits the call and starts its poll.
  void Begin() {
    bool cancelled;
    {
      std::lock_guard<std::mutex> l(mu_);
      cancelled = cancelled_;
    }
    if (cancelled) {
      Answer(absl::CancelledError("WaitForTasks: the call was cancelled"));
      return Release();
    }
    const grpc::Status admitted =
        RunAdmitted(service_->authorizer_, context_, /*metrics=*/nullptr, "WaitForTasks",
                    *request_, request_->host_id(), [](const Principal&) { return absl::OkStatus(); });
    if (!admitted.ok()) {
      Answer(rpc::FromGrpc(admitted));
      return Release();
    }
    // `done` may run (and gRPC be done with this call) before Start returns.
    const uint64_t id = service_->waits_.Start(*request_, [this](TaskWaits::Answer answer) {
      Answer(Unwrap(std::move(answer), reply_));
    });
    {
      std::lock_guard<std::mutex> l(mu_);
      poll_ = id;
      cancelled = cancelled_;
    }
    if (cancelled) service_->waits_.Cancel(id);
    Release();
  }

  void OnCancel() override {
    uint64_t poll;
    {
      std::lock_guard<std::mutex> l(mu_);
      cancelled_ = true;
      poll = poll_;
    }
    if (poll != 0) service_->waits_.Cancel(poll);  // answers once, if it still waits
  }

  void OnDone() override { Release(); }

 private:
  void Answer(const absl::Status& status) {
    RecordRpc(service_->metrics_, "WaitForTasks", status, start_);
    Finish(ToGrpcStatus(status));
  }

  void Release() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  AgentServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  const v1::WaitForTasksRequest* const request_;
  v1::WaitForTasksResponse* const reply_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::atomic<int> refs_{2};  // gRPC's (OnDone) and Begin's
  std::mutex mu_;
  bool cancelled_ = false;
  uint64_t poll_ = 0;
};

grpc::ServerUnaryReactor* AgentServiceImpl::WaitForTasks(grpc::CallbackServerContext* context,
                                                         const v1::WaitForTasksRequest* request,
                                                         v1::WaitForTasksResponse* reply) {
  auto* reactor = new WaitReactor(this, context, request, reply);
  waits_.Post([reactor] { reactor->Begin(); });
  return reactor;
}

}  // namespace reshard::coordinator
