// One grouped ring step over a device communicator (device_comm.h), shared
// by the fake communicator's and the bootstrap's tests.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "agent/transfer/device_comm.h"

namespace reshard::agent {

/// In one group: for each k, sends `src[k]` (`sizes[k]` bytes) to rank + 1
/// and receives `dst[k]` from rank - 1 (mod nranks); then synchronizes
/// `stream`, where the transfers complete.
inline absl::Status RingStep(DeviceComm& comm, DeviceApi& device, DeviceStream stream,
                             const std::vector<void*>& src, const std::vector<void*>& dst,
                             const std::vector<size_t>& sizes) {
  const int n = comm.nranks();
  const int to = (comm.rank() + 1) % n;
  const int from = (comm.rank() + n - 1) % n;
  absl::Status s = comm.GroupStart();
  for (size_t k = 0; k < sizes.size() && s.ok(); ++k) {
    s = comm.Send(src[k], sizes[k], to, stream);
    if (s.ok()) s = comm.Recv(dst[k], sizes[k], from, stream);
  }
  if (s.ok()) s = comm.GroupEnd();
  return s.ok() ? device.StreamSynchronize(stream) : s;
}

}  // namespace reshard::agent
