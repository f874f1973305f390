// A checkpoint's host task (HostTask.publish_by_workers): the job's workers,
// not the agent, write this host's new ranks (WorkerService PublishShard and
// SealShard into the task's to_generation). The agent waits until every one
// is sealed, with the item sizes the task's layout gives, and returns their
// checksums for the DONE report, as a transfer's task would. A rank the
// workers published into device memory (PublishDeviceShard, sealed in the
// device store) counts as published.
// Thread-compatible; one call per task.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/executor/host_steps.h"
#include "agent/shard_store/device_buffer.h"
#include "agent/shard_store/shard_store.h"
#include "reshard/v1/agent.pb.h"

namespace reshard::agent {

/// Waits until the workers sealed every new rank of `task` on this host
/// (`hs`, PrepareHostSteps of the task for this host: its new ranks and their
/// item sizes):
/// progress(sealed bytes, total bytes) as ranks are sealed, waiting("...")
/// naming the first rank still open, polls `cancelled` (Cancelled when it
/// says so). FailedPrecondition when a sealed buffer's item sizes differ from
/// the layout's. On any failure the new buffers of this host are dropped
/// (from `devices` too, when given: the agent's device store, whose sealed
/// buffers count as published ranks).
[[nodiscard]] absl::StatusOr<std::vector<v1::ShardChecksum>> AwaitPublished(
    ShardStore* store, const v1::HostTask& task, const HostSteps& hs,
    const std::function<void(int64_t done, int64_t total)>& progress,
    const std::function<bool()>& cancelled,
    const std::function<void(const std::string& what)>& waiting,
    DeviceBufferStore* devices = nullptr);

}  // namespace reshard::agent
