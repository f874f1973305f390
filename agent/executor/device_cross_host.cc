#include "agent/executor/device_cross_host.h"

#include <algorithm>

#include "agent/executor/device_comm_steps.h"
#include "agent/executor/transfer_tags.h"

namespace reshard::agent {
namespace {

std::map<std::string, int> HostIndex(const std::string& host_id, const v1::HostTask& task) {
  std::vector<std::string> hosts{host_id};
  for (const v1::PeerHost& p : task.peers()) {
    if (p.host_id() != host_id) hosts.push_back(p.host_id());
  }
  std::sort(hosts.begin(), hosts.end());
  std::map<std::string, int> index;
  for (size_t i = 0; i < hosts.size(); ++i) index[hosts[i]] = static_cast<int>(i);
  return index;
}

}  // namespace

DeviceCrossHostSteps::DeviceCrossHostSteps(
    DeviceBufferStore& devices, Transport* transport, const TaskExecutor::Options& options,
    const std::string& host_id, const v1::HostTask& task, const std::function<bool()>& cancelled,
    const std::function<void(const std::string& what)>& waiting)
    : devices_(devices),
      api_(devices.api()),
      transport_(transport),
      options_(options),
      host_id_(host_id),
      task_(task),
      cancelled_(cancelled),
      waiting_(waiting),
      tag_key_(TaskTagKey(task)),
      host_index_(HostIndex(host_id, task)) {}

absl::StatusOr<std::vector<v1::ShardChecksum>> DeviceCrossHostSteps::RunWithDevices(
    ShardStore& store, const DeviceRoute& route,
    const std::function<void(int64_t done, int64_t total)>& progress) {
  return RunOnDevices(
      store, devices_, options_, host_id_, task_, route, progress, cancelled_,
      [this](const HostSteps& hs, const std::vector<DeviceRankBufferPtr>& made,
             const std::function<void(int64_t bytes)>& moved) { return Run(hs, made, moved); });
}

absl::Status DeviceCrossHostSteps::ConnectAndProve(const HostSteps& hs) {
  return ConnectAndProveDevicePeers(transport_, options_, host_id_, task_, hs, cancelled_,
                                    waiting_);
}

}  // namespace reshard::agent
