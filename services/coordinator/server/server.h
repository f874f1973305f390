// One coordinator replica, wired: the PostgreSQL store (schema migrated at
// start-up; a database newer than the binary is refused), SchedulerApi and
// AgentApi behind the gRPC services, the OperationDriver run by the
// LeaderLoop, and the Prometheus /metrics endpoint. Any number of replicas
// may share one database; the leader lock picks the one that drives.
//
// Thread contract: Start() once, from one thread; port(), metrics_port(),
// IsLeader() from any thread after it; Shutdown() is idempotent, may be
// called from any thread, and the destructor calls it.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cost/model.h"
#include "services/coordinator/clock.h"
#include "services/coordinator/server/config.h"

namespace grpc {
class Server;
}
namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace reshard::coordinator {

class AgentApi;
class PolicyEngine;
class AgentServiceImpl;
class AuditApi;
class Authorizer;
class AuthServiceImpl;
class ClusterSecrets;
class TokenApi;
class CoordinatorMetrics;
class WatchStreamLimits;
class CoordinatorServiceImpl;
class LeaderLoop;
class OperationDriver;
class PgStore;
class SchedulerApi;
class Store;
class TaskNotifier;
class PgListener;
class ChangeFeed;

/// Bytes a RegisterJob request may carry beyond the spec (the request's own
/// fields): the gRPC receive limit is max_spec_bytes plus this, at least
/// gRPC's usual 4 MiB, so that a spec just over the limit reaches
/// SchedulerApi (InvalidArgument naming the sizes) and only a far larger
/// message is refused by gRPC itself (RESOURCE_EXHAUSTED).
inline constexpr int64_t kRequestMarginBytes = 1 << 20;

/// The gRPC maximum receive message size for `config`.
int MaxReceiveMessageBytes(const CoordinatorConfig& config);

class CoordinatorServer {
 public:
  explicit CoordinatorServer(CoordinatorConfig config);
  ~CoordinatorServer();

  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  /// Connects to PostgreSQL, applies missing migrations (FailedPrecondition
  /// for a newer schema), builds the logic, starts the gRPC server and the
  /// /metrics endpoint and the leader loop. Unavailable when the database
  /// or an address cannot be reached or bound. On error nothing keeps
  /// running. Call at most once.
  [[nodiscard]] absl::Status Start();

  /// The bound gRPC port (the chosen one when the config asked for 0).
  int port() const { return port_; }
  /// The bound /metrics port.
  int metrics_port() const { return metrics_port_; }
  const CoordinatorConfig& config() const { return config_; }
  /// Whether this replica holds the leader lock now.
  bool IsLeader() const;
  /// `reshard-coordinator listening on H:P metrics on H:M replica ID`: what
  /// main prints once started (tests read the ports from it).
  std::string StartupLine() const;

  /// Stops driving (releases the leader lock), ends open watch streams,
  /// stops the gRPC server (in-flight calls get a short grace period) and
  /// /metrics, and closes the database connections.
  void Shutdown();

 private:
  // Start's phases, in order. ConnectStore returns the store whose health
  // the leader loop watches (owned by store_).
  absl::StatusOr<PgStore*> ConnectStore();
  void MakeApis();
  absl::Status ServeGrpc();
  absl::Status ServeMetrics();
  void StartLeader(PgStore* health_of);

  const CoordinatorConfig config_;
  SystemClock clock_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  // Wakes WaitForTasks (outlives the store, the listener and the services).
  std::unique_ptr<TaskNotifier> task_notifier_;
  std::shared_ptr<Store> store_;
  // Fans committed changes out to the watch streams (outlives the services).
  std::unique_ptr<ChangeFeed> change_feed_;
  // LISTENs for every replica's tasks and changes.
  std::unique_ptr<PgListener> listener_;
  // The cost model the APIs and the driver share (docs/scheduler.md).
  std::unique_ptr<cost::CostModel> cost_model_;
  std::unique_ptr<SchedulerApi> scheduler_api_;
  std::unique_ptr<AgentApi> agent_api_;
  std::unique_ptr<OperationDriver> driver_;
  std::unique_ptr<PolicyEngine> policies_;  // the leader's (elastic policies)
  std::unique_ptr<LeaderLoop> leader_;
  // What AgentApi's final reports kick: leader_ while it runs, else null
  // (read on gRPC threads).
  std::atomic<LeaderLoop*> kick_target_{nullptr};
  std::unique_ptr<TokenApi> token_api_;
  std::unique_ptr<ClusterSecrets> secrets_;
  std::unique_ptr<AuditApi> audit_api_;
  std::unique_ptr<Authorizer> authorizer_;
  std::unique_ptr<AuthServiceImpl> auth_service_;
  // Outlives the services and the gRPC server: open streams hold its slots.
  std::unique_ptr<WatchStreamLimits> watch_limits_;
  std::unique_ptr<CoordinatorServiceImpl> coordinator_service_;
  std::unique_ptr<AgentServiceImpl> agent_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  bool started_ = false;
  int port_ = 0;
  int metrics_port_ = 0;
  std::mutex shutdown_mu_;
  bool shut_down_ = false;
};

}  // namespace reshard::coordinator
