// Memory a buffer lives in and a transfer backend reads from and writes to:
// host memory, or a GPU's (through the device API, device_api.h). Shared by
// the shard store (its buffers' kinds) and the transfer backends (what each
// moves, agent/transfer/backend.h).
#pragma once

namespace reshard::agent {

/// Memory a backend reads from and writes to.
enum class MemoryKind { kHost, kCuda };

}  // namespace reshard::agent
