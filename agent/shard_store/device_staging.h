// Moving a whole rank buffer between the two memory kinds of the shard store
// (docs/agent.md, "GPU / memory kinds"): a sealed device buffer
// (DeviceBufferStore) staged into a host buffer (ShardStore) of the same key,
// and back. The copy is sealed with the checksums of the original as its
// expected checksums, so a staged buffer is byte for byte the one it copies
// (DataLoss naming the item otherwise, and the copy is dropped). Used by the
// executor's host-staged fallback (a task whose cross-host steps cannot move
// device memory) and by OpenGeneration when a worker loads a device-resident
// generation into host memory. Thread-safe (the stores are).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "agent/shard_store/device_buffer.h"
#include "agent/shard_store/shard_store.h"

namespace reshard::agent {

/// A host copy of the sealed device buffer `key`: made, filled (device to
/// host through the device API, in chunks) and sealed with the device
/// buffer's checksums. Returns the existing host buffer when `key` is
/// already in `host` and sealed with the same checksums, or when `key` is
/// only in `host`, sealed (nothing to stage). NotFound when `key` is in
/// neither store; FailedPrecondition when the device buffer is not
/// sealed, or `key` is in `host` unsealed or with other checksums;
/// ResourceExhausted when the copy does not fit the host store's limit.
[[nodiscard]] absl::StatusOr<RankBufferPtr> StageToHost(DeviceBufferStore& devices,
                                                        ShardStore& host,
                                                        const RankBufferKey& key);

/// A device copy, on `device`, of the sealed host buffer `key`, sealed with
/// its checksums; the existing device buffer when `key` is already there and
/// sealed with the same checksums. Errors as StageToHost, mirrored.
[[nodiscard]] absl::StatusOr<DeviceRankBufferPtr> StageToDevice(ShardStore& host,
                                                                DeviceBufferStore& devices,
                                                                const RankBufferKey& key,
                                                                int device);

}  // namespace reshard::agent
