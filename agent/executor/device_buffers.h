// What TaskRun (task_run.h) does with device memory on the device routes
// (device_route.h): finds sources in host or device memory, makes the new
// device buffers all or none, copies the local steps through the device API
// and stages sealed new buffers to host memory where the placement keeps
// them. Device buffers are never read or written on the host here: every
// byte moves through the device API.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/executor/host_steps.h"
#include "agent/shard_store/device_buffer.h"
#include "agent/shard_store/shard_store.h"
#include "reshard/v1/agent.pb.h"

namespace reshard::agent {

/// The host store `host` with the device buffers of `devices` behind it, for
/// PrepareHostSteps: Get finds a key in host memory first, then in device
/// memory (a sealed device buffer seen as a source rank buffer, which
/// PrepareHostSteps checks regions against by its items only: its data() is
/// a device pointer, never dereferenced). Every other call goes to the host
/// store. Both outlive it.
std::unique_ptr<ShardStore> SourcesOfBothKindsIn(ShardStore& host, DeviceBufferStore& devices);

/// The device buffer behind a source rank buffer of a HostSteps prepared
/// over SourcesOfBothKindsIn (a device source); nullptr for a host buffer.
const DeviceRankBuffer* DeviceSourceOf(const RankBuffer& source);

/// The new buffers of this host's new ranks (hs.new_ranks) on their devices
/// (`device_of`: new rank -> device), zeroed, all or none, their keys in
/// `keys` (hs.new_ranks order); those of an earlier attempt, in either
/// memory, go first. ResourceExhausted (the device store's message) when
/// they do not fit.
[[nodiscard]] absl::StatusOr<std::vector<DeviceRankBufferPtr>> MakeNewDeviceBuffers(
    ShardStore& store, DeviceBufferStore& devices, const v1::HostTask& task, const HostSteps& hs,
    const std::map<int, int>& device_of, std::vector<RankBufferKey>* keys);

/// Copies the local steps `hs.locals` into `made` (hs.new_ranks order)
/// through the device API, run by run (ForEachRun) in pieces of
/// `piece_bytes`, on one stream per destination device: host to device from
/// host sources, device to device on one device, peer copies across devices.
/// Every `piece_bytes` queued it waits for the streams, tells `landed` the
/// bytes and polls `cancelled` (Cancelled).
[[nodiscard]] absl::Status CopyLocalsOnDevices(DeviceApi* api, const v1::HostTask& task,
                                               const HostSteps& hs,
                                               const std::vector<DeviceRankBufferPtr>& made,
                                               int64_t piece_bytes,
                                               const std::function<bool()>& cancelled,
                                               const std::function<void(int64_t bytes)>& landed);

/// Stages the sealed new buffers `keys` to host memory, where the placement
/// keeps them, and drops their device copies; on failure none is left in
/// host memory (the caller drops the device copies).
[[nodiscard]] absl::Status StageNewBuffersToHost(ShardStore& store, DeviceBufferStore& devices,
                                                 const std::vector<RankBufferKey>& keys);

/// Calls fn(src, dst, elements) for the contiguous runs, in row-major order
/// and coalesced, that copy a region of `shape` at `src_offset` with
/// `src_strides` to one at `dst_offset` with `dst_strides` (element units).
void ForEachRun(const std::vector<int64_t>& shape, int64_t src_offset,
                const std::vector<int64_t>& src_strides, int64_t dst_offset,
                const std::vector<int64_t>& dst_strides,
                const std::function<void(int64_t src, int64_t dst, int64_t elements)>& fn);

}  // namespace reshard::agent
