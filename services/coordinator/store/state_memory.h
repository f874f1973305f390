// JobSpec.state_memory as the coordinator keeps it (docs/coordinator.md,
// "Where a job's state lives"): checked by RegisterJob and by both stores'
// CreateJob, stored HOST or DEVICE (migrations/0019). Pure.
#pragma once

#include "absl/status/status.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::coordinator {

/// JobSpec.state_memory: InvalidArgument naming `spec.state_memory` and the
/// value unless it is a StateMemory (UNSPECIFIED included).
[[nodiscard]] absl::Status CheckStateMemory(int state_memory);

/// What a job stores and shows as Job.state_memory: HOST or DEVICE,
/// UNSPECIFIED read as HOST.
v1::StateMemory StoredStateMemory(v1::StateMemory state_memory);

}  // namespace reshard::coordinator
