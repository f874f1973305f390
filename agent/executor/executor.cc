#include "agent/executor/executor.h"

#include "agent/executor/device_comm_steps.h"
#include "agent/executor/device_ipc_steps.h"
#include "agent/executor/device_route.h"
#include "agent/executor/precopy_check.h"
#include "agent/executor/task_run.h"
#include "agent/transfer/local_copy.h"
#include "common/log.h"

namespace reshard::agent {

TaskExecutor::TaskExecutor(ShardStore* store, Transport* transport, Options options,
                           DeviceBufferStore* devices, DeviceCommFactory* comm)
    : store_(store),
      transport_(transport),
      devices_(devices),
      comm_(comm),
      options_(options),
      copier_(std::make_unique<LocalCopier>(options.copy_threads)),
      precopies_(std::make_unique<PrecopyRecords>()) {
  RESHARD_CHECK(options_.chunk_bytes > 0) << "chunk_bytes " << options_.chunk_bytes;
  RESHARD_CHECK(options_.local_chunk_bytes > 0)
      << "local_chunk_bytes " << options_.local_chunk_bytes;
  RESHARD_CHECK(options_.peer_window_bytes > 0)
      << "peer_window_bytes " << options_.peer_window_bytes;
  RESHARD_CHECK(options_.max_inflight_bytes > 0)
      << "max_inflight_bytes " << options_.max_inflight_bytes;
}

TaskExecutor::~TaskExecutor() = default;

absl::StatusOr<std::vector<v1::ShardChecksum>> TaskExecutor::Execute(
    const std::string& host_id, const v1::HostTask& task,
    const std::function<void(int64_t done, int64_t total)>& progress,
    const std::function<bool()>& cancelled,
    const std::function<void(const std::string& what)>& waiting,
    const std::function<void(const ExecuteInfo& info)>& routed, v1::TaskTimings* timings) {
  // Every route runs through TaskRun; a device route lends it the device
  // store, the route and the route's mover.
  TaskRun::Executor host{store_, transport_, &options_, copier_.get(), precopies_.get()};
  host.timings = timings;
  auto run = [&](const DeviceRoute* route, Mover* mover) {
    TaskRun::Executor ex = host;
    if (route != nullptr) {
      ex.devices = devices_;
      ex.route = route;
      if (mover != nullptr) ex.movers.push_back(mover);
    }
    return TaskRun(std::move(ex), host_id, task, progress, cancelled, waiting).Run();
  };
  if (devices_ == nullptr) {
    if (routed) routed(ExecuteInfo{RouteName(DeviceRoute::Kind::kHost), ""});
    return run(nullptr, nullptr);
  }
  DeviceRoute route = RouteTask(*store_, *devices_, host_id, task);
  RouteOverDeviceComm(*devices_, comm_, options_.device_comm_why_not, host_id, task, &route,
                      options_.device_ipc);
  if (routed) {
    routed(ExecuteInfo{RouteName(route.kind, comm_ != nullptr ? AdvertisedCommName(*comm_) : ""),
                       route.kind == DeviceRoute::Kind::kHostStaged ? route.why : ""});
  }
  switch (route.kind) {
    case DeviceRoute::Kind::kHost:
      return run(nullptr, nullptr);
    case DeviceRoute::Kind::kDevice:
      return run(&route, nullptr);
    case DeviceRoute::Kind::kDeviceComm: {
      DeviceCommMover mover(*devices_, *comm_, transport_, options_, host_id, task, cancelled,
                            waiting);
      return run(&route, &mover);
    }
    case DeviceRoute::Kind::kDeviceIpc: {
      DeviceIpcMover mover(*store_, *devices_, transport_, options_, host_id, task, cancelled,
                           waiting);
      return run(&route, &mover);
    }
    case DeviceRoute::Kind::kHostStaged:
      return RunHostStaged(*store_, *devices_, host_id, task, route, waiting,
                           [&] { return run(nullptr, nullptr); });
  }
  return run(nullptr, nullptr);
}

}  // namespace reshard::agent
