// reshard-agent: one per host. Holds the host's shards, executes its slice
// of every plan and serves the host's training workers. See docs/agent.md.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/device/device_api.h"
#include "agent/executor/executor.h"
#include "agent/executor/peer_wait.h"
#include "agent/process/config.h"
#include "agent/process/coordinator_session.h"
#include "agent/process/host_probe.h"
#include "agent/process/metrics.h"
#include "agent/process/worker_fd_socket.h"
#include "agent/process/worker_service.h"
#include "agent/process/worker_socket.h"
#include "agent/shard_store/device_buffer.h"
#include "agent/shard_store/shard_store.h"
#include "agent/transfer/backend.h"
#include "agent/transfer/device_comm.h"
#include "agent/transfer/transport.h"
#include "common/log.h"
#include "common/runtime.h"
#include "common/signals.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

using namespace reshard::agent;  // NOLINT: the binary's own namespace

namespace {

int Fail(const std::string& what) {
  std::cerr << "reshard-agent: " << what << std::endl;
  return 1;
}

// The host's devices, when --device names a device API: the API, the
// device rank-buffer store, the device communicator (or why there is none),
// and how many devices the API reported when it was opened.
struct Devices {
  std::unique_ptr<DeviceApi> api;
  std::unique_ptr<DeviceBufferStore> store;
  std::unique_ptr<DeviceCommFactory> comm;
  std::string comm_why_not = "--device-comm none";
  int count = 0;
};

absl::StatusOr<Devices> OpenDevices(const AgentConfig& config) {
  Devices dev;
  // Device-resident state and CUDA IPC (docs/agent.md, "GPU / memory
  // kinds"): only with a device API, which --device (RESHARD_DEVICE) names.
  absl::StatusOr<std::unique_ptr<DeviceApi>> device_api = MakeDeviceApi(config.device);
  if (!device_api.ok()) {
    return absl::FailedPreconditionError("--device \"" + config.device +
                                         "\": " + device_api.status().ToString());
  }
  dev.api = *std::move(device_api);
  if (dev.api == nullptr) {
    dev.comm_why_not = "no device API";
    RESHARD_LOG(INFO) << "host " << config.host_id
                      << ": no device API (--device / RESHARD_DEVICE): state stays in host memory";
    return dev;
  }
  DeviceBufferStore::Options device_options;
  device_options.memory_limit_bytes_per_device = config.device_memory_limit_bytes;
  absl::StatusOr<std::unique_ptr<DeviceBufferStore>> opened =
      DeviceBufferStore::Open(dev.api.get(), device_options);
  if (!opened.ok()) {
    return absl::FailedPreconditionError("opening the device store: " +
                                         opened.status().ToString());
  }
  dev.store = *std::move(opened);
  const DeviceApiCapabilities caps = dev.api->capabilities();
  dev.count = caps.device_count;
  RESHARD_LOG(INFO) << "host " << config.host_id << ": device API " << caps.name << ", "
                    << caps.device_count << " devices, " << dev.store->limit_bytes(0)
                    << " bytes of rank buffers allowed per device";
  // Cross-host device steps (docs/agent.md, "GPU / memory kinds"): over a
  // device communicator when every host of an operation advertises the same
  // one; otherwise staged through host memory, saying why.
  if (config.device_comm) dev.comm = MakeDeviceCommFactory(dev.api.get(), &dev.comm_why_not);
  RESHARD_LOG(INFO) << "host " << config.host_id << ": device communicator "
                    << (dev.comm != nullptr ? DeviceCommBackendCapabilities(*dev.comm).name
                                            : "none (" + dev.comm_why_not + ")");
  const std::string ipc = DeviceIpcEntry(*dev.api);
  RESHARD_LOG(INFO) << "host " << config.host_id << ": device IPC "
                    << (!config.device_ipc ? "none (--device-ipc none)"
                        : ipc.empty()      ? "none (the device API has no IPC)"
                                           : ipc);
  return dev;
}

// The stores' gauges, read at each scrape.
void WatchStores(AgentMetrics* metrics, ShardStore* shard_store, const Devices& dev) {
  DeviceBufferStore* device_store = dev.store.get();
  const int device_count = device_store != nullptr ? dev.count : 0;
  metrics->SetRefresh([metrics, shard_store, device_store, device_count] {
    for (int d = 0; d < device_count; ++d) {
      metrics->SetDeviceStore(d, device_store->used_bytes(d), device_store->limit_bytes(d));
    }
    if (device_store != nullptr) {
      metrics->SetPinnedHost(device_store->pinned().registered_bytes(),
                             device_store->pinned().registrations());
    }
    std::set<std::pair<std::string, int64_t>> generations;
    const std::vector<RankBufferKey> keys = shard_store->List();
    for (const RankBufferKey& k : keys) generations.insert({k.job_id, k.generation});
    metrics->SetShardStore(shard_store->used_bytes(), shard_store->limit_bytes(),
                           static_cast<int64_t>(generations.size()),
                           static_cast<int64_t>(keys.size()));
  });
}

// /metrics on --metrics-listen; null when it is empty.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(const AgentConfig& config,
                                                                  AgentMetrics* metrics) {
  if (config.metrics_listen.empty()) return nullptr;
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(config.metrics_listen);
    exposer->RegisterCollectable(metrics->collectable());
  } catch (const std::exception& e) {
    return absl::UnavailableError("--metrics-listen \"" + config.metrics_listen +
                                  "\": cannot serve /metrics there: " + e.what());
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  RESHARD_LOG(INFO) << "host " << config.host_id << ": /metrics on port "
                    << (ports.empty() ? 0 : ports.front());
  return exposer;
}

ShardStore::Options StoreOptions(const AgentConfig& config) {
  ShardStore::Options o;
  o.shm_dir = config.shm_dir;
  o.host_id = config.host_id;
  o.memory_limit_bytes = config.memory_limit_bytes;
  o.spare_bytes = config.spare_bytes;
  o.keep_dropped_s = static_cast<double>(config.keep_dropped_ms) / 1000.0;
  return o;
}

TaskExecutor::Options ExecutorOptions(const AgentConfig& config, const std::string& comm_why_not,
                                      CoordinatorReach* reach) {
  TaskExecutor::Options o;
  o.copy_threads = config.copy_threads;
  o.device_comm_why_not = comm_why_not;
  o.device_ipc = config.device_ipc;  // advertised by the session: the IPC route needs both
  o.proof_timeout_ms = config.peer_wait_ms;
  o.seal_timeout_ms = config.peer_wait_ms;
  o.coordinator_reach = reach;
  return o;
}

CoordinatorSession::Options SessionOptions(const AgentConfig& config, AgentMetrics* metrics,
                                           const Devices& dev, CoordinatorReach* reach) {
  CoordinatorSession::Options o;
  o.host_id = config.host_id;
  o.address = config.address;
  o.memory_limit_bytes = config.memory_limit_bytes;
  o.heartbeat_ms = config.heartbeat_ms;
  o.metrics = metrics;
  o.device_api = dev.api.get();
  o.devices = dev.store.get();
  o.device_comm = dev.comm.get();
  o.device_ipc = config.device_ipc;
  o.coordinator_reach = reach;
  o.probe = MeasureHostProbe(config.probe_bytes);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  reshard::UseReleaseRuntime();
  // gRPC advances a reconnect (TCP connect, TLS handshake) of a channel with
  // no call in flight only from its backup poller, every 5 s by default; a
  // TLS reconnect to a restarted coordinator then takes several polls.
  setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "100", /*overwrite=*/0);
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::cout << AgentUsage();
      return 0;
    }
  }
  absl::StatusOr<AgentConfig> config =
      ParseAgentConfig(args, [](const char* name) { return std::getenv(name); });
  if (!config.ok()) {
    std::cerr << "reshard-agent: " << config.status().message() << "\n" << AgentUsage();
    return 2;
  }
  reshard::LogSeverity severity;
  reshard::ParseLogSeverity(config->log_level, &severity);
  reshard::SetMinLogSeverity(severity);

  reshard::BlockTerminationSignals();

  absl::StatusOr<std::unique_ptr<ShardStore>> store = ShardStore::Open(StoreOptions(*config));
  if (!store.ok()) return Fail("opening the shard store: " + store.status().ToString());

  UcxOptions ucx;
  ucx.net_devices = config->ucx_net_devices;
  ucx.transports = config->ucx_tls;
  absl::StatusOr<std::unique_ptr<Transport>> transport = MakeUcxTransport(ucx);
  if (!transport.ok()) return Fail("starting UCX: " + transport.status().ToString());

  absl::StatusOr<Devices> opened_devices = OpenDevices(*config);
  if (!opened_devices.ok()) return Fail(std::string(opened_devices.status().message()));
  Devices& dev = *opened_devices;

  CoordinatorReach coordinator_reach;  // the session tells it, the executor's timers read it
  const TaskExecutor::Options exec_options =
      ExecutorOptions(*config, dev.comm_why_not, &coordinator_reach);
  TaskExecutor executor(store->get(), transport->get(), exec_options, dev.store.get(),
                        dev.comm.get());

  AgentMetrics metrics(std::make_shared<prometheus::Registry>());
  WatchStores(&metrics, store->get(), dev);
  absl::StatusOr<std::unique_ptr<prometheus::Exposer>> exposer = ServeMetrics(*config, &metrics);
  if (!exposer.ok()) return Fail(std::string(exposer.status().message()));

  absl::StatusOr<std::shared_ptr<grpc::Channel>> coordinator_channel =
      CoordinatorChannel(config->coordinator, config->tls);
  if (!coordinator_channel.ok()) return Fail(std::string(coordinator_channel.status().message()));
  std::shared_ptr<grpc::Channel> channel = *coordinator_channel;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> heartbeat_channel =
      CoordinatorChannel(config->coordinator, config->tls, /*own_connection=*/true);
  if (!heartbeat_channel.ok()) return Fail(std::string(heartbeat_channel.status().message()));

  const CoordinatorSession::Options session_options =
      SessionOptions(*config, &metrics, dev, &coordinator_reach);
  CoordinatorSession session(session_options, channel, store->get(), &executor, transport->get(),
                             *heartbeat_channel);
  // Connecting to a unix socket needs write permission on it: the group and
  // mode say which training processes may (docs/security.md, "Workers").
  // The agent accepts the connections itself to learn each caller's
  // SO_PEERCRED (worker_socket.h).
  absl::StatusOr<std::unique_ptr<WorkerSocket>> worker_socket =
      WorkerSocket::Listen(config->worker_socket, config->worker_gid, config->worker_socket_mode);
  if (!worker_socket.ok()) {
    return Fail(absl::StrCat(worker_socket.status().message(),
                             config->worker_gid >= 0
                                 ? absl::StrCat(" (--worker-group \"", config->worker_group, "\")")
                                 : ""));
  }
  WorkerServiceImpl worker_service(store->get(), channel, &metrics, config->worker_cache_bytes);
  worker_service.SetSocket(worker_socket->get());
  worker_service.SetDevices(dev.api.get(), dev.store.get());
  worker_service.SetPublishGate([&session](const std::string& job, int64_t generation, int rank) {
    return session.AcceptsPublish(job, generation, rank);
  });
  worker_service.SetPublishWait(
      [&session](const std::string& job, int64_t generation, int rank, int timeout_ms) {
        return session.AwaitPublishAccepted(job, generation, rank, timeout_ms);
      });
  // Shard files are the agent's alone: workers map descriptors the agent
  // hands them over `<worker socket>.fds`, admitted like the gRPC calls
  // (docs/security.md, "Workers").
  const std::string fd_socket_path = WorkerFdSocket::PathFor(config->worker_socket);
  absl::StatusOr<std::unique_ptr<WorkerFdSocket>> fd_socket =
      WorkerFdSocket::Listen(fd_socket_path, config->worker_gid, config->worker_socket_mode);
  if (!fd_socket.ok()) return Fail(std::string(fd_socket.status().message()));
  (*fd_socket)->Serve([&worker_service](const reshard::v1::WorkerFdRequest& request,
                                        const std::string& caller) {
    return worker_service.OpenForWorker(request, caller);
  });
  grpc::ServerBuilder builder;
  builder.RegisterService(&worker_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return Fail("cannot start the worker service on " + config->worker_socket);
  (*worker_socket)->Serve(server.get());

  session.Start();

  std::cout << "reshard-agent " << config->host_id << " ready worker-socket "
            << config->worker_socket << std::endl;

  const int sig = reshard::WaitForTerminationSignal();
  RESHARD_LOG(INFO) << "signal " << sig << ": shutting down";
  session.Stop();
  (*worker_socket)->Stop();
  (*fd_socket)->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  (*transport)->Shutdown();
  exposer->reset();
  unlink(config->worker_socket.c_str());
  return 0;
}
