#include "services/coordinator/server/server.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/tls.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/resource_quota.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "services/coordinator/logic/agent_api.h"
#include "services/coordinator/logic/audit_api.h"
#include "services/coordinator/logic/change_feed.h"
#include "services/coordinator/logic/cluster_secrets.h"
#include "services/coordinator/logic/leader.h"
#include "services/coordinator/logic/operation_driver.h"
#include "services/coordinator/logic/policy_engine.h"
#include "services/coordinator/logic/scheduler_api.h"
#include "services/coordinator/logic/task_notifier.h"
#include "services/coordinator/logic/tokens.h"
#include "services/coordinator/metrics/metrics.h"
#include "services/coordinator/server/agent_service.h"
#include "services/coordinator/server/auth.h"
#include "services/coordinator/server/auth_service.h"
#include "services/coordinator/server/coordinator_service.h"
#include "services/coordinator/server/stream_limits.h"
#include "services/coordinator/store/migrator.h"
#include "services/coordinator/store/pg_listener.h"
#include "services/coordinator/store/pg_store.h"

namespace reshard::coordinator {
namespace {

// In-flight calls get this long to finish once Shutdown starts.
constexpr auto kShutdownGrace = std::chrono::seconds(5);

}  // namespace

int MaxReceiveMessageBytes(const CoordinatorConfig& config) {
  const int64_t bytes = std::max<int64_t>(config.max_spec_bytes + kRequestMarginBytes, 4 << 20);
  return static_cast<int>(std::min<int64_t>(bytes, std::numeric_limits<int>::max()));
}

CoordinatorServer::CoordinatorServer(CoordinatorConfig config) : config_(std::move(config)) {}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

absl::Status CoordinatorServer::Start() {
  RESHARD_CHECK(!started_) << "CoordinatorServer::Start called twice";
  started_ = true;
  if (absl::Status s = ValidateConfig(config_); !s.ok()) return s;

  // Schema first: a database newer than this binary is refused untouched.
  if (absl::Status s = Migrate(config_.dsn); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("schema migration: ", s.message()));
  }

  registry_ = std::make_shared<prometheus::Registry>();
  metrics_ = std::make_unique<CoordinatorMetrics>(registry_);
  absl::StatusOr<PgStore*> store = ConnectStore();
  if (!store.ok()) return store.status();
  MakeApis();
  if (absl::Status s = ServeGrpc(); !s.ok()) {
    Shutdown();
    return s;
  }
  if (absl::Status s = ServeMetrics(); !s.ok()) {
    Shutdown();
    return s;
  }
  StartLeader(*store);
  RESHARD_LOG(INFO) << "replica=" << config_.replica_id << " serving gRPC on port " << port_
                    << ", /metrics on port " << metrics_port_ << ", schema version "
                    << LatestKnownSchemaVersion();
  return absl::OkStatus();
}

absl::StatusOr<PgStore*> CoordinatorServer::ConnectStore() {
  PgStoreOptions store_options;
  store_options.dsn = config_.dsn;
  store_options.pool_size = config_.pool_size;
  store_options.agent_reserve = config_.pool_agent_reserve;
  store_options.acquire_timeout_ms = static_cast<int>(config_.store_acquire_timeout_ms);
  store_options.statement_timeout_ms = static_cast<int>(config_.store_statement_timeout_ms);
  store_options.connect_timeout_s = static_cast<int>(config_.store_connect_timeout_s);
  // Silence past a quarter lease is an outage: hosts (heartbeating every
  // third of a lease) are not yet due when it is noticed, and get the lease
  // grace once PostgreSQL answers again (LeaderLoop::WatchStoreHealth).
  store_options.outage_after_ms = static_cast<int>(std::max<int64_t>(config_.lease_ms / 4, 1));
  CoordinatorMetrics* metrics = metrics_.get();
  store_options.observer = [metrics](const std::string& statement, double seconds) {
    metrics->StoreStatement(statement, seconds);
  };
  // Tasks this replica creates wake its long polls directly; other
  // replicas' reach them through NOTIFY (docs/coordinator.md, "Agents are told").
  task_notifier_ = std::make_unique<TaskNotifier>();
  TaskNotifier* notifier = task_notifier_.get();
  store_options.on_tasks_changed = [notifier](const std::vector<std::string>& hosts) {
    for (const std::string& host : hosts) notifier->Notify(host);
  };
  store_options.notify_tasks = config_.notify_tasks;
  absl::StatusOr<std::shared_ptr<PgStore>> store = PgStore::Connect(store_options);
  if (!store.ok()) return store.status();
  PgStore* health_of = store->get();  // lives as long as store_
  store_ = *std::move(store);
  // The change feed: what any replica commits reaches this one's watch
  // streams through one LISTEN connection (docs/coordinator.md, "Change feed").
  ChangeFeed::Options feed_options;
  feed_options.resync_ms = static_cast<int>(config_.watch_resync_ms);
  // A new operation, created through any replica, is planned at once by
  // the leader (its agents learn of their tasks only once it is planned).
  feed_options.on_operation_created = [this](const std::string&) {
    if (LeaderLoop* leader = kick_target_.load(); leader != nullptr) leader->Kick();
  };
  change_feed_ = std::make_unique<ChangeFeed>(store_, feed_options);
  ChangeFeed* feed = change_feed_.get();
  PgListenerOptions listener_options;
  listener_options.dsn = config_.dsn;
  listener_options.connect_timeout_s = static_cast<int>(config_.store_connect_timeout_s);
  listener_options.channels = {kChangesChannel};
  if (config_.notify_tasks) listener_options.channels.push_back(kTasksChannel);
  listener_ = std::make_unique<PgListener>(
      listener_options,
      [notifier, feed](const std::string& channel, const std::string& payload) {
        if (channel == kTasksChannel) {
          notifier->Notify(payload);
        } else {
          feed->Announced(payload);
        }
      },
      [notifier, feed] {
        notifier->NotifyAll();
        feed->Reconnected();
      });
  listener_->Start();
  return health_of;
}

void CoordinatorServer::MakeApis() {
  TaskNotifier* notifier = task_notifier_.get();
  cost::Defaults cost_defaults;
  cost_defaults.link_bytes_per_s = static_cast<double>(config_.cost_link_mbit) * 1e6 / 8;
  cost_defaults.overhead_seconds = static_cast<double>(config_.cost_overhead_ms) / 1000;
  cost_model_ = std::make_unique<cost::CostModel>(cost_defaults);
  SchedulerApi::Options scheduler_options;
  scheduler_options.max_spec_bytes = config_.max_spec_bytes;
  scheduler_options.step_boundary_timeout_ms = config_.step_boundary_timeout_ms;
  scheduler_options.cost = cost_model_.get();
  scheduler_api_ =
      std::make_unique<SchedulerApi>(store_, &clock_, metrics_.get(), scheduler_options);
  secrets_ = std::make_unique<ClusterSecrets>(store_);
  AgentApi::Options agent_options;
  agent_options.lease_ms = config_.lease_ms;
  agent_options.secrets = secrets_.get();
  agent_options.notifier = notifier;
  agent_options.cost = cost_model_.get();
  // A final report wakes the leader's driver (a no-op on other replicas).
  agent_options.on_final_report = [this] {
    if (LeaderLoop* leader = kick_target_.load(); leader != nullptr) leader->Kick();
  };
  agent_api_ = std::make_unique<AgentApi>(store_, &clock_, metrics_.get(), agent_options);
  OperationDriver::Options driver_options;
  driver_options.transfer_timeout_ms = config_.transfer_timeout_ms;
  driver_options.stall_timeout_ms = config_.stall_timeout_ms;
  driver_options.replica_id = config_.replica_id;
  // After a failover, agents get one lease period to find the new leader.
  driver_options.lease_grace_ms = config_.lease_ms;
  driver_options.tick_ms = config_.tick_ms;
  driver_options.cost = cost_model_.get();
  // The agent service is made below, before the leader loop starts.
  driver_options.heartbeat_lag_ms = [this] {
    return agent_service_ != nullptr ? agent_service_->heartbeat_lag_ms() : 0;
  };
  driver_ = std::make_unique<OperationDriver>(store_, &clock_, metrics_.get(), driver_options);
}

absl::Status CoordinatorServer::ServeGrpc() {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(config_.tls);
  if (!credentials.ok()) return credentials.status();
  if (config_.tls.insecure) {
    RESHARD_LOG(WARNING) << "replica=" << config_.replica_id << " --insecure: plaintext gRPC on "
                         << config_.listen
                         << " and NO authentication; anyone who reaches the port is admin";
  }
  token_api_ = std::make_unique<TokenApi>(store_, &clock_);
  audit_api_ = std::make_unique<AuditApi>(store_, AuditApi::Options{});
  authorizer_ = std::make_unique<Authorizer>(config_.tls.insecure, token_api_.get(),
                                             audit_api_.get(), secrets_.get());
  auth_service_ =
      std::make_unique<AuthServiceImpl>(token_api_.get(), authorizer_.get(), metrics_.get());
  WatchStreamLimits::Options watch_options;
  watch_options.max_total = config_.max_watch_streams;
  watch_options.max_per_identity = config_.max_watch_streams_per_identity;
  watch_options.max_per_tenant = WatchTenantBudget(config_);
  watch_limits_ = std::make_unique<WatchStreamLimits>(watch_options, metrics_.get());
  coordinator_service_ = std::make_unique<CoordinatorServiceImpl>(
      scheduler_api_.get(), authorizer_.get(), metrics_.get(), change_feed_.get(), secrets_.get(),
      watch_limits_.get());
  agent_service_ =
      std::make_unique<AgentServiceImpl>(agent_api_.get(), authorizer_.get(), metrics_.get());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config_.listen, *credentials, &port_);
  builder.SetMaxReceiveMessageSize(MaxReceiveMessageBytes(config_));
  // Without a cap gRPC starts a thread per concurrent synchronous call;
  // watch streams (callback API) hold none.
  if (config_.max_rpc_threads > 0) {
    grpc::ResourceQuota quota("reshard-coordinator");
    quota.SetMaxThreads(static_cast<int>(config_.max_rpc_threads));
    builder.SetResourceQuota(quota);
  }
  builder.RegisterService(coordinator_service_.get());
  builder.RegisterService(agent_service_.get());
  builder.RegisterService(auth_service_.get());
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr || port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen = \"", config_.listen, "\": cannot bind the gRPC server there"));
  }
  return absl::OkStatus();
}

absl::Status CoordinatorServer::ServeMetrics() {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(config_.metrics_listen);
    exposer_->RegisterCollectable(registry_);
    const std::vector<int> ports = exposer_->GetListeningPorts();
    metrics_port_ = ports.empty() ? 0 : ports.front();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("--metrics-listen = \"", config_.metrics_listen,
                                               "\": cannot serve /metrics there: ", e.what()));
  }
  return absl::OkStatus();
}

void CoordinatorServer::StartLeader(PgStore* health_of) {
  LeaderLoop::Options leader_options;
  leader_options.tick_ms = config_.tick_ms;
  leader_options.retry_ms = config_.leader_retry_ms;
  PgLeaderLockOptions lock_options;
  lock_options.statement_timeout_ms = static_cast<int>(config_.store_statement_timeout_ms);
  lock_options.connect_timeout_s = static_cast<int>(config_.store_connect_timeout_s);
  leader_ =
      std::make_unique<LeaderLoop>(MakePgLeaderLock(config_.dsn, kLeaderLockKey, lock_options),
                                   driver_.get(), metrics_.get(), leader_options);
  leader_->WatchStoreHealth([health_of] { return health_of->Health(); },
                            [health_of] { return health_of->Probe(); });
  LeaderLoop::Retention retention;
  retention.policy.keep_retired_generations = static_cast<int>(config_.retention_keep_retired);
  retention.policy.retired_min_age_ms = config_.retention_retired_age_ms;
  retention.policy.discarded_min_age_ms = config_.retention_discarded_age_ms;
  retention.policy.keep_operations = static_cast<int>(config_.retention_keep_operations);
  retention.policy.operation_min_age_ms = config_.retention_operation_age_ms;
  retention.policy.audit_min_age_ms = config_.retention_audit_age_ms;
  retention.policy.batch_rows = static_cast<int>(config_.retention_batch_rows);
  retention.batches_per_round = static_cast<int>(config_.retention_batches);
  retention.interval_ms = static_cast<int>(config_.retention_interval_ms);
  leader_->EnableRetention(store_, retention);
  policies_ = std::make_unique<PolicyEngine>(store_, scheduler_api_.get(), &clock_,
                                             PolicyEngine::Options{});
  leader_->EnablePolicies([engine = policies_.get()] { return engine->MaybePass(); });
  leader_->Start();
  kick_target_ = leader_.get();
}

bool CoordinatorServer::IsLeader() const { return leader_ != nullptr && leader_->IsLeader(); }

std::string CoordinatorServer::StartupLine() const {
  std::string listen_host, metrics_host;
  int unused = 0;
  (void)SplitHostPort(config_.listen, "--listen", &listen_host, &unused);
  (void)SplitHostPort(config_.metrics_listen, "--metrics-listen", &metrics_host, &unused);
  return absl::StrCat("reshard-coordinator listening on ", listen_host, ":", port_, " metrics on ",
                      metrics_host, ":", metrics_port_, " replica ", config_.replica_id);
}

void CoordinatorServer::Shutdown() {
  std::lock_guard<std::mutex> lock(shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  // Stop driving first, so that another replica can take over at once.
  kick_target_ = nullptr;
  if (leader_ != nullptr) leader_->Stop();
  // Watch streams end (UNAVAILABLE: clients resume on another replica) and
  // WaitForTasks long polls answer at once.
  if (listener_ != nullptr) listener_->Stop();
  if (change_feed_ != nullptr) change_feed_->Shutdown();
  if (task_notifier_ != nullptr) task_notifier_->Shutdown();
  if (grpc_server_ != nullptr) {
    grpc_server_->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
    grpc_server_->Wait();
  }
  exposer_.reset();  // civetweb takes up to ~2 s to stop its listener thread
  leader_.reset();
  driver_.reset();
  // The agent service's threads (its polls' workers and timer, the heartbeat
  // batcher) end with it, in the destructor; the store's connections close
  // once the last user lets go of it.
  store_.reset();
}

}  // namespace reshard::coordinator
