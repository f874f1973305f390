#include "agent/executor/device_route.h"

#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/executor/task_phase.h"
#include "agent/shard_store/device_staging.h"
#include "common/log.h"
#include "planner/layout.h"

namespace reshard::agent {

std::string RouteName(DeviceRoute::Kind kind, const std::string& comm) {
  switch (kind) {
    case DeviceRoute::Kind::kHost:
      return "host";
    case DeviceRoute::Kind::kDevice:
      return "device-direct";
    case DeviceRoute::Kind::kDeviceComm:
      return comm.empty() ? "device-comm" : absl::StrCat("device-comm ", comm);
    case DeviceRoute::Kind::kDeviceIpc:
      return "device-ipc";
    case DeviceRoute::Kind::kHostStaged:
      return "host-staged";
  }
  return "host";
}

DeviceRoute RouteTask(ShardStore& store, const DeviceBufferStore& devices,
                      const std::string& host_id, const v1::HostTask& task) {
  DeviceRoute route;
  const v1::TransferPlan& plan = task.plan();
  const std::vector<v1::DeviceSlot> old_slots =
      planner::ExpandPlacement(plan.source_layout().placement());
  const std::vector<v1::DeviceSlot> new_slots =
      planner::ExpandPlacement(plan.target_layout().placement());
  // This host's sources: which are held here, in which memory.
  std::map<int, int> source_device;  // old rank here -> its device (device buffers)
  bool holds_source = false;
  for (int r = 0; r < static_cast<int>(old_slots.size()); ++r) {
    if (old_slots[r].host() != host_id) continue;
    const RankBufferKey key{task.job_id(), task.from_generation(), r};
    if (store.Get(key).ok()) {
      holds_source = true;
    } else if (absl::StatusOr<DeviceRankBufferPtr> d = devices.Get(key); d.ok()) {
      holds_source = true;
      source_device[r] = (*d)->device();
    }
  }
  route.on_device = devices.device_count() > 0 && (!source_device.empty() || !holds_source);
  if (!route.on_device) return route;  // kHost
  int index = 0;
  for (int r = 0; r < static_cast<int>(new_slots.size()); ++r) {
    if (new_slots[r].host() != host_id) continue;
    auto it = source_device.find(r);
    route.device_of[r] = it != source_device.end() ? it->second : index % devices.device_count();
    ++index;
  }
  // What this host's part needs.
  bool cross_host = false;
  std::set<int> read;
  for (const v1::CopyStep& s : plan.steps()) {
    if (s.src_rank() < 0 || s.src_rank() >= static_cast<int>(old_slots.size()) ||
        s.dsts_size() == 0 || s.dsts(0).rank() < 0 ||
        s.dsts(0).rank() >= static_cast<int>(new_slots.size())) {
      return DeviceRoute();  // TaskRun's checks say what is wrong
    }
    const bool src_here = old_slots[s.src_rank()].host() == host_id;
    const bool dst_here = new_slots[s.dsts(0).rank()].host() == host_id;
    if (src_here != dst_here) cross_host = true;
    if (src_here && source_device.count(s.src_rank())) read.insert(s.src_rank());
  }
  route.device_sources.assign(read.begin(), read.end());
  absl::StatusOr<TaskPhase> phase = PhaseOf(task);
  if (!phase.ok()) return DeviceRoute();
  bool regenerated = false;
  for (const v1::Regenerate& g : plan.regenerate()) {
    regenerated |= route.device_of.count(g.rank()) > 0;
  }
  route.kind = DeviceRoute::Kind::kHostStaged;
  if (*phase != TaskPhase::kTransfer) {
    route.why = "a two-phase (prepare / prepared) task runs in host memory";
    route.on_device = false;
  } else if (regenerated) {
    route.why = "regenerated items are recorded by the host store only";
    route.on_device = false;
  } else if (cross_host) {
    route.why = "cross-host steps move host memory (no device transport loaded)";
  } else {
    route.kind = DeviceRoute::Kind::kDevice;
  }
  if (!route.on_device) route.device_of.clear();
  return route;
}

absl::StatusOr<std::vector<v1::ShardChecksum>> RunHostStaged(
    ShardStore& store, DeviceBufferStore& devices, const std::string& host_id,
    const v1::HostTask& task, const DeviceRoute& route,
    const std::function<void(const std::string& what)>& waiting,
    const std::function<absl::StatusOr<std::vector<v1::ShardChecksum>>()>& run_on_host) {
  const std::string& job = task.job_id();
  RESHARD_LOG(INFO) << "operation " << task.operation_id() << " job " << job << " host " << host_id
                    << ": host-staged: " << route.why;
  if (waiting) waiting(absl::StrCat("host-staged: ", route.why));
  // Device copies of the new generation left by an earlier attempt.
  for (const auto& [rank, device] : route.device_of) {
    devices.Drop(RankBufferKey{job, task.to_generation(), rank});
  }
  // Host copies of the device sources the task reads, for this task only.
  std::vector<RankBufferKey> staged;
  auto drop_staged = [&] {
    for (const RankBufferKey& k : staged) store.Drop(k);
  };
  for (int r : route.device_sources) {
    const RankBufferKey key{job, task.from_generation(), r};
    if (store.Get(key).ok()) continue;  // held in host memory too (not ours to drop)
    absl::StatusOr<RankBufferPtr> h = StageToHost(devices, store, key);
    if (!h.ok()) {
      drop_staged();
      return absl::Status(h.status().code(),
                          absl::StrCat("staging the old shard of rank ", r,
                                       " to host memory: ", h.status().message()));
    }
    staged.push_back(key);
  }
  absl::StatusOr<std::vector<v1::ShardChecksum>> result = run_on_host();
  drop_staged();
  if (!result.ok() || !route.on_device) return result;
  // The new buffers to their devices; their host copies go.
  std::vector<RankBufferKey> keys;
  for (const auto& [rank, device] : route.device_of) {
    keys.push_back(RankBufferKey{job, task.to_generation(), rank});
    absl::StatusOr<DeviceRankBufferPtr> d = StageToDevice(store, devices, keys.back(), device);
    if (!d.ok()) {
      for (const RankBufferKey& k : keys) devices.Drop(k);
      for (const auto& [r, dev] : route.device_of) {
        store.Drop(RankBufferKey{job, task.to_generation(), r});
      }
      RESHARD_LOG(WARNING) << "operation " << task.operation_id() << " job " << job << " host "
                           << host_id << " failed staging rank " << rank << " to device " << device
                           << ": " << d.status();
      return absl::Status(d.status().code(),
                          absl::StrCat("staging the new shard of rank ", rank, " to device ",
                                       device, ": ", d.status().message()));
    }
  }
  for (const RankBufferKey& k : keys) store.Drop(k);
  return result;
}

}  // namespace reshard::agent
