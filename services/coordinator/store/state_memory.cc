#include "services/coordinator/store/state_memory.h"

#include "absl/strings/str_cat.h"

namespace reshard::coordinator {

absl::Status CheckStateMemory(int state_memory) {
  if (v1::StateMemory_IsValid(state_memory)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("spec.state_memory ", state_memory,
                   " is not a known StateMemory (0 UNSPECIFIED, 1 HOST, 2 DEVICE)"));
}

v1::StateMemory StoredStateMemory(v1::StateMemory state_memory) {
  return state_memory == v1::STATE_MEMORY_DEVICE ? v1::STATE_MEMORY_DEVICE : v1::STATE_MEMORY_HOST;
}

}  // namespace reshard::coordinator
