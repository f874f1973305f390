#include "tests/support/wait.h"

#include "absl/time/clock.h"

namespace reshard::test_support {

bool Eventually(const std::function<bool()>& done, absl::Duration timeout, absl::Duration period) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (done()) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(period);
  }
}

}  // namespace reshard::test_support
