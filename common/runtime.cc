#include "common/runtime.h"

#include "absl/synchronization/mutex.h"

namespace reshard {

void UseReleaseRuntime() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace reshard
